#!/usr/bin/env bash
# A byte-level GPT on Debian's fortunes: imports the text into data/ (x uint8 token ids, y int64
# [N, T]), writes the model with jobs/models/gpt.py, and trains it on 2 ranks under a memory limit
# that makes the automatic search halve the micro-batch, with the settings of the Slurm job
# (jobs/configs/gpt-fortunes.ini). The loss is cross-entropy per byte over every token of the
# global batch; the run log goes to runs/. Default run: about 6 minutes on 2 cores (docs/models.md
# has its result). Ctrl-C or SIGTERM: a checkpoint, then exit 4.
#   ./jobs/lm.sh [-n RANKS] [--steps N] [extra train options...]
#   ./jobs/lm.sh --documents   one document per fortune (up to 256 bytes each, of every length):
#                              micro-batches are token budgets that halve under the memory limit
#                              (jobs/configs/gpt-fortunes-documents.ini)
#   ./jobs/lm.sh [--documents] --prepare   only the data and the model, for the Slurm job:
#       AUTOACCUM_CONFIG=jobs/configs/gpt-fortunes.ini sbatch jobs/slurm/train.sbatch
#       (gpt-fortunes-documents.ini with --documents)
set -euo pipefail
cd "$(dirname "$0")/.."
source jobs/lib/common.sh

ranks=2
steps=()
prepare_only=0
documents=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    -n|--ranks) ranks="$2"; shift 2 ;;
    --steps) steps=(--steps "$2"); shift 2 ;;
    --prepare) prepare_only=1; shift ;;
    --documents) documents=1; shift ;;
    -h|--help) print_help "$0"; exit 0 ;;
    *) break ;;
  esac
done

build_autoaccum
python=/usr/bin/python3
[[ -x $python ]] || python=python3
mkdir -p runs

if ((documents)); then
  if [[ ! -f data/text-docs-train.h5 || ! -f data/text-docs-val.h5 ]]; then
    build/autoaccum import text --out data --documents fortune --max-length 256
  fi
  config=jobs/configs/gpt-fortunes-documents.ini
  model=runs/gpt-documents.pt
  "$python" jobs/models/gpt.py --out "$model" --context 256 --width 64 --layers 2 --heads 4
  log="runs/lm-documents-$(date +%Y%m%d-%H%M%S).h5"
else
  if [[ ! -f data/text-train.h5 || ! -f data/text-val.h5 ]]; then
    mpirun -np 1 build/autoaccum import text --out data --context 64
  fi
  config=jobs/configs/gpt-fortunes.ini
  model=runs/gpt.pt
  "$python" jobs/models/gpt.py --out "$model" --context 64 --width 64 --layers 2 --heads 4
  log="runs/lm-$(date +%Y%m%d-%H%M%S).h5"
fi
if ((prepare_only)); then
  echo "lm: the data in data/ and $model are ready; on Slurm:"
  echo "  AUTOACCUM_CONFIG=$config sbatch jobs/slurm/train.sbatch"
  exit 0
fi
train_locally "$ranks" "$log" --config "$config" "${steps[@]}" "$@"
