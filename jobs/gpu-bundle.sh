#!/usr/bin/env bash
# Prepares, on a Debian 12 machine with network, what jobs/gpu-check.sh needs on a bare GPU
# machine besides the CUDA toolkit and a CUDA PyTorch wheel: Open MPI, HDF5,
# Boost.ProgramOptions, GoogleTest and zlib's headers, as Debian packages unpacked into DIR.
#
#   jobs/gpu-bundle.sh DIR            then, on the GPU machine:  jobs/gpu-check.sh --bundle DIR
#
# It also builds here (jobs/ci/cuda-torch.sh --build: the CUDA LibTorch 2.11 of PyTorch's wheel,
# the version the GPU machine has) the binary and the GPU tests, and puts them in DIR/bin with
# the torch version they were built against (DIR/bin/TORCH_VERSION): gpu-check.sh then compiles
# nothing and loads that machine's own LibTorch, CUDA runtime and NCCL. AUTOACCUM_BUNDLE_BUILD=0
# leaves the binaries out (the GPU machine then builds, as before).
#
# Nothing is installed here (apt-get download, dpkg-deb -x); no root needed. Each package comes
# with the shared libraries it needs, except those every glibc Linux with a C++ toolchain has
# (libc, libstdc++, zlib, OpenSSL 3, ...: the `base` pattern below). Documentation, manual pages
# and the Boost headers that Boost.ProgramOptions does not include are left out, to stay small
# (<= 60 MiB). DIR/MANIFEST lists the packages and versions; DIR/env.sh sets the paths.
set -euo pipefail
[[ $# -eq 1 ]] || {
  echo "usage: jobs/gpu-bundle.sh DIR" >&2
  exit 1
}
dir=$(realpath -m "$1")
checkout=$(cd "$(dirname "$0")/.." && pwd)
command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null ||
  { echo "gpu-bundle: needs Debian's apt-get and dpkg-deb (run it on a Debian 12 machine)" >&2; exit 1; }
. /etc/os-release
[[ ${VERSION_ID:-} == 12 ]] ||
  echo "gpu-bundle: warning: this is $PRETTY_NAME, not Debian 12; the bundle needs this machine's glibc or newer there" >&2

# Files whose contents we need; their own Depends are build tools, not followed.
dev=(libopenmpi-dev libhdf5-dev libboost-program-options1.74-dev libboost1.74-dev
  libgtest-dev libgmock-dev zlib1g-dev)
# Programs and libraries the build and the checks run; followed through their Depends.
runtime=(openmpi-bin openmpi-common libopenmpi3 libhdf5-103-1 libboost-program-options1.74.0)
packages=$(python3 - "${dev[*]}" "${runtime[*]}" <<'PY'
import re, subprocess, sys
dev, runtime = sys.argv[1].split(), sys.argv[2].split()
# On every glibc Linux with a C++ toolchain, or not needed to build and run (plugins that are
# loaded only when present: hwloc's, verbs providers; X11, OpenCL, Debian's own tools).
base = re.compile(r"^(libc6|libgcc-s1|libstdc\+\+6|gcc-\d+-base|zlib1g|libzstd1|liblzma5|libbz2-1\.0|"
    r"libssl3|libcrypt1|libffi8|libexpat1|libuuid1|libudev1|libselinux1|libpcre2-8-0|libcap2|"
    r"libsystemd0|libgmp10|libdb5\.3|libgpg-error0|libgcrypt20|liblz4-1|libmd0|libbsd0|libtinfo6|"
    r"libncursesw6|libkmod2|libaudit1|libaudit-common|libcap-ng0|libpam.*|libsemanage.*|"
    r"libsepol2|libtirpc.*|libnsl2|libcom-err2|libkeyutils1|debconf|dpkg|adduser|perl.*|libperl.*|"
    r"passwd|lsb-base|sensible-utils|openssh-client|libedit2|libfido2-1|libcbor0\.8|libx11.*|"
    r"libxau6|libxcb1|libxdmcp6|libxext6|libxnvctrl0|ocl-icd-libopencl1|libpciaccess0|"
    r"libhwloc-plugins|ibverbs-providers|libatomic1|libsqlite3-0|libnss3|libnspr4|libcurl3-.*|"
    r"nss-plugin-pem|libnewt.*|libslang2|cdebconf|libdebian-installer4|libtextwrap1|"
    r"debianutils|install-info|m4|autoconf|automake|autotools-dev|googletest)$")
def depends(package):
    out = subprocess.run(["apt-cache", "depends", "--no-recommends", "--no-suggests",
                          "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances", package],
                         capture_output=True, text=True, check=True).stdout
    return [l.split()[-1] for l in out.splitlines()
            if re.match(r"\s+\|?(Pre)?Depends:", l) and not l.strip().endswith(">")]
seen, order, stack = set(dev), list(dev), list(runtime)
while stack:
    p = stack.pop()
    if p in seen or base.match(p):
        continue
    seen.add(p)
    order.append(p)
    stack.extend(depends(p))
print(" ".join(sorted(order)))
PY
)

rm -rf "$dir"
mkdir -p "$dir/debs"
echo "gpu-bundle: downloading $(wc -w <<<"$packages") Debian packages into $dir/debs"
(cd "$dir/debs" && apt-get download -qq $packages) ||
  { echo "gpu-bundle: apt-get download failed (no network, or run 'apt-get update' first)" >&2; exit 1; }
for deb in "$dir"/debs/*.deb; do
  dpkg-deb -x "$deb" "$dir"
  dpkg-deb -f "$deb" Package Version | paste -sd' ' >>"$dir/MANIFEST"
done
rm -rf "$dir/debs" "$dir"/usr/share/{doc,man,lintian,bug} "$dir/usr/lib/x86_64-linux-gnu/fortran"

# Boost: keep only the headers that <boost/program_options.hpp> and <boost/version.hpp> reach.
keep=$(mktemp)
printf '#include <boost/program_options.hpp>\n#include <boost/version.hpp>\n' |
  g++ -std=c++17 -M -x c++ - -I"$dir/usr/include" -o - 2>/dev/null |
  tr ' \\' '\n\n' | grep "^$dir/usr/include/boost/" | sort -u >"$keep"
[[ -s $keep ]] || { echo "gpu-bundle: cannot list the Boost headers (is g++ installed?)" >&2; exit 1; }
find "$dir/usr/include/boost" -type f | sort | comm -23 - "$keep" | xargs rm -f
find "$dir/usr/include/boost" -type d -empty -delete
rm -f "$keep"
# Static libraries: only GoogleTest's are used (Debian ships no shared ones of it).
find "$dir" -name '*.a' ! -name 'libgtest*' ! -name 'libgmock*' -delete

# Debian's symlinks into /etc/alternatives (mpicxx, mpirun, the MPI include folder) and absolute
# ones point outside the bundle: make them point inside it.
arch=x86_64-linux-gnu
ln -sfn "../../lib/$arch/openmpi/include" "$dir/usr/include/$arch/mpi"
for tool in mpirun mpiexec; do ln -sfn orterun "$dir/usr/bin/$tool"; done
for tool in mpicc mpicxx mpic++; do ln -sfn opal_wrapper "$dir/usr/bin/$tool"; done
find "$dir" -type l | while read -r link; do
  to=$(readlink "$link")
  if [[ $to == /* ]]; then
    if [[ -e "$dir$to" || -L "$dir$to" ]]; then
      ln -sfn "$(realpath -m --relative-to="$(dirname "$link")" "$dir$to")" "$link"
    fi
  fi
done

find "$dir" -xtype l -delete  # links to what was left out (HDF5's C++ and Fortran libraries)

cat >"$dir/env.sh" <<'ENV'
# Sourced by jobs/gpu-check.sh --bundle DIR (or by hand: . DIR/env.sh): the bundle's programs,
# libraries and CMake packages first; Open MPI relocated into it (OPAL_PREFIX).
bundle=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export OPAL_PREFIX="$bundle/usr"
export PATH="$bundle/usr/bin:$PATH"
export LD_LIBRARY_PATH="$bundle/usr/lib/x86_64-linux-gnu:$bundle/usr/lib/x86_64-linux-gnu/openmpi/lib:$bundle/usr/lib/x86_64-linux-gnu/hdf5/serial/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CMAKE_PREFIX_PATH="$bundle/usr${CMAKE_PREFIX_PATH:+;$CMAKE_PREFIX_PATH}"
export HDF5_ROOT="$bundle/usr/lib/x86_64-linux-gnu/hdf5/serial"
export MPI_HOME="$bundle/usr/lib/x86_64-linux-gnu/openmpi"
ENV
if [[ ${AUTOACCUM_BUNDLE_BUILD:-1} != 0 ]]; then
  echo "gpu-bundle: building the binary and the GPU tests against the CUDA LibTorch (build-cuda/)"
  (cd "$checkout" && ./jobs/ci/cuda-torch.sh --build) >"$dir/build.log" 2>&1 ||
    { tail -20 "$dir/build.log" >&2; echo "gpu-bundle: the CUDA build failed (log: $dir/build.log)" >&2; exit 1; }
  mkdir -p "$dir/bin"
  cp "$checkout/build-cuda/autoaccum" "$checkout/build-cuda/tests/gpu_trainer" \
    "$checkout/build-cuda/tests/mpi/mpi_comm" "$dir/bin/"
  strip --strip-unneeded "$dir"/bin/* 2>/dev/null || true
  grep -m1 "LibTorch .* from" "$dir/build.log" | sed 's/.*LibTorch \([^ ]*\) from.*/\1/' >"$dir/bin/TORCH_VERSION"
  echo "gpu-bundle: binaries for LibTorch $(cat "$dir/bin/TORCH_VERSION") in $dir/bin"
fi
size=$(du -sm "$dir" | cut -f1)
echo "gpu-bundle: $dir holds $(wc -l <"$dir/MANIFEST") packages in $size MiB (list: $dir/MANIFEST)"
((size <= 60)) || echo "gpu-bundle: warning: more than 60 MiB; it may not travel to the GPU machine" >&2
