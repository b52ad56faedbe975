#!/usr/bin/env bash
# Installs Hugging Face transformers, pinned, into a cached virtual environment for
# jobs/models/hf.py and the tests that use it (e2e.hf). Nothing else downloads anything.
#
#   jobs/models/hf-env.sh             install once (cached), print the environment's python
#   jobs/models/hf-env.sh --python    only print the python's path (empty when not installed)
#
# transformers 4.35.2 is the newest release that supports Debian 12's PyTorch (python3-torch
# 1.13); the environment sees Debian's packages (--system-site-packages: torch, numpy, h5py) and
# adds transformers with its own dependencies at the versions below. It lives under
# $AUTOACCUM_CACHE (default /var/cache/autoaccum as root, else ~/.cache/autoaccum), is reused
# while its marker file lists exactly these requirements, and must be readable by every user.
set -euo pipefail
requirements=(transformers==4.35.2 tokenizers==0.15.2 safetensors==0.8.0 huggingface_hub==0.36.2
  hf-xet==1.8.0 regex==2026.12.2 tqdm==4.70.1 filelock==4.3.2 fsspec==2026.9.0)
if [[ $(id -u) -eq 0 ]]; then
  cache=${AUTOACCUM_CACHE:-/var/cache/autoaccum}
else
  cache=${AUTOACCUM_CACHE:-$HOME/.cache/autoaccum}
fi
venv="$cache/hf-transformers-4.35.2"
python=/usr/bin/python3
complete() {
  [[ "$(cat "$venv/.complete" 2>/dev/null)" == "${requirements[*]}" ]] &&
    "$venv/bin/python" -c 'import transformers, torch, h5py' 2>/dev/null
}
if [[ ${1:-} == --python ]]; then
  complete && echo "$venv/bin/python"
  exit 0
fi
if ! complete; then
  echo "hf-env: installing ${requirements[*]} into $venv" >&2
  rm -rf "$venv"
  mkdir -p "$cache"
  (umask 022 && "$python" -m venv --system-site-packages "$venv")
  (umask 022 && "$venv/bin/python" -m pip install --quiet --no-cache-dir \
    --disable-pip-version-check "${requirements[@]}")
  "$venv/bin/python" -c 'import transformers, torch, h5py' || {
    echo "hf-env: $venv cannot import transformers, torch and h5py" >&2
    exit 1
  }
  echo "${requirements[*]}" >"$venv/.complete"
fi
echo "$venv/bin/python"
