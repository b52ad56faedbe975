#!/usr/bin/env bash
# GPU validation (docs/gpu.md): on a machine with a GPU, the CUDA toolkit and a CUDA PyTorch
# wheel, and no network, builds autoaccum against the wheel's LibTorch and NCCL and runs:
#   1. the NCCL communicator (an all-reduce of device buffers; one rank per GPU),
#   2. a real CUDA out-of-memory under --memory-limit, recovered by halving,
#   3. one step's gradient equal on CPU and GPU,
#   4. the command line end to end: train --device cuda --micro-batch auto under a limit, with
#      the run log read back (micro-batch timeline, peak bytes under the limit).
# Open MPI, HDF5, Boost and GoogleTest come from the machine or from a bundle made beforehand on
# a Debian 12 machine with jobs/gpu-bundle.sh DIR. A check that was skipped counts as failed:
# without a GPU the script builds and runs what it can, says that no GPU was found, and fails.
#   ./jobs/gpu-check.sh [--bundle DIR] [build folder, default build-gpu]
# Exit 0: all passed; 1: a check failed or was skipped; 2: could not build.
# Environment: AUTOACCUM_TORCH_DIR (a LibTorch's cmake prefix), PYTHON (a python with a CUDA
# torch), CUDAToolkit_ROOT, NCCL_HOME, GPU_CHECK_SECONDS (overall budget, default 480).
set -uo pipefail
cd "$(dirname "$0")/.."
bundle=""
if [[ "${1:-}" == "--bundle" ]]; then
  bundle=$(realpath "${2:?--bundle needs a folder made by jobs/gpu-bundle.sh}")
  [[ -f "$bundle/env.sh" ]] || { echo "gpu-check: $bundle has no env.sh: make it with jobs/gpu-bundle.sh" >&2; exit 2; }
  # shellcheck source=/dev/null
  . "$bundle/env.sh"
  shift 2
fi
build="${1:-build-gpu}"
budget="${GPU_CHECK_SECONDS:-480}"
start=$SECONDS
report="$build/gpu-check.txt"
mkdir -p "$build"
: >"$report"
say() { echo "gpu-check: $*" | tee -a "$report"; }
left() { echo $((budget - (SECONDS - start))); }

say "$(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)${bundle:+, bundle $bundle}"
gpus=0
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  gpus=$(nvidia-smi -L | grep -c '^GPU')
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 |
    sed 's/^/gpu-check: GPU: /' | tee -a "$report"
else
  say "NO GPU FOUND: nvidia-smi $(command -v nvidia-smi >/dev/null && echo 'lists no GPU' || echo "is not on PATH ($PATH)"); building and running what can run without one: every GPU check will be skipped, and this script fails"
fi

# --- a prebuilt bundle: binaries built against the same LibTorch, loaded from this machine --------
prebuilt=0
if [[ -n $bundle && -x $bundle/bin/autoaccum && ${GPU_CHECK_BUILD:-0} != 1 ]]; then
  want=$(cat "$bundle/bin/TORCH_VERSION" 2>/dev/null)
  for py in ${PYTHON:-} python3 /usr/bin/python3 /opt/conda/bin/python; do
    command -v "$py" >/dev/null || continue
    out=$("$py" -c 'import os, torch; print(torch.__version__); print(os.path.dirname(torch.__file__))' 2>/dev/null) || continue
    have=$(sed -n 1p <<<"$out")
    torch_dir=$(sed -n 2p <<<"$out")
    if [[ ${have%%+*} == "${want%%+*}" ]]; then
      prebuilt=1
      say "prebuilt binaries (LibTorch $want) with the LibTorch $have of $py: $torch_dir"
      break
    fi
    say "$py has torch $have; the bundle's binaries need $want"
  done
  if ((prebuilt)); then
    # That torch's libraries and the nvidia-* wheels beside it (CUDA runtime, NCCL, cuBLAS ...).
    libs="$torch_dir/lib"
    for d in "$(dirname "$torch_dir")"/nvidia/*/lib "$(dirname "$torch_dir")"/nvidia/*/*/lib; do
      [[ -d $d ]] && libs+=":$d"
    done
    export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    unresolved=$(for b in "$bundle"/bin/{autoaccum,gpu_trainer,mpi_comm}; do ldd "$b"; done |
      grep "not found" | sort -u)
    if [[ -n $unresolved ]]; then
      say "cannot run the prebuilt binaries: unresolved libraries:"
      sed 's/^/gpu-check:   /' <<<"$unresolved" | tee -a "$report"
      exit 2
    fi
    say "every library the binaries need resolves (ldd); nothing to compile"
    budget="${GPU_CHECK_SECONDS:-300}"
  else
    say "no torch $want here: building instead"
  fi
fi
autoaccum="$build/autoaccum"
mpi_comm="$build/tests/mpi/mpi_comm"
gpu_trainer="$build/tests/gpu_trainer"
if ((prebuilt)); then
  autoaccum="$bundle/bin/autoaccum"
  mpi_comm="$bundle/bin/mpi_comm"
  gpu_trainer="$bundle/bin/gpu_trainer"
else

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
find_header Boost.ProgramOptions boost/program_options.hpp ${bundle:+$bundle/usr/include} /usr/include /usr/local/include \
  ${BOOST_ROOT:+$BOOST_ROOT/include}
find_header GoogleTest gtest/gtest.h ${bundle:+$bundle/usr/include} /usr/include /usr/local/include
cuda_root="${CUDAToolkit_ROOT:-/usr/local/cuda}"
find_header "CUDA toolkit" cuda_runtime_api.h "$cuda_root/include" /usr/include

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
cuda_torch=1
if [[ -z $torch_prefix && $gpus == 0 ]]; then
  # No GPU: a CPU LibTorch still shows that everything else builds and runs.
  for py in ${PYTHON:-} python3 /usr/bin/python3; do
    out=$("$py" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)' 2>/dev/null) || continue
    torch_prefix="$out"
    cuda_torch=0
    say "no CUDA LibTorch and no GPU: building against the CPU LibTorch of $py ($out)"
    break
  done
fi
if [[ -z $torch_prefix ]]; then
  say "NOT FOUND a CUDA LibTorch; looked at AUTOACCUM_TORCH_DIR and torch.utils.cmake_prefix_path of ${PYTHON:-} python3 /usr/bin/python3 /opt/conda/bin/python"
  missing+=("CUDA LibTorch")
fi

# NCCL: NCCL_HOME, the CUDA toolkit, the system, or the nvidia-nccl wheel beside torch (whose
# library is libnccl.so.2 only, named here explicitly).
nccl_args=()
nccl_dirs=(${NCCL_HOME:+$NCCL_HOME} "$cuda_root" /usr)
for py in ${PYTHON:-} python3; do
  wheel=$("$py" -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null) && nccl_dirs+=("$wheel") && break
done
for d in "${nccl_dirs[@]}"; do
  lib=$(ls "$d"/lib/libnccl.so "$d"/lib64/libnccl.so "$d"/lib/x86_64-linux-gnu/libnccl.so "$d"/lib/libnccl.so.2 2>/dev/null | head -1)
  header=$(ls "$d"/include/nccl.h 2>/dev/null | head -1)
  if [[ -n $lib && -n $header ]]; then
    say "found NCCL: $header, $lib"
    nccl_args=(-DNCCL_INCLUDE_DIR="$(dirname "$header")" -DNCCL_LIBRARY="$lib")
    break
  fi
done
if [[ ${#nccl_args[@]} == 0 ]]; then
  say "NOT FOUND NCCL (nccl.h and libnccl.so); looked in: ${nccl_dirs[*]}"
  missing+=(NCCL)
fi

if ((${#missing[@]})); then
  say "cannot build: missing ${missing[*]}"
  say "make a bundle on a Debian 12 machine (jobs/gpu-bundle.sh DIR) and pass --bundle DIR, install them (Debian: jobs/setup.sh; a CUDA torch: pip), or point the variables above at them"
  exit 2
fi

# --- build ------------------------------------------------------------------------------------
with_cuda=$([[ $cuda_torch == 1 && $gpus -gt 0 ]] && echo ON || echo AUTO)
say "configuring $build (Release, AUTOACCUM_WITH_CUDA=$with_cuda, AUTOACCUM_WITH_NCCL=ON)"
if ! timeout "$(left)" cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$torch_prefix${CMAKE_PREFIX_PATH:+;$CMAKE_PREFIX_PATH}" \
  -DAUTOACCUM_WITH_CUDA="$with_cuda" -DAUTOACCUM_WITH_NCCL=ON "${nccl_args[@]}" \
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
fi

# --- tests ------------------------------------------------------------------------------------
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export GTEST_COLOR=no  # plain text in the logs and the report
failed=0
skipped=0
check() {  # name, command...: passes only when it ran, exited 0 and skipped nothing
  local name="$1"
  shift
  local t=$SECONDS
  if timeout "$(left)" "$@" >"$build/$name.log" 2>&1; then
    if grep -q "\[  SKIPPED \]" "$build/$name.log"; then
      say "SKIPPED $name ($((SECONDS - t)) s; counts as failed): $(grep -m1 -A1 'Skipped$' "$build/$name.log" | tail -1 | sed 's/^ *//')"
      skipped=1
    else
      say "PASS $name ($((SECONDS - t)) s)"
    fi
  else
    say "FAIL $name ($((SECONDS - t)) s; log: $build/$name.log)"
    tail -25 "$build/$name.log" | tee -a "$report"
    failed=1
  fi
  grep -E "\[  (SKIPPED|PASSED|FAILED) " "$build/$name.log" | sed 's/^/    /' | tee -a "$report"
}
# NCCL refuses two ranks on one GPU: one rank per GPU, at most 4.
ranks=$((gpus < 1 ? 1 : (gpus > 4 ? 4 : gpus)))
say "checks: NCCL all-reduce at $ranks rank(s); gpu_trainer (real CUDA OOM halved, --memory-limit as a memory fraction, the CPU gradient, bf16 and fp16 with the loss scale, a CPU checkpoint resumed on the GPU, --overlap on queued on NCCL's stream equal to off, --shard optimizer reduce-scattering and all-gathering on NCCL and --shard gradients reducing every micro-batch's buckets, both equal to unsharded); the command line under a 2 GiB limit (halve and predict) with its run log read back"
check nccl-ranks-$ranks mpirun --oversubscribe -np "$ranks" "$mpi_comm" --gtest_filter='*HARDWARE*:*Nccl*'
check gpu-trainer mpirun -np 1 "$gpu_trainer"
data="$build/gpu-check-synth.h5"
log="$build/gpu-check-run.h5"
limit=$((2 * 1024 * 1024 * 1024))
rm -f "$log"
if [[ $gpus == 0 ]]; then
  say "SKIPPED cli-train-auto (no GPU; counts as failed)"
  skipped=1
else
  check cli-synth "$autoaccum" synth --out "$data" --rows 65536 --features 784 --classes 10
  check cli-train-auto mpirun -np 1 "$autoaccum" train --data "$data" --device cuda \
    --hidden 8192,8192 --global-batch 16384 --micro-batch auto --memory-limit "$limit" --steps 6 \
    --micro-batch-search halve --run-log "$log"
  # The default search predicts from two measured micro-batches: under the same limit it should
  # start below it (the run log's memory_model group; `autoaccum log` prints it).
  check cli-train-predict mpirun -np 1 "$autoaccum" train --data "$data" --device cuda \
    --hidden 8192,8192 --global-batch 16384 --micro-batch auto --memory-limit "$limit" --steps 6 \
    --run-log "${log%.h5}-predict.h5"
  "$autoaccum" log "${log%.h5}-predict.h5" 2>&1 | tee -a "$report"
fi
if [[ -f $log ]]; then
  "$autoaccum" log "$log" 2>&1 | tee -a "$report"
  # The run log read back: real OOMs were retried at a smaller size, and every peak stayed under
  # the limit.
  if "$autoaccum" log "$log" --csv steps >"$build/gpu-check-steps.csv" 2>&1 &&
    awk -F, -v limit="$limit" '
      NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
      { m = $col["micro_batch"]; peak = $col["peak_bytes"]; if (peak > worst) worst = peak
        retries += $col["oom_retries"]; if (NR == 2) first = m; last = m; rows++ }
      END { printf "gpu-check: run log: %d steps, micro-batch %d -> %d after %d OOM retries, peak %.0f MiB of %.0f MiB\n",
                   rows, first, last, retries, worst / 1048576, limit / 1048576
            exit !(rows > 0 && retries > 0 && last >= 1 && worst > 0 && worst <= limit) }' \
      "$build/gpu-check-steps.csv" | tee -a "$report"; then
    say "PASS run-log-read-back"
  else
    say "FAIL run-log-read-back (steps: $build/gpu-check-steps.csv)"
    failed=1
  fi
fi
verdict="all passed"
((skipped)) && verdict="SKIPPED checks (no GPU?)"
((failed)) && verdict="FAILURES"
say "done in $((SECONDS - start)) s: $verdict"
say "report: $report"
exit $((failed || skipped))
