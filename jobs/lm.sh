#!/usr/bin/env bash
# A byte-level GPT on Debian's fortunes: imports the text into data/ (x uint8 token ids, y int64
# [N, T]), writes the model with jobs/models/gpt.py, and trains it on 2 ranks under a memory limit
# that makes the automatic search halve the micro-batch. The loss is cross-entropy per byte over every token of
# the global batch; the run log goes to runs/. Default run: about 6 minutes on 2 cores
# (docs/models.md has its result).
#   ./jobs/lm.sh [-n RANKS] [--steps N] [extra train options...]
#   ./jobs/lm.sh --documents   one document per fortune (up to 256 bytes each, of every length):
#                              micro-batches are token budgets that halve under the memory limit
#   ./jobs/lm.sh --prepare     only the data and the model, for the Slurm job:
#                              AUTOACCUM_CONFIG=jobs/configs/gpt-fortunes.ini sbatch jobs/slurm/train.sbatch
set -euo pipefail
cd "$(dirname "$0")/.."

ranks=2
steps=5000
prepare_only=0
documents=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    -n|--ranks) ranks="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --prepare) prepare_only=1; shift ;;
    --documents) documents=1; shift ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) break ;;
  esac
done

./jobs/setup.sh
cmake --preset default >/dev/null
cmake --build --preset default -j "$(nproc 2>/dev/null || echo 2)" --target autoaccum

if [[ $(id -u) -eq 0 ]]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
python=/usr/bin/python3
[[ -x $python ]] || python=python3

if ((documents)); then
  if [[ ! -f data/text-docs-train.h5 || ! -f data/text-docs-val.h5 ]]; then
    build/autoaccum import text --out data --documents fortune --max-length 256
  fi
  mkdir -p runs
  model=runs/gpt-documents.pt
  "$python" jobs/models/gpt.py --out "$model" --context 256 --width 64 --layers 2 --heads 4
  log="runs/lm-documents-$(date +%Y%m%d-%H%M%S).h5"
  mpirun --oversubscribe -np "$ranks" build/autoaccum train \
    --data data/text-docs-train.h5 --val-data data/text-docs-val.h5 --model-file "$model" \
    --global-batch 64 --steps "$steps" --optimizer adamw --lr 0.003 --weight-decay 0.01 \
    --schedule cosine --warmup-steps 50 --memory-limit 48MiB --eval-every 1000 --log-every 100 \
    --micro-batch-cost auto \
    --run-log "$log" --checkpoint "${log%.h5}.ckpt.h5" "$@"
  build/autoaccum log "$log"
  exit 0
fi

if [[ ! -f data/text-train.h5 || ! -f data/text-val.h5 ]]; then
  mpirun -np 1 build/autoaccum import text --out data --context 64
fi
mkdir -p runs
model=runs/gpt.pt
"$python" jobs/models/gpt.py --out "$model" --context 64 --width 64 --layers 2 --heads 4
if ((prepare_only)); then
  echo "lm: data/text-train.h5, data/text-val.h5 and $model are ready; on Slurm:"
  echo "  AUTOACCUM_CONFIG=jobs/configs/gpt-fortunes.ini sbatch jobs/slurm/train.sbatch"
  exit 0
fi

log="runs/lm-$(date +%Y%m%d-%H%M%S).h5"
mpirun --oversubscribe -np "$ranks" build/autoaccum train \
  --data data/text-train.h5 --val-data data/text-val.h5 --model-file "$model" \
  --global-batch 64 --steps "$steps" --optimizer adamw --lr 0.003 --weight-decay 0.01 \
  --schedule cosine --warmup-steps 50 --memory-limit 24MiB --eval-every 1000 --log-every 100 \
  --run-log "$log" --checkpoint "${log%.h5}.ckpt.h5" "$@"
build/autoaccum log "$log"
