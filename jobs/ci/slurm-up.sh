#!/usr/bin/env bash
# Starts a single-node Slurm cluster on this machine for the tests (as root, no systemd):
# munged with its own key and socket, slurmctld and slurmd with a generated slurm.conf.
#   jobs/ci/slurm-up.sh [STATE_DIR]      (default: build/slurm)
# Prints the export line for SLURM_CONF; stop it with jobs/ci/slurm-down.sh [STATE_DIR].
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=$(realpath -m "${1:-build/slurm}")
for tool in munged mungekey slurmctld slurmd sinfo; do
  command -v "$tool" >/dev/null || { echo "slurm-up: $tool missing (apt-get install slurmctld slurmd slurm-client munge)" >&2; exit 1; }
done
[[ $(id -u) -eq 0 ]] || { echo "slurm-up: must run as root" >&2; exit 1; }
"$(dirname "$0")/slurm-down.sh" "$dir" >/dev/null 2>&1 || true
rm -rf "$dir"
mkdir -p "$dir"/{state,spool,log,munge}
chmod 0755 "$dir" "$dir/munge"  # munge's socket folder must be searchable by all

# munge: its own key, socket, pid and log, running as user munge.
mungekey --create --keyfile="$dir/munge/munge.key" --force
chown -R munge:munge "$dir/munge"
chmod 0400 "$dir/munge/munge.key"
runuser -u munge -- munged --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
  --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" \
  --seed-file="$dir/munge/munged.seed"

host=$(hostname -s)
node=$(slurmd -C | head -1 | sed -E 's/RealMemory=[0-9]+/RealMemory=1024/; s/^(NodeName=[^ ]+)/\1 NodeAddr=127.0.0.1/')
cat > "$dir/slurm.conf" <<CONF
ClusterName=autoaccum-ci
SlurmctldHost=${host}(127.0.0.1)
SlurmctldPort=16817
SlurmdPort=16818
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
ReturnToService=2
JobRequeue=1
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
SchedulerType=sched/backfill
MinJobAge=600
$node
PartitionName=ci Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF

export SLURM_CONF="$dir/slurm.conf"
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF"
for _ in $(seq 1 50); do
  state=$(sinfo -h -o %t 2>/dev/null | head -1 || true)
  [[ $state == idle* ]] && { echo "export SLURM_CONF=$SLURM_CONF"; exit 0; }
  sleep 0.2
done
echo "slurm-up: the node did not become idle (state '$state'); logs in $dir/log" >&2
exit 1
