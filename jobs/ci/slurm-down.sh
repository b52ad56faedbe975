#!/usr/bin/env bash
# Stops the cluster started by jobs/ci/slurm-up.sh, by the pids in its pid files, and removes
# the namespaces, links and bridge of a --nodes cluster.
#   jobs/ci/slurm-down.sh [STATE_DIR]    (default: build/slurm)
set -uo pipefail
cd "$(dirname "$0")/../.."
dir=$(realpath -m "${1:-build/slurm}")
stop() {
  local pidfile=$1 pid
  [[ -f $pidfile ]] || return 0
  pid=$(cat "$pidfile")
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
}
for pidfile in "$dir"/slurmd-node*.pid "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munge/munged.pid"; do
  stop "$pidfile"
done
if [[ -f $dir/nodes ]]; then
  for i in $(seq 1 "$(cat "$dir/nodes")"); do
    # Whatever still runs inside a node (a job's tasks) goes with it.
    for pid in $(ip netns pids "aa-node$i" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
    # Gone before the namespace is: the next cluster reuses its addresses.
    for _ in $(seq 1 50); do
      [[ -z $(ip netns pids "aa-node$i" 2>/dev/null) ]] && break
      sleep 0.1
    done
    ip link del "aa-v$i" 2>/dev/null
    ip netns del "aa-node$i" 2>/dev/null
  done
  ip link del aa-br0 2>/dev/null
fi
exit 0
