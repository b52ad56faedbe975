#!/usr/bin/env bash
# GPU validation (docs/gpu.md): on a machine with a GPU and no network, builds what it can
# against a CUDA LibTorch and runs the GPU test subset:
#   1. the NCCL communicator with world 1 (an all-reduce of device buffers),
#   2. a real CUDA out-of-memory under --memory-limit, recovered by halving,
#   3. one step's gradient equal on CPU and GPU,
#   4. the command line end to end: train --device cuda --micro-batch auto under a limit.
# It says what it could not find (MPI, HDF5, Boost, GoogleTest, NCCL, a CUDA LibTorch) and where
# it looked. Exit 0: all passed; 1: a test failed; 2: could not build.
#   ./jobs/gpu-check.sh [build folder, default build-gpu]
# Environment: AUTOACCUM_TORCH_DIR (a LibTorch's cmake prefix), PYTHON (a python with a CUDA
# torch), CUDAToolkit_ROOT, NCCL_HOME, GPU_CHECK_SECONDS (overall budget, default 480).
set -uo pipefail
cd "$(dirname "$0")/.."
build="${1:-build-gpu}"
budget="${GPU_CHECK_SECONDS:-480}"
start=$SECONDS
report="$build/gpu-check.txt"
mkdir -p "$build"
: >"$report"
say() { echo "gpu-check: $*" | tee -a "$report"; }
left() { echo $((budget - (SECONDS - start))); }

say "$(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 |
    sed 's/^/gpu-check: GPU: /' | tee -a "$report"
else
  say "nvidia-smi not found (looked on PATH: $PATH)"
fi

# --- what the build needs -------------------------------------------------------------------
missing=()
find_header() {  # name, header, folders...
  local name="$1" header="$2"
  shift 2
  for dir in "$@"; do
    if [[ -f "$dir/$header" ]]; then
      say "found $name: $dir/$header"
      return 0
    fi
  done
  say "NOT FOUND $name ($header); looked in: $*"
  missing+=("$name")
  return 1
}
mpi_dirs=(/usr/include/x86_64-linux-gnu/openmpi /usr/lib/x86_64-linux-gnu/openmpi/include
  /usr/include/openmpi /usr/local/include /opt/hpcx/ompi/include)
if command -v mpicxx >/dev/null; then
  read -r -a extra <<<"$(mpicxx --showme:incdirs 2>/dev/null)"
  mpi_dirs=("${extra[@]}" "${mpi_dirs[@]}")
fi
find_header MPI mpi.h "${mpi_dirs[@]}"
command -v mpirun >/dev/null && say "found mpirun: $(command -v mpirun)" ||
  { say "NOT FOUND mpirun (PATH: $PATH)"; missing+=(mpirun); }
find_header HDF5 hdf5.h /usr/include/hdf5/serial /usr/include /usr/local/include \
  ${HDF5_ROOT:+$HDF5_ROOT/include}
find_header Boost.ProgramOptions boost/program_options.hpp /usr/include /usr/local/include \
  ${BOOST_ROOT:+$BOOST_ROOT/include}
find_header GoogleTest gtest/gtest.h /usr/include /usr/local/include
cuda_root="${CUDAToolkit_ROOT:-/usr/local/cuda}"
find_header "CUDA toolkit" cuda_runtime_api.h "$cuda_root/include" /usr/include
find_header NCCL nccl.h "$cuda_root/include" ${NCCL_HOME:+$NCCL_HOME/include} /usr/include

# A CUDA LibTorch: AUTOACCUM_TORCH_DIR, else the one inside a Python torch package.
torch_prefix="${AUTOACCUM_TORCH_DIR:-}"
if [[ -z $torch_prefix ]]; then
  for py in ${PYTHON:-} python3 /usr/bin/python3 /opt/conda/bin/python; do
    command -v "$py" >/dev/null || continue
    out=$("$py" -c 'import torch, torch.utils; print(torch.utils.cmake_prefix_path); print(torch.version.cuda)' 2>/dev/null) ||
      { say "$py ($(command -v "$py")) has no torch"; continue; }
    prefix=$(sed -n 1p <<<"$out")
    cuda=$(sed -n 2p <<<"$out")
    if [[ $cuda != None && -n $cuda ]]; then
      torch_prefix="$prefix"
      say "found CUDA LibTorch (CUDA $cuda) through $py: $prefix"
      break
    fi
    say "$py has torch without CUDA ($prefix)"
  done
fi
if [[ -z $torch_prefix ]]; then
  say "NOT FOUND a CUDA LibTorch; looked at AUTOACCUM_TORCH_DIR and torch.utils.cmake_prefix_path of ${PYTHON:-} python3 /usr/bin/python3 /opt/conda/bin/python"
  missing+=("CUDA LibTorch")
fi

if ((${#missing[@]})); then
  say "cannot build: missing ${missing[*]}"
  say "install them (Debian: jobs/setup.sh; a CUDA torch: pip or conda) or point the variables above at them"
  exit 2
fi

# --- build ------------------------------------------------------------------------------------
say "configuring $build (Release, AUTOACCUM_WITH_CUDA=ON, AUTOACCUM_WITH_NCCL=ON)"
if ! timeout "$(left)" cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$torch_prefix" -DAUTOACCUM_WITH_CUDA=ON -DAUTOACCUM_WITH_NCCL=ON \
  -DCUDAToolkit_ROOT="$cuda_root" >"$build/configure.log" 2>&1; then
  tail -20 "$build/configure.log" | tee -a "$report"
  say "cannot build: cmake failed (full log: $build/configure.log)"
  exit 2
fi
if ! timeout "$(left)" cmake --build "$build" -j "$(nproc)" --target autoaccum mpi_comm gpu_trainer \
  >"$build/build.log" 2>&1; then
  grep -E "error|Error" "$build/build.log" | head -20 | tee -a "$report"
  say "cannot build (full log: $build/build.log; $(left) s of the budget left)"
  exit 2
fi
say "built in $((SECONDS - start)) s"

# --- tests ------------------------------------------------------------------------------------
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
failed=0
check() {  # name, command...
  local name="$1"
  shift
  local t=$SECONDS
  if timeout "$(left)" "$@" >"$build/$name.log" 2>&1; then
    say "PASS $name ($((SECONDS - t)) s)"
  else
    say "FAIL $name ($((SECONDS - t)) s; log: $build/$name.log)"
    tail -25 "$build/$name.log" | tee -a "$report"
    failed=1
  fi
  grep -E "SKIPPED|\[  (PASSED|FAILED) " "$build/$name.log" | sed 's/^/    /' | tee -a "$report"
}
check nccl-world-1 mpirun -np 1 "$build/tests/mpi/mpi_comm" --gtest_filter='Nccl.*'
check gpu-trainer mpirun -np 1 "$build/tests/gpu_trainer"
data="$build/gpu-check-synth.h5"
check cli-synth "$build/autoaccum" synth --out "$data" --rows 65536 --features 784 --classes 10
check cli-train-auto mpirun -np 1 "$build/autoaccum" train --data "$data" --device cuda \
  --hidden 8192,8192 --global-batch 16384 --micro-batch auto --memory-limit 2GiB --steps 6 \
  --run-log "$build/gpu-check-run.h5"
if [[ -f $build/gpu-check-run.h5 ]]; then
  "$build/autoaccum" log "$build/gpu-check-run.h5" 2>&1 | tee -a "$report"
fi
say "done in $((SECONDS - start)) s: $([[ $failed == 0 ]] && echo 'all passed' || echo 'FAILURES')"
say "report: $report"
exit "$failed"
