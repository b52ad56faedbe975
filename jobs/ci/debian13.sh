#!/usr/bin/env bash
# The second CI platform: builds this checkout against Debian 13's LibTorch 2.6 (GCC 14, Open MPI
# 5, HDF5 1.14, Python 3.13 with torch 2.6) inside a Debian 13 root made with debootstrap, and
# runs there the tests that this platform changes (SECOND_PLATFORM below). As root (debootstrap,
# chroot and mounts need it).
#
#   jobs/ci/debian13.sh [CTEST ARGS...]       e.g. jobs/ci/debian13.sh -R e2e.user_models;
#                                             jobs/ci/debian13.sh -R . for the whole suite
#   jobs/ci/debian13.sh --run COMMAND...      a shell command line in the checkout inside the root:
#                                             --run cmake --build build -j 2 -- -k
#
# The root is cached in $AUTOACCUM_DEBIAN13_ROOT (default /var/cache/autoaccum/debian13) and
# reused while its package list is unchanged; its build folder and ccache stay with it, so a
# second run from the same checkout rebuilds only what changed (another checkout starts the
# build folder afresh). The checkout is seen inside the root at /work/src with the
# root's own build/ mounted over the checkout's: the checkout's Debian 12 build is never touched.
# All mounts live in a private mount namespace and vanish when the script ends, however it ends.
# Inside, the suite runs as `tests/run.sh` does on the main platform (jobs/setup.sh, configure,
# build with warnings as errors, ctest); the Slurm tests run too (slurm-up.sh starts its own
# daemons). The CUDA toolkit at /usr/local/cuda, when present, is mounted read-only so that the
# CUDA type-check and NCCL targets compile against LibTorch 2.6's headers as well.
set -euo pipefail
checkout=$(cd "$(dirname "$0")/../.." && pwd)
root=${AUTOACCUM_DEBIAN13_ROOT:-/var/cache/autoaccum/debian13}
# The Debian archive this machine's own apt uses (deb822 .sources or a one-line sources.list),
# so that a machine behind a local mirror builds the root from it; AUTOACCUM_DEBIAN_MIRROR
# overrides it, and Debian's redirector is the last resort.
apt_mirror() {
  local file uri
  for file in /etc/apt/sources.list.d/*.sources; do
    [[ -f $file ]] || continue
    uri=$(awk '/^URIs:/ { for (i = 2; i <= NF; ++i) if ($i !~ /security/) { print $i; exit } }' "$file")
    [[ -n $uri ]] && { echo "${uri%/}"; return; }
  done
  for file in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -f $file ]] || continue
    uri=$(awk '$1 == "deb" { for (i = 2; i <= NF; ++i) if ($i ~ /^[a-z]+:\/\//) { if ($i !~ /security/) { print $i; exit } break } }' "$file")
    [[ -n $uri ]] && { echo "${uri%/}"; return; }
  done
  echo http://deb.debian.org/debian
}
mirror=${AUTOACCUM_DEBIAN_MIRROR:-$(apt_mirror)}
say() { echo "debian13: $*"; }
SECOND_PLATFORM='^(unit_|mpi_|gpu_|e2e\.(faults|overlap|resume|shard|watchdog)\.'
SECOND_PLATFORM+='|e2e\.multinode\.FourNodes\.'
SECOND_PLATFORM+='|e2e\.train\.Checkpoints\.test_full_disk)'
fail() {
  echo "debian13: $*" >&2
  exit 1
}

[[ $(id -u) -eq 0 ]] || fail "must run as root (debootstrap, chroot and mount need it)"

# Mounts made below must not leak into the machine's namespace (a shared / would propagate them).
if [[ -z "${AUTOACCUM_DEBIAN13_UNSHARED:-}" ]]; then
  export AUTOACCUM_DEBIAN13_UNSHARED=1
  exec unshare --mount --propagation private "$0" "$@"
fi

# 1. The root: made once, then kept. A root whose making was interrupted has no stamp and is
# made again from scratch. The stamp records the setup script it was made for: a changed package
# list installs the difference (setup.sh is idempotent) the next time.
if [[ ! -f "$root/.autoaccum-root" ]]; then
  if ! command -v debootstrap >/dev/null; then
    say "installing debootstrap on this machine"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null ||
      fail "cannot install debootstrap (apt-get install debootstrap)"
  fi
  rm -rf "$root" "$root.partial"
  mkdir -p "$(dirname "$root")"
  say "making a Debian 13 (trixie) root in $root from $mirror"
  start=$SECONDS
  debootstrap --variant=minbase --include=ca-certificates trixie "$root.partial" "$mirror" \
    >"$(dirname "$root")/debootstrap.log" 2>&1 ||
    fail "debootstrap failed; see $(dirname "$root")/debootstrap.log"
  # No service may start inside the root while packages are installed (slurmd, munge).
  printf '#!/bin/sh\nexit 101\n' >"$root.partial/usr/sbin/policy-rc.d"
  chmod +x "$root.partial/usr/sbin/policy-rc.d"
  mv "$root.partial" "$root"
  date -u +%FT%TZ >"$root/.autoaccum-root"
  say "root made in $((SECONDS - start)) s"
fi
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
cp /etc/hosts "$root/etc/hosts"  # the machine's own name resolves inside too (Slurm, MPI)

# 2. Mounts: kernel file systems, the checkout, the root's own build folder over the checkout's.
# The root a mount point of its own, as / is on a real system: `ip -n`, `unshare --mount` (the
# many-node Slurm cluster of the tests) change the propagation of / and fail on a plain folder.
mount --bind "$root" "$root"
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
mount --rbind /dev "$root/dev"
mount -t tmpfs -o size=4g tmpfs "$root/dev/shm"
mount -t tmpfs tmpfs "$root/tmp"
mkdir -p "$root/work/src" "$root/work/build" "$checkout/build"
# One build folder serves every checkout, and make compares times: objects built from another
# checkout can be newer than this one's edited sources and be kept, stale (an edit made before
# another checkout's build was not compiled, and the link failed). A build folder made from
# another checkout starts afresh; ccache makes that a few minutes.
stamp="$root/work/build/.checkout"
if [[ "$(cat "$stamp" 2>/dev/null)" != "$checkout" ]]; then
  [[ -f $stamp || -f $root/work/build/CMakeCache.txt ]] && say "build folder was another checkout's: building afresh"
  find "$root/work/build" -mindepth 1 -delete
  echo "$checkout" >"$stamp"
fi
mount --bind "$checkout" "$root/work/src"
mount --bind "$root/work/build" "$root/work/src/build"
if [[ -d /usr/local/cuda ]]; then
  mkdir -p "$root/usr/local/cuda"
  mount --bind -o ro /usr/local/cuda "$root/usr/local/cuda"
fi

# 3. Inside: the same test command as the main platform's, in a clean environment.
say "running inside the root ($(chroot "$root" sh -c '. /etc/os-release; echo "$PRETTY_NAME"'))"
if [[ "${1:-}" == "--run" ]]; then
  shift
  inner="$*"  # a shell command line
else
  # Without ctest arguments, what differs on this platform: every unit and MPI test, and end
  # to end what runs on Open MPI 5 and HDF5 1.14 (faults, the watchdog, overlap's thread,
  # resume and reshape, sharding's collectives, four Slurm nodes' start-up, which crashed under
  # Open MPI 5 alone, a full disk under a checkpoint, which crashed HDF5 1.14 alone). The rest
  # runs on Debian 12 (tests/run.sh, every test), precision and scripted models on LibTorch 2.x
  # on the CUDA platform: CI's three platforms on a 2-core machine within 60 minutes.
  (($#)) || set -- -R "$SECOND_PLATFORM"
  inner="./tests/run.sh$(printf ' %q' "$@")"
fi
exec chroot "$root" /usr/bin/env -i \
  HOME=/root LANG=C.UTF-8 TERM=dumb AUTOACCUM_SKIP_HF=1 \
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  CCACHE_DIR=/work/ccache \
  /bin/bash -c "cd /work/src && $inner"
