# Sourced by the slurm/*.sbatch scripts: runs one aerie job as a Slurm job step and answers preemption.
#
#   aerie_step JOB [AERIE OPTIONS...]
#
# One task per rank (per GPU on a GPU cluster): `srun --mpi=pmix` starts $SLURM_NTASKS ranks, in block
# order (consecutive ranks on one node, so tensor-parallel groups of consecutive ranks stay inside a node).
# The aerie binary: $AERIE_BIN, else $AERIE_ROOT/build/aerie (AERIE_ROOT: the checkout; slurm/submit sets
# both and sbatch passes the environment on).
#
# Preemption (docs/slurm.md): the job scripts ask for `--signal=USR1@SECS` (sent to the job step's tasks,
# not to this shell) and `--requeue`. On SIGUSR1 or SIGTERM every rank finishes its unit of work (train:
# the current step, then a checkpoint; extract: the shards in hand) and exits with status 3. This function
# then runs `scontrol requeue $SLURM_JOB_ID`: the job goes back to the queue (jobs depending on it with
# afterok keep waiting) and, when it starts again, the same command resumes (train from the latest
# complete checkpoint, extract skips complete shards).
# A job that Slurm itself requeues (`scontrol requeue`, preemption with PreemptMode=REQUEUE, node failure)
# gets SIGTERM: the ranks checkpoint and exit the same way, and Slurm restarts the script.

aerie_step() {
  local job="$1"
  shift
  local root="${AERIE_ROOT:-${SLURM_SUBMIT_DIR:-.}}"
  local bin="${AERIE_BIN:-$root/build/aerie}"
  local preempted=3  # the exit status of an aerie job stopped by a signal (jobs/train.cc, jobs/extract.cc)
  [ -x "$bin" ] || { echo "aerie_step: no aerie binary at $bin (set AERIE_BIN or AERIE_ROOT)" >&2; return 1; }
  export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
  echo "aerie_step: $(date -u +%FT%TZ) job ${SLURM_JOB_ID:-?} ($job) start $((${SLURM_RESTART_COUNT:-0} + 1))," \
       "${SLURM_NTASKS:-?} task(s) on ${SLURM_JOB_NODELIST:-?}: aerie $job $*"
  local rc=0
  # The job's --cpus-per-task, passed on: srun of Slurm 22.05 and later does not inherit it from sbatch, and a rank
  # held to one core runs its shard reader / writer threads on the core that launches its kernels.
  local cpus=()
  [ -n "${SLURM_CPUS_PER_TASK:-}" ] && cpus=(--cpus-per-task="$SLURM_CPUS_PER_TASK")
  srun --mpi=pmix --distribution=block --kill-on-bad-exit=0 "${cpus[@]}" "$bin" "$job" "$@" || rc=$?
  if [ "$rc" -eq "$preempted" ]; then
    echo "aerie_step: $(date -u +%FT%TZ) aerie $job stopped by a signal (status $rc), state saved; requeueing" \
         "job $SLURM_JOB_ID"
    # Requeue only once the step has ended on every node: a step still cleaning up (its PMIx server socket
    # in slurmd's spool) makes the restarted job's step fail to launch (seen with slurm-wlm 22.05).
    local i
    for i in $(seq 60); do
      squeue -h -s -j "$SLURM_JOB_ID" -o %i 2>/dev/null | grep -Eq "^$SLURM_JOB_ID\.[0-9]+\$" || break
      sleep 1
    done
    scontrol requeue "$SLURM_JOB_ID"
    # Slurm now ends this script; should it not, end as a failure, so that no dependent job starts.
    sleep 30
    return "$rc"
  fi
  echo "aerie_step: $(date -u +%FT%TZ) aerie $job finished with status $rc"
  return "$rc"
}
