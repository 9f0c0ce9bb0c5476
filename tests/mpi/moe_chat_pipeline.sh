#!/usr/bin/env bash
# The whole pipeline with real conversations on the tiny softmax-router MoE fixtures (tests/model/fixtures/hf,
# tools/reference/make_moe_fixtures.py), on the CPU: generate, prepare with the family's chat template, extract,
# vocab, train on 2 ranks, export, and `aerie eval` with its lossless check, at tp 1 (with the untrained draft
# too), tp 2 and tp 2 --expert-parallel. As deepseek_chat_pipeline.sh, each fixture is widened at test time
# (tests/tools/widen_vocab.cc) to its tokenizer's vocabulary with the tokenizer's files beside the weights:
#   qwen3_moe (Qwen3-MoE)  + ../shared/data/tokenizers/qwen3 (V 151936), template qwen3
#   mixtral   (Mixtral)    + BUILD_DIR/models/tokenizers/mistral_v1 (Mixtral v0.1's sentencepiece model,
#                            converted to tokenizer.json by the build; V 32000), template mistral-v1
# Checked: eval lossless for the trained and the untrained draft; the trained draft accepted more than the
# untrained one (it recalls the few answers it was trained on: random weights); tp 2 and ep 2 decode tp 1's
# tokens. About a minute on 2 cores.
# usage: moe_chat_pipeline.sh AERIE WIDEN_VOCAB SOURCE_DIR SHARED_DATA BUILD_DIR WORK_DIR
# Exits 77 (CTest: skipped) when SHARED_DATA lacks the tokenizers or the conversations.
set -euo pipefail
aerie=$1 widen=$2 src=$3 data=$4 build=$5 work=$6
for f in "$data/tokenizers/qwen3/tokenizer.json" "$data/sharegpt-fastchat/dummy_conversation.json"; do
  [ -f "$f" ] || { echo "no $f: skipped"; exit 77; }
done
# Built with the tests (tools/test builds every target; the demo builds aerie alone).
for f in "$widen" "$build/models/tokenizers/mistral_v1/tokenizer.json"; do
  [ -e "$f" ] || { echo "FAIL: no $f: build every target first (tools/test, or cmake --build BUILD_DIR)"; exit 1; }
done
export OPENBLAS_NUM_THREADS=1
rm -rf "$work" && mkdir -p "$work"
run() { "$@" >"$work/last.log" 2>&1 || { cat "$work/last.log"; echo "FAIL: $*"; exit 1; }; }
fail() { echo "FAIL: $*"; exit 1; }
num() { grep -o "\"$1\": *[0-9.e+-]*" "$2" | head -1 | sed 's/.*: *//'; }
t0=$SECONDS
# fixture, tokenizer folder, vocab_size, template, aux layers
for c in "qwen3_moe $data/tokenizers/qwen3 151936 qwen3 0,1,3" \
         "mixtral $build/models/tokenizers/mistral_v1 32000 mistral-v1 0,1,2"; do
  read -r m tokdir V tmpl aux <<<"$c"
  out="$work/$m" model="$work/$m/model"
  run "$widen" "$src/tests/model/fixtures/hf/$m" "$tokdir" "$V" "$model"
  run mpirun --oversubscribe -np 2 "$aerie" generate --model "$model" --device cpu \
      --input "$data/sharegpt-fastchat/dummy_conversation.json" --format sharegpt --template "$tmpl" \
      --max-conversations 16 --max-new-tokens 16 --output "$out/regen.jsonl"
  run mpirun --oversubscribe -np 2 "$aerie" prepare --input "$out/regen.jsonl" --tokenizer "$model" \
      --template "$tmpl" --max-length 256 --output "$out/prepared.h5"
  run mpirun --oversubscribe -np 2 "$aerie" extract --model "$model" --device cpu \
      --prepared "$out/prepared.h5" --output "$out/shards" --aux-layers "$aux" --samples-per-shard 8
  run mpirun --oversubscribe -np 1 "$aerie" vocab --model "$model" --prepared "$out/prepared.h5" \
      --output "$out/vocab.safetensors" --draft-vocab-size 256
  run mpirun --oversubscribe -np 2 "$aerie" train --model "$model" --device cpu --shards "$out/shards" \
      --vocab "$out/vocab.safetensors" --output "$out/run" --steps 40 --batch-size 4 --lr 1e-2 --eval-fraction 0
  run mpirun --oversubscribe -np 1 "$aerie" export --model "$model" --checkpoint "$out/run" --output "$out/export"
  grep -q "\"vocab_size\": *$V" "$out/export/config.json" || fail "$m: the export's vocab_size is not $V"
  for tp in 1 2 ep2; do
    untrained=() && [ $tp = 1 ] && untrained=(--untrained)
    split=(--tp "${tp#ep}") && [ $tp = ep2 ] && split+=(--expert-parallel)
    run mpirun --oversubscribe -np 2 "$aerie" eval --model "$model" --draft "$out/export" --device cpu --dtype f32 \
        "${split[@]}" --chat-template "$tmpl" --prompts "$out/regen.jsonl" --num-prompts 8 --max-new-tokens 16 \
        --num-draft-tokens 3 "${untrained[@]}" --output "$out/eval_tp$tp.json"
    for kv in '"lossless": true' '"lossless_failures": 0' '"num_prompts": 8'; do
      grep -q "$kv" "$out/eval_tp$tp.json" || { cat "$out/eval_tp$tp.json"; fail "$m: tp $tp: eval.json has no $kv"; }
    done
  done
  j="$out/eval_tp1.json"
  acc=$(num acceptance_length "$j") acc_u=$(num acceptance_length_untrained "$j")
  grep -q '"lossless_failures_untrained": 0' "$j" || { cat "$j"; fail "$m: eval is not lossless with the untrained draft"; }
  awk -v a="$acc" -v u="$acc_u" 'BEGIN { exit !(a > u) }' ||
    { cat "$j"; fail "$m: the trained draft's acceptance length $acc is not above the untrained one's $acc_u"; }
  for other in tp2 tpep2; do
    [ "$(grep '"output"' "$j")" = "$(grep '"output"' "$out/eval_$other.json")" ] || fail "$m: $other decoded other tokens"
  done
  echo "$m ($tmpl, V $V): generate, prepare, extract, vocab, train, export, eval at tp 1, tp 2 and ep 2 ok: lossless," \
       "acceptance length $acc (untrained $acc_u), $(num tokens_generated "$j") tokens (${SECONDS}s)"
done
echo "moe_chat_pipeline: $((SECONDS - t0))s"
