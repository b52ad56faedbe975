#!/usr/bin/env bash
# The test command: installs what is missing, configures, builds and runs every test.
# Its exit code is the verdict (CI runs it through .ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."

./jobs/setup.sh
# transformers for e2e.hf (pinned, cached); the Debian 13 platform, which does not run e2e.hf,
# sets AUTOACCUM_SKIP_HF=1 (its root has no certificates for the package registry).
[[ ${AUTOACCUM_SKIP_HF:-0} == 1 ]] || ./jobs/models/hf-env.sh >/dev/null
jobs="$(nproc 2>/dev/null || echo 2)"
cmake --preset default
cmake --build --preset default -j "$jobs"
ctest --preset default -j "$jobs" --timeout 600 "$@"
