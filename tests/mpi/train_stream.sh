#!/usr/bin/env bash
# Streaming training (issue 14, item 2; src/train/stream.h) on stories260K, CPU:
#   A. offline: extract (2 ranks) + train (2 ranks): the reference;
#   B. streaming, 1 target rank + 2 training ranks: a final draft.safetensors and optimizer state bitwise
#      equal to A's (the same hidden states in the same order: on the CPU extract also runs one sample per
#      forward), and the same held-out scores at every checkpoint;
#   B'. eval with a streamed run's data_split.json and no shards: the target computes the held-out
#      samples' hidden states; acc_k and tau_sim equal the offline run's on its shards;
#   C. 2 target replicas (--target-ranks 2 --tp 1) + 2 trainers: bitwise equal to A;
#   D. one replica of tp 2 + 2 trainers: the target's sums split over 2 ranks, so equal to A within the
#      bf16 rounding of the hidden states only: final loss within 2%; the same with --tp-overlap;
#   E. streaming killed (SIGKILL) at a random moment after its first checkpoint, rerun: bitwise equal to A;
#   F. streaming stopped by SIGTERM (Slurm preemption): a checkpoint, the target's ranks end after the
#      trainers' last credit, and the rerun bitwise equal to A (mpirun itself exits 1 after forwarding a
#      signal, as for offline train; each rank returns 3);
#   G. refusals: a streaming resume of an offline run folder (and the reverse), --shards with --prepared,
#      offline --aux-layers other than the shards',
#      --target-ranks leaving no trainer, a --prepared that is not a prepared file.
# usage: train_stream.sh AERIE_BINARY MODEL_DIR STORIES_TXT WORK_DIR
set -euo pipefail
aerie="$1"; model="$2"; text="$3"; work="$4"
source "$(dirname "$0")/aerie_script_lib.sh"
source "$(dirname "$0")/stop_lib.sh"

run prepare 1 prepare --input "$text" --tokenizer "$model" --output "$work/prepared.h5" --max-length 64 --max-samples 48 \
  || fail "prepare"
run extract 2 extract --model "$model" --prepared "$work/prepared.h5" --output "$work/shards" --samples-per-shard 16 \
  || fail "extract"
run vocab 1 vocab --prepared "$work/prepared.h5" --model "$model" --output "$work/vocab.safetensors" --draft-vocab-size 200 \
  || fail "vocab"

steps=90
final=$(printf 'step-%08d' "$steps")
common=(--vocab "$work/vocab.safetensors" --steps "$steps" --batch-size 4 --lr 1e-3 --checkpoint-every 6 --log-every 6
        --seed 3)
stream_args() {  # the streaming command line of run folder $1 (extra options after it)
  local out="$1"; shift
  echo train --target-model "$model" --prepared "$work/prepared.h5" --output "$out" "${common[@]}" "$@"
}
same_as_a() {  # RUN_FOLDER WHAT
  cmp "$work/a/checkpoints/$final/draft.safetensors" "$1/checkpoints/$final/draft.safetensors" \
    || fail "$2: draft.safetensors differs from the offline run's"
  cmp "$work/a/checkpoints/$final/optimizer.safetensors" "$1/checkpoints/$final/optimizer.safetensors" \
    || fail "$2: optimizer state differs from the offline run's"
}

# A: offline.
run a 2 train --model "$model" --shards "$work/shards" --output "$work/a" "${common[@]}" || fail "offline train"
[ -f "$work/a/checkpoints/$final/DONE" ] || fail "no final checkpoint in run a"

# B: 1 target rank + 2 trainers.
# shellcheck disable=SC2046
run b 3 $(stream_args "$work/b") --target-ranks 1 || fail "streaming train (1 + 2 ranks)"
same_as_a "$work/b" "B (1 target rank + 2 trainers)"
cmp "$work/a/heldout.jsonl" "$work/b/heldout.jsonl" || fail "B: held-out scores differ from the offline run's"
grep -q "train (target): done at step $steps of $steps" "$last" || fail "B: no target summary"
grep -q '"streamed": true' "$work/b/checkpoints/$final/config.json" || fail "B: the checkpoint does not record streaming"

# B': eval of a streamed run's split: the held-out samples' hidden states come from the target (no shards),
# rounded as a shard stores them, so tau_sim and acc_k equal those of the offline run evaluated on its shards.
run export_a 1 export --checkpoint "$work/a" --model "$model" --output "$work/export_a" || fail "export a"
run export_b 1 export --checkpoint "$work/b" --model "$model" --output "$work/export_b" || fail "export b"
run eval_a 1 eval --model "$model" --draft "$work/export_a" --prompts "$text" --num-prompts 2 --max-new-tokens 8 \
  --shards "$work/shards" --data-split "$work/a/data_split.json" --output "$work/eval_a.json" || fail "eval a"
run eval_b 1 eval --model "$model" --draft "$work/export_b" --prompts "$text" --num-prompts 2 --max-new-tokens 8 \
  --data-split "$work/b/data_split.json" --output "$work/eval_b.json" || fail "eval b (a streamed run's split)"
grep -q "hidden states from the target" "$work/eval_b.json" || fail "eval b: eval.json does not name the held-out source"
python3 - "$work/eval_a.json" "$work/eval_b.json" <<'EOF2' || fail "eval of the streamed split differs from the shards'"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert a["teacher_forced_samples"] == b["teacher_forced_samples"] > 0, (a["teacher_forced_samples"], b["teacher_forced_samples"])
assert a["acc_k"] == b["acc_k"] and a["tau_sim"] == b["tau_sim"], (a["acc_k"], b["acc_k"])
EOF2

# C: 2 replicas of tp 1.
# shellcheck disable=SC2046
run c 4 $(stream_args "$work/c") --target-ranks 2 --tp 1 || fail "streaming train (2 replicas)"
same_as_a "$work/c" "C (2 target replicas)"

# D: one replica of tp 2: the final loss within 2% of A's; D2 the same with the all-reduces overlapped (the
# target then forwards a step's samples in batches of two micro-batches).
loss_as_a() {  # RUN_DIR WHAT
  python3 - "$work/a/metrics.jsonl" "$1/metrics.jsonl" <<'EOF' || fail "$2: the run's loss is not the offline run's"
import json, sys
a, d = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
assert [x["step"] for x in a] == [x["step"] for x in d], "other steps logged"
for x, y in zip(a, d):
    assert abs(x["loss"] - y["loss"]) <= 0.02 * abs(x["loss"]), (x["step"], x["loss"], y["loss"])
EOF
}
# shellcheck disable=SC2046
run d 4 $(stream_args "$work/d") --target-ranks 2 || fail "streaming train (tp 2)"
loss_as_a "$work/d" "D (tp 2)"
# shellcheck disable=SC2046
run d2 4 $(stream_args "$work/d2") --target-ranks 2 --tp-overlap || fail "streaming train (tp 2, --tp-overlap)"
grep -q "tp all-reduces overlapped with compute" "$work/d2.log" || fail "D2: the target did not say it overlaps"
# 4 samples of up to 64 tokens a step, --batch-tokens 2048: every forward packs the step, no packing warning.
! grep -q "splits forwards of two or more samples only" "$work/d2.log" || fail "D2: a packing warning at 2048 tokens"
loss_as_a "$work/d2" "D2 (tp 2, --tp-overlap)"

# E, F: stopped at a random moment after the first checkpoint, rerun with the same command.
stream_and_stop() {  # HOW OUTPUT MAX_DELAY_MS: 0 if the stop landed before the end
  local how="$1" out="$2" max_ms="$3"
  # shellcheck disable=SC2046
  mpirun --oversubscribe -np 3 "$aerie" $(stream_args "$out") >>"$work/$how.log" 2>&1 &
  stop_at_random "$how" $! "$out/checkpoints/step-00000006/DONE" "$max_ms"
  local ms=$stop_delay_ms
  echo "$how after $ms ms past the first checkpoint" >>"$work/$how.log"
  if pgrep -f -- "--output $out " >/dev/null; then fail "$how: ranks of the stopped run are still alive"; fi
  [ ! -f "$out/checkpoints/$final/DONE" ] || return 1
  return 0
}
for how in crash signal; do
  out="$work/$how"
  stopped=0
  for max_ms in 1000 300 0; do
    rm -rf "$out"
    if stream_and_stop "$how" "$out" "$max_ms"; then stopped=1; break; fi
  done
  [ "$stopped" = 1 ] || fail "$how: could not stop the run before it finished"
  if [ "$how" = signal ]; then
    grep -q "stopped by signal 15" "$work/$how.log" || fail "SIGTERM did not stop the run with a checkpoint"
    # The target's ranks end after the trainers' last credit (not killed): their summary is logged.
    grep -q "train (target): done at step" "$work/$how.log" || fail "SIGTERM: the target's ranks did not end cleanly"
  fi
  # shellcheck disable=SC2046
  run "$how-rerun" 3 $(stream_args "$out") || fail "$how: resumed streaming run"
  grep -q "resuming from $out/" "$last" || fail "$how: the rerun did not resume"
  same_as_a "$out" "$how + rerun"
done

# G: refusals.
# shellcheck disable=SC2046
refused mode_offline 'trained offline on --shards.*this run streams' 3 $(stream_args "$work/a")
refused mode_stream 'trained streaming from --prepared.*this run reads --shards' 2 train --model "$model" \
  --shards "$work/shards" --output "$work/b" "${common[@]}"
# shellcheck disable=SC2046
refused both '\-\-shards and --prepared exclude each other' 3 $(stream_args "$work/g1") --shards "$work/shards"
# shellcheck disable=SC2046
refused no_trainer 'streaming needs more ranks than --target-ranks 2' 2 $(stream_args "$work/g2") --target-ranks 2
# shellcheck disable=SC2046
refused not_prepared "\-\-prepared $work/vocab.safetensors is not a prepared file" 3 \
  $(stream_args "$work/g3" | sed "s#$work/prepared.h5#$work/vocab.safetensors#")
refused aux_mismatch 'aux-layers \[1,2,3\], but the shards in .* hold aux layers' 2 train --model "$model" \
  --shards "$work/shards" --output "$work/g4" "${common[@]}" --aux-layers 1,2,3
# A resume with other --aux-layers (the draft would name layers it was not trained on), --model other than
# --target-model (the provenance would name the wrong target), streaming-only options on an offline run, a
# prepared file of another tokenizer (ids past the target's vocabulary, refused before any step).
# shellcheck disable=SC2046
refused aux_resume 'resume: the checkpoint.s draft reads aux layers \[2,2,2\], --aux-layers gives \[1,2,3\]' 3 \
  $(stream_args "$work/b") --aux-layers 1,2,3
# A resume whose target would run W8A8 (--fp8-gemm) after plain steps: refused naming the option.
# shellcheck disable=SC2046
refused fp8_resume "resume: .* was trained on hidden states of a target run with the compute dtype.s GEMMs, this run.s target runs w8a8-fp8-block, tp [0-9]+: rerun without --fp8-gemm" 3 \
  $(stream_args "$work/b") --fp8-gemm
mkdir -p "$work/other_model"
cp "$model"/* "$work/other_model/"
python3 - "$work/other_model/config.json" <<'EOF2'
import json, sys
c = json.load(open(sys.argv[1])); c["rms_norm_eps"] = 1e-4; json.dump(c, open(sys.argv[1], "w"))
EOF2
refused other_model 'is another target than --model' 3 train --target-model "$model" --model "$work/other_model" \
  --prepared "$work/prepared.h5" --output "$work/g5" "${common[@]}"
refused offline_stream_opt '\-\-target-ranks applies to streaming only' 2 train --model "$model" --shards "$work/shards" \
  --output "$work/g6" "${common[@]}" --target-ranks 1
run prepare_qwen 1 prepare --input "$text" --tokenizer "$(dirname "$(dirname "$text")")/tokenizers/qwen3" --output "$work/qwen.h5" \
  --max-length 64 --max-samples 8 2>/dev/null || true
if [ -f "$work/qwen.h5" ]; then
  # shellcheck disable=SC2046
  refused oov 'prepared sample [0-9]+ of .*qwen.h5 has id [0-9]+ at position [0-9]+, outside the target.s vocabulary \[0, 512\)' 3 \
    $(stream_args "$work/g7" | sed "s#$work/prepared.h5#$work/qwen.h5#")
  ! grep -q "info train: step" "$last" || fail "oov: training started before the bad id was found"
fi
echo "PASS: streaming equals offline extract + train bitwise (1 and 2 target replicas), within 2% at tp 2; resumed after SIGKILL and SIGTERM bitwise; refusals"
