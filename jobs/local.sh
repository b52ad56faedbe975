#!/usr/bin/env bash
# Workstation run: installs what is missing, builds, imports Fashion-MNIST into data/, and trains
# the cnn under mpirun with automatic micro-batching, with the settings of the Slurm job
# (jobs/configs/fashion-mnist-cnn.ini). The per-rank memory limit is low enough that a rank's
# share does not fit: the memory model predicts what does and the run accumulates (add
# --micro-batch-search halve to watch it halve instead); the run log goes to runs/ and is
# summarised at the end. Ctrl-C or SIGTERM: a checkpoint, then exit 4.
#   ./jobs/local.sh [-n RANKS] [extra train options...]
set -euo pipefail
cd "$(dirname "$0")/.."
source jobs/lib/common.sh

ranks=2
while [[ $# -gt 0 ]]; do
  case "$1" in
    -n|--ranks) ranks="$2"; shift 2 ;;
    -h|--help) print_help "$0"; exit 0 ;;
    *) break ;;
  esac
done

build_autoaccum
if [[ ! -f data/fashion-mnist-train.h5 || ! -f data/fashion-mnist-test.h5 ]]; then
  build/autoaccum import fashion-mnist --out data
fi
mkdir -p runs
log="runs/local-$(date +%Y%m%d-%H%M%S).h5"
rc=0
train_locally "$ranks" "$log" --config jobs/configs/fashion-mnist-cnn.ini "$@" || rc=$?
[[ $rc -eq 0 ]] || exit "$rc"
echo "plot it: jobs/plot-run.py $log -o ${log%.h5}.png"
