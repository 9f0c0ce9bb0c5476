#!/usr/bin/env bash
# The target's context length where samples are made and used (issue 17, point 12), on stories260K
# (max_position_embeddings 512):
#   - prepare with --max-length past 512 (the tokenizer folder is the model's) warns;
#   - extract refuses a prepared sample of 600 tokens before the model loads, naming the sample;
#   - generate --prompt with --max-new 1000 stops at 512 positions and says so.
# usage: context_length.sh AERIE MODEL_DIR WORK_DIR
set -euo pipefail
aerie=$1 model=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAIL: $*"; exit 1; }
ids="" mask=""
for j in $(seq 600); do ids+="${ids:+,}$(( 3 + j % 400 ))"; mask+="${mask:+,}1"; done
{ echo "{\"input_ids\": [$ids], \"loss_mask\": [$mask]}"; echo "{\"input_ids\": [5, 6, 7, 8], \"loss_mask\": [1, 1, 1, 1]}"; } \
  >"$work/tok.jsonl"
mpirun --oversubscribe -np 1 "$aerie" prepare --input "$work/tok.jsonl" --format tokenized --tokenizer "$model" \
  --max-length 1024 --output "$work/prepared.h5" >"$work/prepare.log" 2>&1 || { cat "$work/prepare.log"; fail prepare; }
grep -q "exceeds max_position_embeddings 512" "$work/prepare.log" || { cat "$work/prepare.log"; fail "prepare did not warn"; }
if mpirun --oversubscribe -np 1 "$aerie" extract --model "$model" --prepared "$work/prepared.h5" --output "$work/shards" \
  >"$work/extract.log" 2>&1; then
  cat "$work/extract.log"; fail "extract accepted a 600-token sample for a 512-position model"
fi
grep -q "sample 0 of .* has 600 tokens, past the target's max_position_embeddings 512" "$work/extract.log" ||
  { cat "$work/extract.log"; fail "extract's error does not name the sample"; }
grep -q "loaded\|parameters" "$work/extract.log" && { cat "$work/extract.log"; fail "extract loaded the model first"; }
mpirun --oversubscribe -np 1 "$aerie" generate --model "$model" --prompt "Once upon a time" --max-new 1000 \
  --temperature 0 >"$work/generate.log" 2>&1 || { cat "$work/generate.log"; fail generate; }
grep -q "max-new 1000 cut to" "$work/generate.log" || { cat "$work/generate.log"; fail "generate did not cut --max-new"; }
echo "context_length: prepare warns, extract refuses, generate stops at 512"
