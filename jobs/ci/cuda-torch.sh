#!/usr/bin/env bash
# The third CI platform: this checkout built against the CUDA build of LibTorch that PyTorch's
# wheel carries (the version the GPU machine has), on a machine without a GPU, and tested on CPU.
# Run by .ci/run after the Debian 13 platform.
#
#   jobs/ci/cuda-torch.sh              install (once, cached), configure, build, test
#   jobs/ci/cuda-torch.sh --install    only the cached Python environment
#   jobs/ci/cuda-torch.sh --build      install, configure and build (jobs/gpu-bundle.sh's binaries)
#   jobs/ci/cuda-torch.sh -R REGEX     ctest arguments replace the default selection
#
# What it uses:
# - torch==2.11.0 from the package registry (its wheel is 2.11.0+cu130: CUDA 13.0, with the
#   nvidia-* wheels of CUDA 13.0, cuDNN and NCCL 2.28), installed once into a virtual environment
#   under $AUTOACCUM_CACHE (default /var/cache/autoaccum as root, beside the Debian 13 root, else
#   ~/.cache/autoaccum; 4.7 GB, about 90 s to install here) and reused while its marker file says
#   it is complete. It must be readable by every user: a test runs the binary as `nobody`;
# - Debian 12's packages for everything else (jobs/setup.sh: Open MPI, HDF5, Boost, GoogleTest),
#   and the CUDA toolkit at /usr/local/cuda (13.0) for CMake's CUDAToolkit and nvcc's version;
# - one CUDA runtime and one NCCL in the process, both the wheels' (the ones libtorch_cuda.so
#   itself loads): CUDA_cudart_LIBRARY and NCCL_LIBRARY point at them, never at a second copy.
# The build lives in build-cuda/ with warnings as errors (AUTOACCUM_WITH_CUDA=ON, NCCL=ON); ccache
# is shared with the other builds. Tests: every unit and MPI test and the end-to-end modules in
# E2E below (-R . for the whole suite); with no GPU the GPU-only tests show as skipped. The tests' Python is the environment's (torch 2.11,
# torchvision, numpy, h5py: `requirements` below); scripts that the tests run by path
# (jobs/models/gpt.py, jobs/plot-run.py) keep Debian's /usr/bin/python3.
set -euo pipefail
checkout=$(cd "$(dirname "$0")/../.." && pwd)
cd "$checkout"
version=2.11.0
cuda_expected=13.0
# The Python side of the tests (models scripted, PyTorch references, run logs read back) uses
# the same PyTorch as the LibTorch under test: an autocast reference from another version (the
# system's 1.13) differs from 2.11's bf16 by 5e-4 to 4e-3, far beyond the checks' 5e-5.
# transformers (e2e.hf, jobs/models/hf.py) at a current release with its main dependencies pinned;
# Debian 12 takes 4.35.2, the last for its PyTorch 1.13 (jobs/models/hf-env.sh).
requirements=("torch==$version" "torchvision==0.26.0" "numpy==2.4.6" "h5py==3.16.0"
  "transformers==5.25.0" "tokenizers==0.23.3" "safetensors==0.8.0" "huggingface_hub==2.4.0")
if [[ $(id -u) -eq 0 ]]; then
  cache=${AUTOACCUM_CACHE:-/var/cache/autoaccum}
else
  cache=${AUTOACCUM_CACHE:-$HOME/.cache/autoaccum}
fi
venv="$cache/cuda-torch-$version"
python=/usr/bin/python3
say() { echo "cuda-torch: $*"; }

install() {
  if [[ "$(cat "$venv/.complete" 2>/dev/null)" == "${requirements[*]}" ]] &&
    "$venv/bin/python" -c 'import torch, torchvision, h5py, transformers' 2>/dev/null; then
    return
  fi
  say "installing ${requirements[*]} (torch's CUDA build) into $venv"
  rm -rf "$venv"
  mkdir -p "$cache"
  (umask 022 && "$python" -m venv "$venv")
  (umask 022 && "$venv/bin/python" -m pip install --quiet --no-cache-dir \
    --disable-pip-version-check "${requirements[@]}")
  local cuda
  cuda=$("$venv/bin/python" -c 'import torch; print(torch.version.cuda)' 2>/dev/null)
  if [[ $cuda != "$cuda_expected" ]]; then
    say "torch $version came with CUDA '$cuda', expected $cuda_expected" >&2
    exit 1
  fi
  echo "${requirements[*]}" >"$venv/.complete"
}

./jobs/setup.sh
install
[[ ${1:-} == --install ]] && exit 0

site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
torch_dir="$site/torch"
cudart="$site/nvidia/cu13/lib/libcudart.so.13"
nccl="$site/nvidia/nccl"
for f in "$torch_dir/share/cmake/Torch/TorchConfig.cmake" "$cudart" "$nccl/lib/libnccl.so.2" \
  "$nccl/include/nccl.h" /usr/local/cuda/bin/nvcc; do
  [[ -e $f ]] || { say "missing $f" >&2; exit 1; }
done
say "LibTorch $("$venv/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null) from $torch_dir"

build="$checkout/build-cuda"
jobs="$(nproc 2>/dev/null || echo 2)"
# The torch prefix itself goes on CMAKE_PREFIX_PATH too: its lib/ is then searched before the
# system's, where Debian's CPU libtorch.so would otherwise be found first.
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DAUTOACCUM_WARNINGS_AS_ERRORS=ON \
  "-DCMAKE_PREFIX_PATH=$torch_dir/share/cmake;$torch_dir" \
  -DAUTOACCUM_WITH_CUDA=ON -DAUTOACCUM_WITH_NCCL=ON -DAUTOACCUM_PYTHON="$venv/bin/python" \
  -DAUTOACCUM_HF_PYTHON="$venv/bin/python" \
  -DCUDAToolkit_ROOT=/usr/local/cuda -DCUDA_cudart_LIBRARY="$cudart" \
  -DNCCL_INCLUDE_DIR="$nccl/include" -DNCCL_LIBRARY="$nccl/lib/libnccl.so.2" >"$build.configure.log" 2>&1 ||
  { tail -30 "$build.configure.log"; say "configure failed" >&2; exit 1; }
grep -E "^-- (autoaccum|NCCL|Found Torch)" "$build.configure.log"
# The cache, not the log: a second configure of the same build prints no "Found Torch".
grep -qx "TORCH_LIBRARY:FILEPATH=$torch_dir/lib/libtorch.so" "$build/CMakeCache.txt" ||
  { say "CMake did not take the wheel's LibTorch" >&2; exit 1; }
cmake --build "$build" -j "$jobs"

# Every process loads one CUDA runtime and one NCCL: the wheels'.
binary="$build/autoaccum"
loaded=$(ldd "$binary" | grep -E "libcudart|libnccl|libtorch_cuda" || true)
echo "$loaded"
if grep -E "libcudart|libnccl" <<<"$loaded" | grep -v "$site" | grep -q .; then
  say "a CUDA runtime or NCCL from outside the wheels would be loaded" >&2
  exit 1
fi
"$binary" --version
[[ ${1:-} == --build ]] && exit 0

# Every module's unit and MPI tests; end to end, what LibTorch 2.11 and transformers 5 change:
# mixed precision (autocast's bf16 differs by version), TorchScript files saved by the current
# PyTorch, token losses, and transformers models exported by the current transformers. Documents,
# users' models, sharding and the memory predictions run the same C++ on Debian 12 (every test)
# and, where Open MPI 5 or HDF5 1.14 matter, on Debian 13: CI's three platforms run on a 2-core
# machine within 60 minutes (docs/reliability.md). `-R .` runs the whole suite here.
# Of e2e.hf, what transformers 5 itself changes: the exported models' updates, the tokenizer
# that travels with the data and the round trip to from_pretrained (the rest is autoaccum's own,
# tested on Debian 12).
E2E="precision|torchscript|token_loss"
HF="e2e\.hf\.HuggingFace\.test_(gpt2_update|llama_update|bert_classifier_update|text_tokenized|round_trip)"
args=("$@")
((${#args[@]})) || args=(-R "^(unit_|mpi_|gpu_|e2e\.($E2E)\.|$HF)")
ctest --test-dir "$build" -j "$jobs" --timeout 600 --output-on-failure \
  --resource-spec-file "$build/tests/cores.json" "${args[@]}"
