#!/usr/bin/env bash
# Builds and runs the benchmarks (not part of ctest). Results go to stdout; docs/benchmarks.md
# records them with the machine and date. Needs ~2.1 GB free in build/ for the slab-read file.
set -euo pipefail
cd "$(dirname "$0")/../.."
cmake --preset default >/dev/null
cmake --build --preset default -j "$(nproc)" --target autoaccum bench_flag_fusion bench_slab_read
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
mpi=(mpirun --oversubscribe -np 2)

echo "== OOM flag fused into the gradient all-reduce vs a separate all-reduce"
for floats in 1000 669706; do "${mpi[@]}" build/tests/bench/bench_flag_fusion "$floats" 300; done

echo "== slab reads vs sequential reads of a ~2 GB file from the page cache"
file=build/bench-data/synth-2g.h5
if [[ ! -f $file ]]; then
  mkdir -p build/bench-data
  build/autoaccum synth --out "$file" --rows 2000000 --features 256 --classes 10 --seed 1
fi
cat "$file" >/dev/null  # into the page cache
for batch in 512 4096 65536; do "${mpi[@]}" build/tests/bench/bench_slab_read "$file" "$batch" 7; done
