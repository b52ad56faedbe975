# What the workstation job scripts (local.sh, lm.sh, hf.sh) share; sourced, not run.

# --help: the script's leading comment, without the code after it.
print_help() {
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$1"
}

# Installs what is missing and builds the binary.
build_autoaccum() {
  ./jobs/setup.sh
  cmake --preset default >/dev/null
  cmake --build --preset default -j "$(nproc 2>/dev/null || echo 2)" --target autoaccum
  if [[ $(id -u) -eq 0 ]]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  fi
}

# train_locally RANKS LOG [train options...]: `autoaccum train` under mpirun with LOG as its run
# log and LOG's .ckpt.h5 as its checkpoint, then the log's summary. Ctrl-C or SIGTERM asks the
# ranks for a checkpoint (they stop before their next micro-batch and exit 4): mpirun forwards
# SIGUSR1 to the ranks, while SIGTERM or SIGINT sent to mpirun itself would end it with code 1.
# Returns the training's exit code.
train_locally() {
  local ranks=$1 log=$2
  shift 2
  echo "+ mpirun -np $ranks build/autoaccum train $* --run-log $log --checkpoint ${log%.h5}.ckpt.h5"
  echo "  (Ctrl-C or SIGTERM: checkpoint, then exit 4; resume with the same command and --resume)"
  mpirun --oversubscribe -np "$ranks" build/autoaccum train "$@" \
    --run-log "$log" --checkpoint "${log%.h5}.ckpt.h5" &
  local job=$!
  trap 'echo "stopping: the ranks write a checkpoint before their next micro-batch"; kill -USR1 '"$job" TERM INT
  local rc=0
  wait "$job" || rc=$?
  while kill -0 "$job" 2>/dev/null; do  # wait returns early when a trapped signal arrives
    rc=0
    wait "$job" || rc=$?
  done
  trap - TERM INT
  if [[ $rc -ne 0 ]]; then
    echo "training ended with exit code $rc (4: stopped after a checkpoint; resume with --resume)"
    [[ -f $log ]] && build/autoaccum log "$log" | tail -3
    return "$rc"
  fi
  echo
  build/autoaccum log "$log"
}
