#!/usr/bin/env bash
# Stops the cluster started by jobs/ci/slurm-up.sh, by the pids in its pid files.
#   jobs/ci/slurm-down.sh [STATE_DIR]    (default: build/slurm)
set -uo pipefail
cd "$(dirname "$0")/../.."
dir=$(realpath -m "${1:-build/slurm}")
for pidfile in "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munge/munged.pid"; do
  [[ -f $pidfile ]] || continue
  pid=$(cat "$pidfile")
  kill "$pid" 2>/dev/null || continue
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
done
exit 0
