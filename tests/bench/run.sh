#!/usr/bin/env bash
# The benchmarks of docs/benchmarks.md in one command (not part of ctest; ~15 minutes here).
# Builds what they need, then tests/bench/bench.py runs every comparison side by side and
# rewrites the generated tables in docs/benchmarks.md; raw figures go to build/bench/results.json.
#   tests/bench/run.sh [--reps N] [--quick] [--no-docs]
# Needs ~2.1 GB free in build/ for the 2 GB data file, and a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
./jobs/setup.sh >/dev/null
cmake --preset default >/dev/null
cmake --build --preset default -j "$(nproc)" \
  --target autoaccum bench_flag_fusion bench_slab_read bench_sgemm bench_allreduce bench_checkpoint \
  bench_optimizer_step
exec /usr/bin/python3 tests/bench/bench.py "$@"
