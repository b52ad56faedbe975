#!/usr/bin/env bash
# Builds and runs the benchmarks (not part of ctest). Results go to stdout; docs/benchmarks.md
# records them with the machine and date.
set -euo pipefail
cd "$(dirname "$0")/../.."
cmake --preset default >/dev/null
cmake --build --preset default -j "$(nproc)" --target bench_flag_fusion
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
for floats in 1000 669706; do
  mpirun --oversubscribe -np 2 build/tests/bench/bench_flag_fusion "$floats" 300
done
