#!/usr/bin/env bash
# Workstation run: installs what is missing, builds, imports Fashion-MNIST into data/, and trains
# the cnn under mpirun with automatic micro-batching. The per-rank memory limit is low enough
# that a rank's share does not fit: the memory model predicts what does and the run accumulates
# (add --micro-batch-search halve to watch it halve instead); the run log goes to runs/ and is
# summarised at the end.
#   ./jobs/local.sh [-n RANKS] [extra train options...]
set -euo pipefail
cd "$(dirname "$0")/.."

ranks=2
while [[ $# -gt 0 ]]; do
  case "$1" in
    -n|--ranks) ranks="$2"; shift 2 ;;
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) break ;;
  esac
done

./jobs/setup.sh
cmake --preset default >/dev/null
cmake --build --preset default -j "$(nproc 2>/dev/null || echo 2)" --target autoaccum

if [[ $(id -u) -eq 0 ]]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
mpi=(mpirun --oversubscribe -np "$ranks")

if [[ ! -f data/fashion-mnist-train.h5 || ! -f data/fashion-mnist-test.h5 ]]; then
  build/autoaccum import fashion-mnist --out data
fi

mkdir -p runs
log="runs/local-$(date +%Y%m%d-%H%M%S).h5"
echo "+ ${mpi[*]} build/autoaccum train ... (Ctrl-C or SIGTERM: checkpoint, then exit 4)"
"${mpi[@]}" build/autoaccum train \
  --data data/fashion-mnist-train.h5 --val-data data/fashion-mnist-test.h5 \
  --model cnn --global-batch 256 --epochs 3 --lr 0.05 --schedule cosine --warmup-steps 50 \
  --memory-limit 12MiB --eval-every 234 --log-every 50 \
  --run-log "$log" --checkpoint "${log%.h5}.ckpt.h5" "$@" &
job=$!
# mpirun forwards SIGUSR1 to the ranks and returns their exit code; SIGTERM or SIGINT sent to
# mpirun itself would end it with code 1. So this script takes those and passes on SIGUSR1.
trap 'echo "local.sh: stopping: the ranks write a checkpoint at the next step"; kill -USR1 $job' TERM INT
rc=0
wait "$job" || rc=$?
while kill -0 "$job" 2>/dev/null; do  # wait returns early when a trapped signal arrives
  rc=0
  wait "$job" || rc=$?
done
if [[ $rc -ne 0 ]]; then
  echo "local.sh: training ended with exit code $rc (4: stopped after a checkpoint; resume with --resume)"
  [[ -f $log ]] && build/autoaccum log "$log" | tail -3
  exit "$rc"
fi
echo
build/autoaccum log "$log"
echo "plot it: jobs/plot-run.py $log -o ${log%.h5}.png"
