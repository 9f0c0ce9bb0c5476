#!/usr/bin/env bash
# Resume is bitwise: `aerie train` on 2 ranks, killed (SIGKILL) or stopped by SIGTERM at a random moment
# after its first checkpoint and rerun with the same command, must end with a draft.safetensors (and
# optimizer state) bitwise equal to an uninterrupted run's; the draft vocabulary of every checkpoint is
# the file the run started with.
# Then a checkpoint of 2 ranks resumes on 1 rank (the state is global) and keeps its vocabulary even when
# --vocab names another file; a refused resume on 2 ranks ends cleanly (status 1, no MPI_ABORT); the result
# exports.
# usage: train_resume.sh AERIE_BINARY MODEL_DIR STORIES_TXT WORK_DIR
set -euo pipefail
source "$(dirname "$0")/stop_lib.sh"
aerie="$1"; model="$2"; text="$3"; work="$4"
rm -rf "$work"; mkdir -p "$work"
log="$work/log.txt"
run() { local np="$1"; shift; mpirun --oversubscribe -np "$np" "$aerie" "$@" >>"$log" 2>&1; }
fail() { echo "FAIL: $*"; tail -30 "$log"; exit 1; }

run 1 prepare --input "$text" --tokenizer "$model" --output "$work/prepared.h5" --max-length 64 --max-samples 32
run 2 extract --model "$model" --prepared "$work/prepared.h5" --output "$work/shards" --samples-per-shard 16
run 1 vocab --prepared "$work/prepared.h5" --model "$model" --output "$work/vocab.safetensors" --draft-vocab-size 200
run 1 vocab --prepared "$work/prepared.h5" --model "$model" --output "$work/other_vocab.safetensors" --draft-vocab-size 100

steps=120  # long enough (about 4 s at 30 steps/s) that a stop after the first checkpoint lands before the end
final=$(printf 'step-%08d' "$steps")
train_args() {  # the train command line of run folder $1
  echo train --model "$model" --shards "$work/shards" --vocab "$work/vocab.safetensors" --output "$1" \
    --steps "$steps" --batch-size 4 --lr 1e-3 --checkpoint-every 4 --log-every 4 --seed 3
}
# Starts mpirun in the background and stops it at a random moment after the first checkpoint is complete:
# "crash" kills the ranks (SIGKILL, by the pids of mpirun's children), "signal" sends SIGTERM to mpirun
# (forwarded to the ranks, which checkpoint after the current step and exit, as on Slurm preemption).
# Returns 0 if the stop landed before the run finished.
train_and_stop() {  # HOW NP OUTPUT MAX_DELAY_MS
  local how="$1" np="$2" out="$3" max_ms="$4"
  # shellcheck disable=SC2046
  mpirun --oversubscribe -np "$np" "$aerie" $(train_args "$out") >>"$log" 2>&1 &
  stop_at_random "$how" $! "$out/checkpoints/step-00000004/DONE" "$max_ms"
  local ms=$stop_delay_ms
  # No rank of the stopped run may survive (it would write into the folder the rerun uses).
  if pgrep -f -- "--output $out " >/dev/null; then fail "ranks of the stopped run are still alive"; fi
  echo "$how after $ms ms past the first checkpoint" >>"$log"
  [ ! -f "$out/checkpoints/$final/DONE" ]
}

# A: uninterrupted.
# shellcheck disable=SC2046
run 2 $(train_args "$work/a") || fail "uninterrupted run"
[ -f "$work/a/checkpoints/$final/DONE" ] || fail "no final checkpoint in run a"

# B (crash) and D (signal): stopped at a random moment, then the same command again, must end bitwise
# equal to A. A stop that came too late (run finished) proves nothing: retry with a shorter delay.
for how in crash signal; do
  out="$work/$how"
  stopped=0
  for max_ms in 1000 300 0; do
    rm -rf "$out"
    if train_and_stop "$how" 2 "$out" "$max_ms"; then stopped=1; break; fi
  done
  [ "$stopped" = 1 ] || fail "$how: could not stop the run before it finished"
  if [ "$how" = signal ]; then
    grep -q "stopped by signal 15" "$log" || fail "SIGTERM did not stop the run with a checkpoint"
  fi
  # shellcheck disable=SC2046
  run 2 $(train_args "$out") || fail "$how: resumed run"
  grep -q "resuming from $out/" "$log" || fail "$how: the rerun did not resume"
  cmp "$work/a/checkpoints/$final/draft.safetensors" "$out/checkpoints/$final/draft.safetensors" \
    || fail "$how: resumed draft.safetensors differs from the uninterrupted run's"
  cmp "$work/a/checkpoints/$final/optimizer.safetensors" "$out/checkpoints/$final/optimizer.safetensors" \
    || fail "$how: resumed optimizer state differs"
  for d in "$out"/checkpoints/step-*; do
    [ -f "$d/DONE" ] || continue
    cmp "$work/vocab.safetensors" "$d/draft_vocab.safetensors" || fail "$d: draft vocabulary changed"
  done
done

# C: run a's step-8 checkpoint resumed on 1 rank with another --vocab: the checkpoint's vocabulary is kept,
# and an incomplete later checkpoint (no DONE) is ignored. --keep-checkpoints 1 deletes the checkpoint
# resumed from at the first save: later saves must still find the vocabulary (they copy it from the newest).
mkdir -p "$work/c/checkpoints"
cp -r "$work/a/checkpoints/step-00000008" "$work/c/checkpoints/"
cp -r "$work/a/checkpoints/step-00000012" "$work/c/checkpoints/"
rm "$work/c/checkpoints/step-00000012/DONE"
# shellcheck disable=SC2046
run 1 $(train_args "$work/c" | sed "s#$work/vocab.safetensors#$work/other_vocab.safetensors#") --keep-checkpoints 1 \
  || fail "resume on 1 rank"
grep -q "resuming from $work/c/checkpoints/step-00000008" "$log" || fail "run c did not resume from step 8"
[ -f "$work/c/checkpoints/$final/DONE" ] || fail "no final checkpoint in run c"
cmp "$work/vocab.safetensors" "$work/c/checkpoints/$final/draft_vocab.safetensors" \
  || fail "resume with another --vocab changed the draft vocabulary"
[ ! -d "$work/c/checkpoints/step-00000008" ] || fail "--keep-checkpoints 1 kept the checkpoint resumed from"

# E: a refused resume on 2 ranks ends the job cleanly: status 1, the reason logged once (rank 0), no
# MPI_ABORT banner (every rank checks the same checkpoint and they agree on the refusal).
refusal="$work/refused.log"
set +e
# shellcheck disable=SC2046
mpirun --oversubscribe -np 2 "$aerie" $(train_args "$work/a") --adam-beta2 0.95 >"$refusal" 2>&1
rc=$?
set -e
[ "$rc" = 1 ] || { cat "$refusal"; fail "a refused resume on 2 ranks exited $rc, not 1"; }
[ "$(grep -c "resume: --adam-beta2 is 0.95 but the checkpoint was trained with 0.999" "$refusal")" = 1 ] \
  || { cat "$refusal"; fail "the refusal is not logged exactly once"; }
if grep -q "MPI_ABORT" "$refusal"; then cat "$refusal"; fail "a refused resume aborted the job (MPI_ABORT)"; fi

run 1 export --checkpoint "$work/crash" --model "$model" --output "$work/export" || fail "export"
[ -f "$work/export/config.json" ] && [ -f "$work/export/model.safetensors" ] || fail "export files missing"
echo "PASS: runs resumed after a crash and after SIGTERM bitwise equal to the uninterrupted one; vocabulary kept; resume on 1 rank; a refused resume ends cleanly; export"
