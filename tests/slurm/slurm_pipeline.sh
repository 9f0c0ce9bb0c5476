#!/usr/bin/env bash
# The aerie pipeline on a real one-node Slurm cluster, preempted twice, gives the export of an
# uninterrupted run bit for bit.
#  1. reference: prepare -> extract -> vocab -> train -> export with plain mpirun -np 2;
#  2. starts slurmctld + slurmd under WORK_DIR (tests/slurm/cluster.sh; stopped by a trap on any exit) and
#     submits the same pipeline with slurm/submit (configs/slurm/cpu-1node.ini, 2 tasks);
#  3. extract: once its first shard exists, `scancel --signal=USR1` (Slurm's --signal warning): the ranks
#     close their shards and exit 3, slurm/step.sh runs `scontrol requeue`, the restarted job skips the
#     complete shards;
#  4. train: after its first checkpoint, `scontrol requeue` (Slurm-side preemption: SIGTERM to the ranks,
#     which checkpoint and exit), the restarted job resumes from the latest complete checkpoint;
#  5. both jobs restarted once, the chain finished, export/model.safetensors == the reference (cmp);
#  6. streaming (slurm/submit stream=1: prepare -> vocab -> train with the target on rank 0 -> export),
#     train requeued after its first checkpoint: export bitwise equal to a plain mpirun streaming run.
# usage: slurm_pipeline.sh AERIE_BINARY MODEL_DIR STORIES_TXT WORK_DIR
# Exits 77 (CTest: skipped) without slurmctld or the converted model.
set -euo pipefail
aerie="$(realpath "$1")"; model="$(realpath "$2")"; text="$(realpath "$3")"; work="$4"
root="$(cd "$(dirname "$0")/../.." && pwd)"
command -v slurmctld >/dev/null || { echo "slurmctld not installed: skipped"; exit 77; }
[ "$(id -u)" = 0 ] || { echo "slurmd needs root (SlurmUser=root): skipped"; exit 77; }
# Nothing of an outer Slurm job (when the test itself runs under Slurm) may leak into this cluster.
while read -r v; do unset "$v"; done < <(compgen -e | grep '^SLURM_' || true)
[ -f "$model/config.json" ] || { echo "no converted model at $model: skipped"; exit 77; }
rm -rf "$work"; mkdir -p "$work"; work="$(cd "$work" && pwd)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS=1
t0=$(date +%s)
log="$work/log.txt"
say() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a "$log"; }
fail() {
  say "FAIL: $*"
  for f in "$work"/run/slurm/*.out; do [ -f "$f" ] && { echo "== $f"; tail -25 "$f"; }; done
  [ -n "${SLURM_CONF:-}" ] && squeue -a 2>/dev/null || true
  exit 1
}

# The pipeline's settings, the same for both runs (a tiny version of tools/demo).
prepare_args=(--format text --template plain --max-length 64 --overlong truncate --max-samples 1024)
extract_args=(--samples-per-shard 8)
vocab_args=(--draft-vocab-size 256)
train_args=(--steps 240 --batch-size 4 --lr 3e-3 --checkpoint-every 20 --log-every 20 --seed 0)

# --- 1. reference ---------------------------------------------------------------------------------------
ref="$work/ref"
mkdir -p "$ref"
mp() { mpirun --oversubscribe -np "$1" "$aerie" "${@:2}" >>"$ref/log.txt" 2>&1 || fail "reference: aerie $2"; }
mp 2 prepare --input "$text" --tokenizer "$model" --output "$ref/prepared.h5" "${prepare_args[@]}"
mp 2 extract --model "$model" --prepared "$ref/prepared.h5" --output "$ref/shards" --tp 1 "${extract_args[@]}"
mp 1 vocab --prepared "$ref/prepared.h5" --model "$model" --output "$ref/draft_vocab.safetensors" "${vocab_args[@]}"
mp 2 train --model "$model" --shards "$ref/shards" --vocab "$ref/draft_vocab.safetensors" --output "$ref/train" \
  "${train_args[@]}"
mp 1 export --checkpoint "$ref/train" --model "$model" --output "$ref/export"
say "reference run done"

# --- 2. cluster and submission ----------------------------------------------------------------------------
# The cluster's state and spool live under a short /tmp path: slurmd's spool holds UNIX sockets, whose
# path must stay under 108 bytes. Stopped and removed on any exit.
source "$root/tests/slurm/cluster.sh"
cluster="$(mktemp -d /tmp/aerie-slurm.XXXXXX)"
trap 'slurm_cluster_stop "$cluster"; cp -r "$cluster/log" "$work/slurm-log" 2>/dev/null; rm -rf "$cluster"' EXIT
slurm_cluster_start "$cluster" 2 || fail "could not start slurmctld/slurmd (logs in $work/slurm-log)"
say "cluster up: $(sinfo -h -o '%N %T %c CPUs')"

run="$work/run"
"$root/slurm/submit" "$root/configs/slurm/cpu-1node.ini" output="$run" model="$model" input="$text" \
  aerie="$aerie" job-configs= jobs=prepare,extract,vocab,train,export \
  prepare-args="${prepare_args[*]}" extract-args="${extract_args[*]}" vocab-args="${vocab_args[*]}" \
  train-args="${train_args[*]}" >>"$log" 2>&1 || fail "slurm/submit"
jobid() { awk -v j="$1" '$1 == j {print $2}' "$run/slurm/jobs.txt" | tail -1; }
ext=$(jobid extract); trn=$(jobid train); exp=$(jobid export)
say "submitted: $(tr '\n' ' ' <"$run/slurm/jobs.txt")"

field() { scontrol -o show job "$1" | tr ' ' '\n' | awk -F= -v k="$2" '$1 == k {print $2}'; }
state() { field "$1" JobState; }
wait_for() {  # DESCRIPTION SECONDS COMMAND...: polls COMMAND every 0.1 s
  local what="$1" secs="$2" i; shift 2
  for ((i = 0; i < secs * 10; ++i)); do "$@" && return 0; sleep 0.1; done
  fail "timed out after $secs s waiting for $what"
}
has_shard() { compgen -G "$run/shards/shard-*.h5" >/dev/null; }
has_ckpt() { [ -f "$run/train/checkpoints/step-00000020/DONE" ]; }
running() { [ "$(state "$1")" = RUNNING ]; }
requeued() { [ "$(field "$1" Restarts)" -ge 1 ] && [[ "$(state "$1")" =~ ^(PENDING|RUNNING|COMPLETED)$ ]]; }
finished() { case "$(state "$1")" in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY) return 0 ;; esac; return 1; }
# A requeued job waits for a begin time Slurm sets ~2 minutes in the future; start it sooner, but not
# within the second of the requeue: slurmd refuses to launch a job whose credential is not newer than the
# revocation of the previous run's ("Job credential revoked", the job then ends FAILED).
restart() {
  wait_for "job $1 to be requeued" 60 requeued "$1"
  sleep 3
  [ "$(state "$1")" != PENDING ] || scontrol update jobid="$1" starttime=now || fail "could not release job $1"
}

# --- 3. extract: warning signal, the batch script requeues --------------------------------------------------
wait_for "the first shard" 120 has_shard
running "$ext" || fail "extract job $ext is not running when its first shard exists"
scancel --signal=USR1 "$ext"
say "extract job $ext: USR1 sent with $(compgen -G "$run/shards/shard-*.h5" | wc -l) shard(s) written"
restart "$ext"
say "extract job $ext requeued ($(compgen -G "$run/shards/shard-*.h5" | wc -l) shards kept), started again"

# --- 4. train: requeued by Slurm ------------------------------------------------------------------------
wait_for "the first train checkpoint" 120 has_ckpt
running "$trn" || fail "train job $trn is not running when its first checkpoint exists"
scontrol requeue "$trn"
say "train job $trn: scontrol requeue"
restart "$trn"
say "train job $trn requeued, started again"

# --- 5. the end of the chain and the checks -----------------------------------------------------------------
wait_for "the export job" 150 finished "$exp"
for j in $(awk '{print $2}' "$run/slurm/jobs.txt"); do
  [ "$(state "$j")" = COMPLETED ] || fail "job $j ended $(state "$j") (exit $(field "$j" ExitCode))"
done
[ "$(field "$ext" Restarts)" = 1 ] && [ "$(field "$trn" Restarts)" = 1 ] || fail "extract/train not restarted once"
grep -q "stopped by a signal" "$run"/slurm/aerie-extract-"$ext".out || fail "extract did not stop on USR1"
grep -q "requeueing job $ext" "$run"/slurm/aerie-extract-"$ext".out || fail "step.sh did not requeue extract"
grep -Eq "[1-9][0-9]* already done" "$run"/slurm/aerie-extract-"$ext".out || fail "extract did not skip shards"
grep -q "resuming from" "$run"/slurm/aerie-train-"$trn".out || fail "train did not resume"
cmp "$ref/export/model.safetensors" "$run/export/model.safetensors" || fail "the exports differ"
for f in "$ref"/shards/shard-*.h5; do cmp "$f" "$run/shards/$(basename "$f")" || fail "$(basename "$f") differs"; done
say "offline pipeline passed"

# --- 6. streaming (slurm/submit stream=1): no extract job; the train job's rank 0 runs the target, rank 1
# trains; requeued after its first checkpoint; export bitwise equal to a plain mpirun streaming run ---------
mp 2 train --target-model "$model" --prepared "$ref/prepared.h5" --target-ranks 1 \
  --vocab "$ref/draft_vocab.safetensors" --output "$ref/train_stream" "${train_args[@]}"
mp 1 export --checkpoint "$ref/train_stream" --model "$model" --output "$ref/export_stream"
run2="$work/run_stream"
"$root/slurm/submit" "$root/configs/slurm/cpu-1node.ini" output="$run2" model="$model" input="$text" \
  aerie="$aerie" job-configs= jobs=prepare,vocab,train,export stream=1 target-ranks=1 \
  prepare-args="${prepare_args[*]}" vocab-args="${vocab_args[*]}" train-args="${train_args[*]}" >>"$log" 2>&1 \
  || fail "slurm/submit stream=1"
run="$run2"  # has_ckpt and jobid read $run
trn=$(jobid train); exp=$(jobid export)
[ -z "$(jobid extract)" ] || fail "stream=1 submitted an extract job"
wait_for "the first streaming train checkpoint" 120 has_ckpt
running "$trn" || fail "streaming train job $trn is not running when its first checkpoint exists"
scontrol requeue "$trn"
say "streaming train job $trn: scontrol requeue"
restart "$trn"
wait_for "the streaming export job" 150 finished "$exp"
for j in $(awk '{print $2}' "$run2/slurm/jobs.txt"); do
  [ "$(state "$j")" = COMPLETED ] || fail "job $j ended $(state "$j") (exit $(field "$j" ExitCode))"
done
grep -q "resuming from" "$run2"/slurm/aerie-train-"$trn".out || fail "streaming train did not resume"
grep -q "train (target): done at step" "$run2"/slurm/aerie-train-"$trn".out || fail "the target rank did not end cleanly"
[ ! -d "$run2/shards" ] || fail "streaming wrote shards"
cmp "$ref/export_stream/model.safetensors" "$run2/export/model.safetensors" || fail "the streaming exports differ"
say "PASS: extract (USR1, requeued by the batch script) and train (scontrol requeue) resumed; export bitwise equal; streaming train (stream=1) requeued and resumed, export bitwise equal"
