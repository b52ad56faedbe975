#!/usr/bin/env bash
# A Hugging Face transformers model trained by autoaccum and written back as a transformers
# folder (docs/models.md, "From Hugging Face"). Default: a GPT-2 architecture (4 layers x 128,
# random weights, a byte-level BPE tokenizer of 1024 ids learnt from the corpus) on Debian's
# fortunes, one document per fortune, 2 ranks under a memory limit with the automatic token
# budget, with the settings of the Slurm job (jobs/configs/hf-fortunes.ini); then `hf.py import`
# writes runs/hf-<date>-trained/, which from_pretrained loads. Ctrl-C or SIGTERM: a checkpoint,
# then exit 4.
#   ./jobs/hf.sh [--from FOLDER] [-n RANKS] [--steps N] [extra train options...]
#       --from FOLDER   fine-tune a model you have on disk (save_pretrained's folder, with its
#                       tokenizer); the fortunes are tokenized by its tokenizer
#   ./jobs/hf.sh --prepare [--from FOLDER]   only the data and runs/hf.pt, for the Slurm job:
#       AUTOACCUM_CONFIG=jobs/configs/hf-fortunes.ini sbatch jobs/slurm/train.sbatch
#       jobs/models/hf.py import --checkpoint runs/JOBID.ckpt.h5 --model-file runs/hf.pt \
#           --out runs/JOBID-trained
set -euo pipefail
cd "$(dirname "$0")/.."
source jobs/lib/common.sh

ranks=2
steps=()
prepare_only=0
from=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    -n|--ranks) ranks="$2"; shift 2 ;;
    --steps) steps=(--steps "$2"); shift 2 ;;
    --prepare) prepare_only=1; shift ;;
    --from) from="$2"; shift 2 ;;
    -h|--help) print_help "$0"; exit 0 ;;
    *) break ;;
  esac
done

build_autoaccum
./jobs/models/hf-env.sh >/dev/null
hf=jobs/models/hf.py

# The corpus as documents of bytes (what `autoaccum import text` writes); the model's tokenizer
# turns each into its own tokens.
if [[ ! -f data/text-docs-train.h5 || ! -f data/text-docs-val.h5 ]]; then
  build/autoaccum import text --out data --documents fortune --max-length 256
fi
mkdir -p runs
if [[ -z $from ]]; then
  from=runs/hf-gpt2
  if [[ ! -f $from/config.json ]]; then
    "$hf" tiny --arch gpt2 --out "$from" --vocab 1024 --context 256 --width 128 --layers 4 \
      --heads 4 --dropout 0.1 --tokenizer-from data/text-docs-train.h5
  fi
fi
context=$(/usr/bin/python3 -c 'import json, sys; c = json.load(open(sys.argv[1]))
print(c.get("n_positions") or c.get("max_position_embeddings") or 0)' "$from/config.json")
"$hf" tokenize --from "$from" --documents data/text-docs-train.h5 --out data/hf-docs-train.h5 \
  --max-length "$context"
"$hf" tokenize --from "$from" --documents data/text-docs-val.h5 --out data/hf-docs-val.h5 \
  --max-length "$context"
model=runs/hf.pt
"$hf" export --from "$from" --out "$model"
if ((prepare_only)); then
  echo "hf: data/hf-docs-train.h5, data/hf-docs-val.h5 and $model are ready; on Slurm:"
  echo "  AUTOACCUM_CONFIG=jobs/configs/hf-fortunes.ini sbatch jobs/slurm/train.sbatch"
  echo "then: $hf import --checkpoint runs/JOBID.ckpt.h5 --model-file $model --out runs/JOBID-trained"
  exit 0
fi

log="runs/hf-$(date +%Y%m%d-%H%M%S).h5"
train_locally "$ranks" "$log" --config jobs/configs/hf-fortunes.ini "${steps[@]}" "$@"
"$hf" import --checkpoint "${log%.h5}.ckpt.h5" --model-file "$model" --out "${log%.h5}-trained"
echo "hf: load it with transformers.AutoModelForCausalLM.from_pretrained('${log%.h5}-trained')"
