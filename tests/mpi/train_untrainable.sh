#!/usr/bin/env bash
# Samples whose loss tokens all sit at positions 0-1 give TTT no row to train (eagle3.md section 4: row t
# needs loss_mask[t + 2]); `aerie train` on them must stop with an error that says so instead of running at
# loss 0 and writing an untrained draft (issue 17, point 9). stories260K, pre-tokenized samples.
# usage: train_untrainable.sh AERIE MODEL_DIR WORK_DIR
set -euo pipefail
aerie=$1 model=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
for i in $(seq 8); do
  ids="" mask=""
  for j in $(seq 30); do ids+="${ids:+,}$(( 3 + (i * 31 + j * 17) % 400 ))"; mask+="${mask:+,}$(( j <= 2 ? 1 : 0 ))"; done
  echo "{\"input_ids\": [$ids], \"loss_mask\": [$mask]}"
done >"$work/tok.jsonl"
run() { "$@" >"$work/last.log" 2>&1 || { cat "$work/last.log"; echo "FAIL: $*"; exit 1; }; }
run mpirun --oversubscribe -np 1 "$aerie" prepare --input "$work/tok.jsonl" --format tokenized --tokenizer "$model" \
    --output "$work/prepared.h5"
run mpirun --oversubscribe -np 1 "$aerie" extract --model "$model" --prepared "$work/prepared.h5" --output "$work/shards"
run mpirun --oversubscribe -np 1 "$aerie" vocab --model "$model" --prepared "$work/prepared.h5" \
    --output "$work/vocab.safetensors" --draft-vocab-size 32
if mpirun --oversubscribe -np 1 "$aerie" train --model "$model" --shards "$work/shards" --vocab "$work/vocab.safetensors" \
    --output "$work/run" --steps 3 --batch-size 2 >"$work/train.log" 2>&1; then
  cat "$work/train.log"; echo "FAIL: train accepted samples without a trainable row"; exit 1
fi
grep -q "none of the 3 steps had a trainable row" "$work/train.log" || { cat "$work/train.log"; echo "FAIL: no clear error"; exit 1; }
grep -q "step 1 has no trainable row" "$work/train.log" || { cat "$work/train.log"; echo "FAIL: no warning at step 1"; exit 1; }
# A shard folder given as the run folder is refused (it would mix the two).
if mpirun --oversubscribe -np 1 "$aerie" train --model "$model" --shards "$work/shards" --vocab "$work/vocab.safetensors" \
    --output "$work/shards" --steps 1 >"$work/mixed.log" 2>&1; then
  cat "$work/mixed.log"; echo "FAIL: train wrote its run into a shard folder"; exit 1
fi
grep -q "holds hidden-state shards" "$work/mixed.log" || { cat "$work/mixed.log"; echo "FAIL: no clear error"; exit 1; }
echo "train_untrainable: refused with a clear error"
