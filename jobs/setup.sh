#!/usr/bin/env bash
# Installs autoaccum's build and test dependencies from Debian's packages (idempotent).
#
# As root with apt: installs only what is missing, and runs `apt-get update` only then.
# Elsewhere (a cluster login node): installs nothing, lists what is missing and how to
# provide it, and exits 0 so that a build with modules loaded can still be tried.
set -euo pipefail

packages=(
  build-essential cmake pkg-config ccache
  libtorch-dev libopenblas0-openmp
  libopenmpi-dev openmpi-bin
  libhdf5-dev hdf5-tools
  libboost-program-options-dev
  libgtest-dev googletest libbenchmark-dev
  zlib1g-dev libxxhash-dev
  python3 python3-venv python3-h5py python3-torch python3-torchvision python3-numpy python3-matplotlib python3-xxhash
  python3-jinja2
  slurmctld slurmd slurm-client munge iproute2
  dataset-fashion-mnist fortunes
)

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup: all dependencies present"
  exit 0
fi

if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  echo "setup: done"
  exit 0
fi

cat >&2 <<MSG
setup: missing Debian packages: ${missing[*]}
setup: not root or no apt-get, so nothing was installed. On a cluster, provide them instead:
  - compilers, CMake, MPI, HDF5, Boost: load environment modules, e.g.
      module load gcc cmake openmpi hdf5 boost
  - LibTorch: unpack a LibTorch release and configure with
      cmake --preset default -DCMAKE_PREFIX_PATH=/path/to/libtorch
  - GoogleTest (tests only): a module, or configure with -DAUTOACCUM_BUILD_TESTS=OFF
  See docs/slurm.md.
MSG
exit 0
