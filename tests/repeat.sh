#!/usr/bin/env bash
# Runs a set of ctest tests again and again, one whole pass after another, to find a test that
# fails by chance. Unlike `ctest --repeat until-fail:N` (which repeats each test N times before
# the next one starts), every pass runs the whole set once, so a run cut short still says how
# many whole passes every test made. One line per pass; a failed pass keeps its ctest output in
# OUT/pass-N.log and the loop goes on (a chance failure is to be counted, not to end the count).
#
#   tests/repeat.sh PASSES REGEX [OUT]     e.g. tests/repeat.sh 20 'e2e\.(slurm|multinode)\.'
#   tests/repeat.sh PASSES processes [OUT] the set counted for issue 29: every test that starts a
#                                          Slurm or multi-node cluster, stops or kills processes,
#                                          or waits on the watchdog (36 tests, ~12 min a pass)
#
# Run it in the build folder's parent (the checkout), after a build. Tests run one at a time:
# the cluster tests share fixed namespaces and ports and must never overlap (not with CI either).
set -uo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 2 ]] || {
  echo "usage: tests/repeat.sh PASSES REGEX [OUT]" >&2
  exit 2
}
passes=$1 regex=$2 out=${3:-build/repeat}
if [[ $regex == processes ]]; then
  regex='e2e\.(slurm|multinode|watchdog|faults)\.|RunLogEndToEnd\.test_(kill_9|a_reader|sigusr1|a_signal)'
  regex+='|RankDies|RunLogIntegrity\.test_(kill_9|a_run_that_dies)|LocalScript\.test_sigterm'
  regex+='|WatchdogDeathTest|e2e\.overlap\.Overlap\.test_a_st|MixedRanks\.test_a_run_resumed_where'
fi
mkdir -p "$out"
count=$(ctest --test-dir build -N -R "$regex" | sed -n 's/^Total Tests: //p')
[[ ${count:-0} -gt 0 ]] || {
  echo "repeat: no test matches '$regex'" >&2
  exit 2
}
echo "repeat: $count tests matching '$regex', $passes passes, logs in $out"
failed_passes=0
declare -A failures=()
for ((pass = 1; pass <= passes; pass++)); do
  start=$SECONDS
  log="$out/pass-$pass.log"
  if ctest --test-dir build -R "$regex" --timeout 600 --output-on-failure >"$log" 2>&1; then
    echo "pass $pass/$passes: all $count passed in $((SECONDS - start)) s"
    rm -f "$log"
  else
    failed_passes=$((failed_passes + 1))
    names=$(sed -n 's/^\s*[0-9]* - \(\S*\) (.*/\1/p' "$log" | tr '\n' ' ')
    for name in $names; do failures[$name]=$((${failures[$name]:-0} + 1)); done
    echo "pass $pass/$passes: FAILED in $((SECONDS - start)) s: $names(see $log)"
  fi
done
echo "repeat: $((passes - failed_passes)) of $passes passes had no failure"
for name in "${!failures[@]}"; do echo "repeat: $name failed ${failures[$name]} of $passes times"; done
[[ $failed_passes -eq 0 ]]
