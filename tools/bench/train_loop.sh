#!/usr/bin/env bash
# The train job's loop beyond the step (docs/performance.md, "The train job's loop beyond the step"): the Kimi-K2.5
# INT4 fixture of make_random_deepseek.py (8 layers, H 1024, V 163840, lm-head std 1.0), CONVERSATIONS regenerated
# answers, extract, vocab, then `aerie train` of STEPS steps of 16 samples with each binary given, one after the
# other on the same shards; each run's "rank 0's loop" line (making the samples ready, the steps, the rest) and its
# final loss, for a before/after of the job's own overhead in one device call.
# usage: tools/bench/train_loop.sh OUT AERIE [AERIE2 ...]    (a GPU machine with numpy; env: CONVERSATIONS=80
#        STEPS=100 DEVICE=cuda AERIE_DATA=../shared/data)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${1:?usage: train_loop.sh OUT AERIE [AERIE2 ...]}"; shift
[ $# -ge 1 ] || { echo "train_loop.sh: give at least one aerie binary" >&2; exit 2; }
mkdir -p "$out"; out="$(cd "$out" && pwd)"
data="${AERIE_DATA:-$root/../shared/data}" steps="${STEPS:-100}" device="${DEVICE:-cuda}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
first="$1"
[ -f "$out/model/config.json" ] || python3 "$root/tools/bench/make_random_deepseek.py" "$out/model" --format kimi-k25-int4 \
  --tokenizer "$data/tokenizers/kimi-k2" --lm-head-std 1.0 > "$out/fixture.log" 2>&1
[ -f "$out/regen.jsonl" ] || mpirun -np 1 "$first" generate --model "$out/model" --device "$device" --format sharegpt \
  --input "$data/sharegpt-fastchat/dummy_conversation.json" --template kimi-k2 --max-conversations "${CONVERSATIONS:-80}" \
  --max-new-tokens 64 --output "$out/regen.jsonl" > "$out/generate.log" 2>&1
[ -f "$out/prepared.h5" ] || mpirun -np 1 "$first" prepare --input "$out/regen.jsonl" --tokenizer "$out/model" \
  --template kimi-k2 --max-length 2048 --output "$out/prepared.h5" > "$out/prepare.log" 2>&1
[ -d "$out/shards" ] || mpirun -np 1 "$first" extract --model "$out/model" --device "$device" --dtype bf16 \
  --prepared "$out/prepared.h5" --output "$out/shards" --samples-per-shard 64 > "$out/extract.log" 2>&1
[ -f "$out/vocab.safetensors" ] || mpirun -np 1 "$first" vocab --model "$out/model" --prepared "$out/prepared.h5" \
  --output "$out/vocab.safetensors" --draft-vocab-size 8192 > "$out/vocab.log" 2>&1
i=0
for bin in "$@"; do
  i=$((i + 1)); run="$out/train_$i"; rm -rf "$run"
  mpirun -np 1 "$bin" train --model "$out/model" --device "$device" --shards "$out/shards" --vocab "$out/vocab.safetensors" \
    --output "$run" --steps "$steps" --batch-size 16 --lr 5e-4 --warmup-ratio 0.015 --max-grad-norm 0.5 --ttt-steps 7 \
    --checkpoint-every "$steps" --eval-fraction 0.05 --seed 1 > "$run.log" 2>&1 || { tail "$run.log"; exit 1; }
  echo "binary $i ($bin):"
  grep -E "done, $steps steps|rank 0's loop|step $steps/$steps|held out" "$run.log" | sed 's/^/  /'
done
