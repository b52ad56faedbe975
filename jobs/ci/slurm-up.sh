#!/usr/bin/env bash
# Starts a Slurm cluster on this machine for the tests (as root, no systemd): munged with its own
# key and socket, slurmctld and slurmd with a generated slurm.conf.
#   jobs/ci/slurm-up.sh [STATE_DIR]              one node, this host (default: build/slurm)
#   jobs/ci/slurm-up.sh --nodes N [STATE_DIR]    N simulated nodes (N <= 4; default: build/slurm-N)
# Prints the export line for SLURM_CONF; stop it with jobs/ci/slurm-down.sh [STATE_DIR].
#
# With --nodes, each node is a network, UTS and mount namespace of its own: host name nodeI,
# address 10.99.0.(I+1) on a veth pair whose outer end (aa-vI) joins the bridge aa-br0
# (10.99.0.1) in the root namespace, where slurmctld runs. Every node sees the same file system
# except its own PMIx client folder. Cutting a node's link is `ip link set aa-vI down`.
# Commands run from the root namespace (srun, sbatch) need SLURM_SRUN_COMM_IFHN=10.99.0.1, which
# the export line sets too.
set -euo pipefail
cd "$(dirname "$0")/../.."
nodes=0
if [[ ${1:-} == --nodes ]]; then
  nodes=${2:?slurm-up: --nodes needs a number}
  shift 2
  [[ $nodes =~ ^[1-4]$ ]] || { echo "slurm-up: --nodes must be 1 to 4 (got '$nodes')" >&2; exit 1; }
fi
default=build/slurm
[[ $nodes -gt 0 ]] && default=build/slurm-$nodes
dir=$(realpath -m "${1:-$default}")
for tool in munged mungekey slurmctld slurmd sinfo; do
  command -v "$tool" >/dev/null || { echo "slurm-up: $tool missing (apt-get install slurmctld slurmd slurm-client munge)" >&2; exit 1; }
done
if [[ $nodes -gt 0 ]]; then
  for tool in ip nsenter unshare; do
    command -v "$tool" >/dev/null || { echo "slurm-up: $tool missing (apt-get install iproute2 util-linux)" >&2; exit 1; }
  done
fi
[[ $(id -u) -eq 0 ]] || { echo "slurm-up: must run as root" >&2; exit 1; }
"$(dirname "$0")/slurm-down.sh" "$dir" >/dev/null 2>&1 || true
rm -rf "$dir"
mkdir -p "$dir"/{state,spool,log,munge}
# A start that fails half-way stops what it started (the caller never calls slurm-down then).
trap '"$(dirname "$0")/slurm-down.sh" "$dir" >/dev/null 2>&1' ERR
chmod 0755 "$dir" "$dir/munge"  # munge's socket folder must be searchable by all

# munge: its own key, socket, pid and log, running as user munge.
mungekey --create --keyfile="$dir/munge/munge.key" --force
chown -R munge:munge "$dir/munge"
chmod 0400 "$dir/munge/munge.key"
runuser -u munge -- munged --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
  --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" \
  --seed-file="$dir/munge/munged.seed"

host=$(hostname -s)
# Ports of their own, so that a one-node and a many-node cluster can run side by side (ctest -j).
ports="SlurmctldPort=16817
SlurmdPort=16818"
if [[ $nodes -eq 0 ]]; then
  controller="${host}(127.0.0.1)"
  node_lines=$(slurmd -C | head -1 | sed -E 's/RealMemory=[0-9]+/RealMemory=1024/; s/^(NodeName=[^ ]+)/\1 NodeAddr=127.0.0.1/')
  per_node="SlurmdSpoolDir=$dir/spool
SlurmdPidFile=$dir/slurmd.pid
SlurmdLogFile=$dir/log/slurmd.log"
else
  # The namespaces and links, recorded first so that slurm-down.sh removes what exists.
  echo "$nodes" > "$dir/nodes"
  # Leftovers of a cluster whose state folder is gone (the names are fixed).
  for i in 1 2 3 4; do
    ip link del "aa-v$i" 2>/dev/null || true
    ip netns del "aa-node$i" 2>/dev/null || true
  done
  ip link del aa-br0 2>/dev/null || true
  controller="${host}(10.99.0.1)"
  # KillWait: how long srun waits for a step's tasks on a node it cannot reach before giving up
  # (default 30 s); SlurmdTimeout: how long a silent node stays up (default 300 s: a step whose
  # tasks there never report, as after a cut link, ends only then). Short ones keep the tests
  # that cut a node's link short.
  ports="SlurmctldPort=16827
SlurmdPort=16828
KillWait=10
SlurmdTimeout=10"
  ip link add aa-br0 type bridge
  ip addr add 10.99.0.1/24 dev aa-br0
  ip link set aa-br0 up
  node_lines=""
  cpus=$(nproc)
  for i in $(seq 1 "$nodes"); do
    ip netns add "aa-node$i"
    ip link add "aa-v$i" type veth peer name "aa-p$i"
    ip link set "aa-p$i" netns "aa-node$i"
    ip link set "aa-v$i" master aa-br0 up
    ip -n "aa-node$i" link set lo up
    ip -n "aa-node$i" addr add "10.99.0.$((i + 1))/24" dev "aa-p$i"
    ip -n "aa-node$i" link set "aa-p$i" up
    mkdir -p "$dir/spool/node$i" "$dir/pmix/node$i"
    node_lines+="NodeName=node$i NodeAddr=10.99.0.$((i + 1)) CPUs=$cpus RealMemory=1024 State=UNKNOWN"$'\n'
  done
  mkdir -p "$dir/pmixtmp"
  per_node="SlurmdSpoolDir=$dir/spool/%n
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmdLogFile=$dir/log/slurmd-%n.log"
  # Every node's PMIx clients get their own folder (one shared path, bind-mounted per node).
  echo "PMIxCliTmpDirBase=$dir/pmixtmp" > "$dir/mpi.conf"
fi
# Job ids of their own: every cluster's would start at 1, so its PMIx namespaces (and Open MPI's
# job ids, derived from them) would repeat an earlier cluster's; a leftover process of that
# cluster could then pass for a peer of a new job.
first_job=$(( ($(date +%s) % 100000) * 100 + 1000 ))
cat > "$dir/slurm.conf" <<CONF
ClusterName=autoaccum-ci
FirstJobId=$first_job
SlurmctldHost=$controller
$ports
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/state
$per_node
SlurmctldPidFile=$dir/slurmctld.pid
SlurmctldLogFile=$dir/log/slurmctld.log
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
$node_lines
PartitionName=ci Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF

export SLURM_CONF="$dir/slurm.conf"
slurmctld -f "$SLURM_CONF"
if [[ $nodes -eq 0 ]]; then
  slurmd -f "$SLURM_CONF"
  exports="export SLURM_CONF=$SLURM_CONF"
else
  # Not `ip netns exec`: it remounts /sys without the cgroup mounts, and slurmd then stops.
  for i in $(seq 1 "$nodes"); do
    nsenter --net="/var/run/netns/aa-node$i" unshare --uts --mount --propagation private \
      bash -c "hostname node$i && mount --bind '$dir/pmix/node$i' '$dir/pmixtmp' &&
               exec slurmd -f '$SLURM_CONF' -N node$i"
  done
  exports="export SLURM_CONF=$SLURM_CONF SLURM_SRUN_COMM_IFHN=10.99.0.1"
fi
want=$((nodes > 0 ? nodes : 1))
for _ in $(seq 1 100); do
  idle=$(sinfo -h -N -o %t 2>/dev/null | grep -c '^idle' || true)
  [[ $idle -eq $want ]] && { echo "$exports"; exit 0; }
  sleep 0.2
done
echo "slurm-up: $idle of $want node(s) became idle; logs in $dir/log" >&2
sinfo -N >&2 || true
"$(dirname "$0")/slurm-down.sh" "$dir" >/dev/null 2>&1
exit 1
