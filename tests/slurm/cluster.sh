# A one-node Slurm cluster under a temp dir, for tests (Debian slurm-wlm 22.05; no munge: auth/none).
# Source it, then: slurm_cluster_start DIR  (writes DIR/slurm.conf, starts slurmctld + slurmd, exports
# SLURM_CONF, waits for the node to be idle) and slurm_cluster_stop DIR (stops both by their pid files).
# The configuration is the one of ../shared/docs/machines.md ("A real Slurm on one machine").

slurm_cluster_start() {  # DIR [CPUS]
  local dir="$1" cpus="${2:-$(nproc)}" host
  host="$(hostname -s)"  # slurmd finds its NodeName by the short host name
  mkdir -p "$dir/state" "$dir/spool" "$dir/log"
  cat >"$dir/slurm.conf" <<CONF
ClusterName=aerietest
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
SchedulerType=sched/backfill
SlurmctldPort=$((17000 + RANDOM % 2000))
SlurmdPort=$((19000 + RANDOM % 2000))
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ReturnToService=2
JobRequeue=1
KillWait=30
MinJobAge=600
InactiveLimit=0
SchedulerParameters=defer_batch
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
  export SLURM_CONF="$dir/slurm.conf"
  slurmctld -f "$SLURM_CONF" || return 1
  slurmd -f "$SLURM_CONF" || return 1
  local i
  for i in $(seq 100); do
    if sinfo -h -o '%T' 2>/dev/null | grep -qx idle; then return 0; fi
    sleep 0.2
  done
  echo "slurm_cluster_start: the node did not become idle; sinfo:" >&2
  sinfo >&2 || true
  return 1
}

slurm_cluster_stop() {  # DIR
  local dir="$1" f pid i
  for f in "$dir/slurmd.pid" "$dir/slurmctld.pid"; do
    [ -f "$f" ] || continue
    pid="$(cat "$f")"
    [ -n "$pid" ] || continue
    kill -TERM "$pid" 2>/dev/null || continue
    for i in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
}
