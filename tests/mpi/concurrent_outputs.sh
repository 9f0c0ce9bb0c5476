#!/usr/bin/env bash
# Output locks with real processes (issue 17, cases 1 and 2; io/output_lock.h):
#  1. two `extract` runs into one folder: the second is refused at start naming the first (host, pid), the
#     first finishes with shards byte-identical to an undisturbed run's and no lock or .tmp left;
#  2. a run killed with SIGKILL leaves its lock: the rerun takes it over as stale (its pid is gone), finishes,
#     and gives the same shards;
#  3. two `train` runs into one folder (other --lr): the second is refused, the first's metrics.jsonl holds
#     each of its steps once and its checkpoints are complete and its own;
#  4. prepare and generate: an output locked by a live process is refused naming the record's holder; a
#     record of another host is refused until --force-unlock.
# The first run of a pair is frozen (SIGSTOP on its ranks) once its lock is written, so the second one
# starts while the first certainly runs, and thawed afterwards.
# usage: concurrent_outputs.sh AERIE MODEL_DIR STORIES_TXT WORK_DIR   (exit 77: no converted model)
# PARTS="1 3" runs only those parts (default: all).
set -euo pipefail
aerie=$1 model=$2 text=$3 work=$4
[ -f "$model/config.json" ] || { echo "no converted model at $model: skipped"; exit 77; }
export OPENBLAS_NUM_THREADS=1
rm -rf "$work"
mkdir -p "$work"
log="$work/log.txt"
parts=" ${PARTS:-1 2 3 4} "
part() { [[ "$parts" == *" $1 "* ]]; }
host=$(hostname)
fail() { echo "FAIL: $*"; for f in "$work"/*.log; do echo "== $f"; tail -15 "$f"; done; exit 1; }
run() { local np=$1; shift; mpirun --oversubscribe -np "$np" "$aerie" "$@"; }

run 1 prepare --input "$text" --tokenizer "$model" --output "$work/prepared.h5" --max-length 64 --max-samples 48 \
  >>"$log" 2>&1 || fail "prepare"
run 1 vocab --prepared "$work/prepared.h5" --model "$model" --output "$work/vocab.safetensors" --draft-vocab-size 200 \
  >>"$log" 2>&1 || fail "vocab"
extract_args() { echo extract --model "$model" --prepared "$work/prepared.h5" --samples-per-shard 4 --aux-layers 1,2,4 --output "$1"; }
# shellcheck disable=SC2046
run 2 $(extract_args "$work/ref") >"$work/ref.log" 2>&1 || fail "reference extract"

# Starts `mpirun -np 2 aerie ARGS...` in the background (log $LOG) and waits until LOCKFILE holds a record
# (or, with an aerie that takes no lock, until the job has written something into the lock's folder, so
# that the test shows what happens without the lock): sets $bg (mpirun's pid) and $ranks (the ranks).
start_and_wait_for_lock() {  # LOCKFILE LOG ARGS...
  local lockfile=$1 out=$2; shift 2
  mpirun --oversubscribe -np 2 "$aerie" "$@" >"$out" 2>&1 &
  bg=$!
  for _ in $(seq 1200); do
    [ -s "$lockfile" ] && break
    [ -n "$(ls -A "$(dirname "$lockfile")" 2>/dev/null | grep -vx '.aerie.lock')" ] && break
    kill -0 "$bg" 2>/dev/null || break
    sleep 0.02
  done
  ranks=$(pgrep -P "$bg" || true)
  [ -n "$ranks" ] || fail "no ranks under mpirun $bg (the run ended before it could be frozen)"
}
pids_alternation() { echo "$ranks" | paste -sd'|'; }

# --- 1. two extract runs into one folder
if part 1; then
# shellcheck disable=SC2046
start_and_wait_for_lock "$work/shards/.aerie.lock" "$work/extract_a.log" $(extract_args "$work/shards")
kill -STOP $ranks
rc=0
# shellcheck disable=SC2046
run 2 $(extract_args "$work/shards") >"$work/extract_b.log" 2>&1 || rc=$?
kill -CONT $ranks
rc_a=0
wait "$bg" || rc_a=$?
[ "$rc" -ne 0 ] || fail "the second extract into one folder was not refused"
grep -Eq "extract: --output $work/shards is in use by another job: aerie extract on host $host, pid ($(pids_alternation))" \
  "$work/extract_b.log" || fail "the refusal does not name the first extract's host and pid"
grep -q "MPI_ABORT" "$work/extract_b.log" && fail "the refusal aborted the MPI job instead of ending it normally"
[ "$rc_a" -eq 0 ] || fail "the first extract failed (status $rc_a)"
ls "$work/shards" | grep -q '\.tmp$' && fail ".tmp files left"
[ ! -e "$work/shards/.aerie.lock" ] || fail "the lock file is left after the run"
[ "$(ls "$work/ref")" = "$(ls "$work/shards")" ] || fail "shard lists differ"
for f in "$work"/ref/shard-*.h5; do cmp "$f" "$work/shards/$(basename "$f")" || fail "$(basename "$f") differs"; done
echo "1. second extract refused; the first one's shards equal the reference" | tee -a "$log"

fi
# --- 2. a killed extract's lock is stale: the rerun takes it over
if part 2; then
# shellcheck disable=SC2046
start_and_wait_for_lock "$work/killed/.aerie.lock" "$work/killed_a.log" $(extract_args "$work/killed")
kill -KILL $ranks 2>/dev/null || true
kill -KILL "$bg" 2>/dev/null || true
wait "$bg" 2>/dev/null || true
[ -s "$work/killed/.aerie.lock" ] || fail "the killed run left no lock record (nothing to test)"
# shellcheck disable=SC2046
run 2 $(extract_args "$work/killed") >"$work/killed_b.log" 2>&1 || fail "the rerun after a kill was refused"
grep -Eq "taking over the lock $work/killed/.aerie.lock of aerie extract on host $host, pid ($(pids_alternation)).*no process [0-9]+ runs on this host" \
  "$work/killed_b.log" || fail "the rerun did not report the stale lock it took over"
for f in "$work"/ref/shard-*.h5; do cmp "$f" "$work/killed/$(basename "$f")" || fail "killed: $(basename "$f") differs"; done
[ ! -e "$work/killed/.aerie.lock" ] || fail "the lock file is left after the rerun"
echo "2. a killed extract's lock taken over as stale; shards equal the reference" | tee -a "$log"

fi
# --- 3. two train runs into one folder
if part 3; then
targs() { echo train --model "$model" --shards "$work/ref" --vocab "$work/vocab.safetensors" --output "$work/run" \
  --steps 40 --batch-size 4 --checkpoint-every 10 --log-every 5 --seed 1 --lr "$1"; }
# shellcheck disable=SC2046
start_and_wait_for_lock "$work/run/.aerie.lock" "$work/train_a.log" $(targs 1e-3)
kill -STOP $ranks
rc=0
# shellcheck disable=SC2046
run 2 $(targs 3e-3) >"$work/train_b.log" 2>&1 || rc=$?
kill -CONT $ranks
rc_a=0
wait "$bg" || rc_a=$?
[ "$rc" -ne 0 ] || fail "the second train into one folder was not refused"
grep -Eq "train: --output $work/run is in use by another job: aerie train on host $host, pid ($(pids_alternation))" \
  "$work/train_b.log" || fail "the train refusal does not name the first run"
[ "$rc_a" -eq 0 ] || fail "the first train failed (status $rc_a)"
steps=$(python3 -c "import json,sys; print(' '.join(str(json.loads(l)['step']) for l in open(sys.argv[1])))" "$work/run/metrics.jsonl")
[ "$steps" = "5 10 15 20 25 30 35 40" ] || fail "metrics.jsonl steps: $steps"
for s in 10 20 30 40; do
  d=$(printf '%s/run/checkpoints/step-%08d' "$work" "$s")
  for f in DONE draft.safetensors optimizer.safetensors state.json config.json; do [ -f "$d/$f" ] || fail "$d/$f missing"; done
  python3 -c "import json,sys; assert json.load(open(sys.argv[1]))['train']['lr'] == 1e-3" "$d/config.json" \
    || fail "$d holds another run's options"
done
[ ! -e "$work/run/.aerie.lock" ] || fail "the train lock file is left after the run"
echo "3. second train refused; the first one's metrics and checkpoints are its own" | tee -a "$log"

fi
# --- 4. prepare and generate: a held lock, then a record of another host (--force-unlock)
if part 4; then
record() {  # JOB HOST
  echo "{\"format\": \"aerie.output_lock\", \"job\": \"$1\", \"host\": \"$2\", \"pid\": 4321, \"slurm_job_id\": \"99\", \"started\": \"2025-01-01 00:00:00 UTC\"}"
}
printf '%s\n' '{"conversations": [{"from": "human", "value": "Tom had a red ball."}]}' \
  '{"conversations": [{"from": "human", "value": "The sun was hot."}]}' >"$work/convs.jsonl"
for job in prepare generate; do
  if [ "$job" = prepare ]; then
    out="$work/p2.h5"
    cmd=(prepare --input "$text" --tokenizer "$model" --output "$out" --max-length 64 --max-samples 8)
  else
    out="$work/regen.jsonl"
    cmd=(generate --model "$model" --input "$work/convs.jsonl" --output "$out" --max-new-tokens 8)
  fi
  record "$job" "$host" >"$out.lock"
  flock "$out.lock" sleep 60 &
  holder=$!
  for _ in $(seq 100); do flock -n "$out.lock" true 2>/dev/null || break; sleep 0.05; done
  rc=0
  run 2 "${cmd[@]}" >"$work/${job}_held.log" 2>&1 || rc=$?
  sleeper=$(pgrep -P "$holder" || true)  # flock's child holds the lock file's descriptor too
  kill $sleeper "$holder" 2>/dev/null || true
  wait "$holder" 2>/dev/null || true
  [ "$rc" -ne 0 ] || fail "$job into a locked output was not refused"
  grep -q "$job: --output $out is in use by another job: aerie $job on host $host, pid 4321, Slurm job 99" \
    "$work/${job}_held.log" || fail "$job: the refusal does not name the holder"
  record "$job" other-node >"$out.lock"
  rc=0
  run 2 "${cmd[@]}" >"$work/${job}_other.log" 2>&1 || rc=$?
  [ "$rc" -ne 0 ] || fail "$job over another host's lock record was not refused"
  grep -q "on another host.*--force-unlock" "$work/${job}_other.log" || fail "$job: no --force-unlock advice"
  run 2 "${cmd[@]}" --force-unlock >"$work/${job}_forced.log" 2>&1 || fail "$job --force-unlock"
  grep -q "taking over the lock $out.lock of aerie $job on host other-node" "$work/${job}_forced.log" \
    || fail "$job: the takeover is not reported"
  [ -f "$out" ] && [ ! -e "$out.lock" ] || fail "$job: output missing or lock file left"
done
echo "4. prepare and generate refuse a held output and another host's lock without --force-unlock" | tee -a "$log"
fi
echo "PASS"
