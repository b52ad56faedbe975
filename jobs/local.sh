#!/usr/bin/env bash
# Workstation run: installs what is missing, builds, and runs autoaccum under mpirun.
#   ./jobs/local.sh [-n RANKS]
set -euo pipefail
cd "$(dirname "$0")/.."

ranks=2
while [[ $# -gt 0 ]]; do
  case "$1" in
    -n|--ranks) ranks="$2"; shift 2 ;;
    -h|--help) sed -n '2,3p' "$0"; exit 0 ;;
    *) break ;;
  esac
done

./jobs/setup.sh
cmake --preset default >/dev/null
cmake --build --preset default -j "$(nproc 2>/dev/null || echo 2)" --target autoaccum

mpi_flags=(--oversubscribe -np "$ranks")
if [[ $(id -u) -eq 0 ]]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
echo "+ mpirun ${mpi_flags[*]} build/autoaccum --version"
mpirun "${mpi_flags[@]}" build/autoaccum --version
