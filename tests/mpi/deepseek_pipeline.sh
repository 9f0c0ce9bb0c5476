#!/usr/bin/env bash
# The pipeline after prepare on the tiny DeepSeek-V3-architecture fixtures (tests/model/fixtures/hf:
# deepseek_v3 bf16, deepseek_v3_fp8 block-FP8, kimi_k25_int4 Kimi-K2.5 wrapper with INT4 experts): a
# pre-tokenized prepared file (ids < 256, the fixtures' vocabulary; prepare borrows stories260K's
# tokenizer), then extract at tp 1, tp 2, tp 2 with --expert-parallel and tp 2 with --tp-overlap (the same
# shards; their values are TpTest's), vocab, 4 train
# steps on 2 ranks, export; the export's config
# must carry the draft shape of an MLA target (head_dim = v_head_dim) and the target's YaRN rope.
# No template and no eval here (the fixtures' vocabulary is no tokenizer's): tests/mpi/deepseek_chat_pipeline.sh
# runs the whole pipeline with real conversations, templates and eval on the fixtures widened to a real one.
# usage: deepseek_pipeline.sh AERIE SOURCE_DIR TOKENIZER_DIR WORK_DIR
# Exits 77 (CTest: skipped) when the converted stories260K tokenizer is missing.
set -euo pipefail
aerie=$1 src=$2 tok=$3 work=$4
[ -f "$tok/tokenizer.json" ] || { echo "no tokenizer at $tok: skipped"; exit 77; }
export OPENBLAS_NUM_THREADS=1
rm -rf "$work" && mkdir -p "$work"
run() { "$@" >"$work/last.log" 2>&1 || { cat "$work/last.log"; echo "FAIL: $*"; exit 1; }; }
# 12 samples of 20-59 ids in [1, 255], the first third of each masked out (a fixed LCG: no python).
s=7
for i in $(seq 12); do
  s=$(( (s * 1103515245 + 12345) % 2147483648 )); n=$(( 20 + s % 40 ))
  ids="" mask=""
  for j in $(seq "$n"); do
    s=$(( (s * 1103515245 + 12345) % 2147483648 ))
    ids+="${ids:+,}$(( 1 + s % 255 ))"; mask+="${mask:+,}$(( j > n / 3 ? 1 : 0 ))"
  done
  echo "{\"input_ids\": [$ids], \"loss_mask\": [$mask]}"
done >"$work/tok.jsonl"
run mpirun --oversubscribe -np 1 "$aerie" prepare --input "$work/tok.jsonl" --format tokenized --tokenizer "$tok" \
    --output "$work/prepared.h5"
for m in deepseek_v3 deepseek_v3_fp8 kimi_k25_int4; do
  model="$src/tests/model/fixtures/hf/$m" out="$work/$m"
  run mpirun --oversubscribe -np 1 "$aerie" extract --model "$model" --prepared "$work/prepared.h5" \
      --output "$out/shards" --aux-layers 0,1,3
  run mpirun --oversubscribe -np 2 "$aerie" extract --model "$model" --prepared "$work/prepared.h5" \
      --output "$out/shards_tp2" --aux-layers 0,1,3 --tp 2
  [ "$(ls "$out/shards" | grep -c '^shard-')" = "$(ls "$out/shards_tp2" | grep -c '^shard-')" ] ||
    { echo "FAIL: $m: tp 2 wrote another number of shards"; exit 1; }
  # Expert parallelism (4 of the 8 routed experts whole per rank; values: TpTest.DeepseekExpertParallel*).
  run mpirun --oversubscribe -np 2 "$aerie" extract --model "$model" --prepared "$work/prepared.h5" \
      --output "$out/shards_ep2" --aux-layers 0,1,3 --tp 2 --expert-parallel
  [ "$(ls "$out/shards" | grep -c '^shard-')" = "$(ls "$out/shards_ep2" | grep -c '^shard-')" ] ||
    { echo "FAIL: $m: ep 2 wrote another number of shards"; exit 1; }
  # The all-reduces overlapped with compute (two micro-batches of up to 128 tokens' worth of samples; values:
  # TpTest.MicroBatchOverlapMatchesOneBatch).
  run mpirun --oversubscribe -np 2 "$aerie" extract --model "$model" --prepared "$work/prepared.h5" \
      --output "$out/shards_overlap" --aux-layers 0,1,3 --tp 2 --tp-overlap --batch-tokens 128
  grep -q "tp all-reduces overlapped with compute (two micro-batches)" "$work/last.log" ||
    { cat "$work/last.log"; echo "FAIL: $m: extract --tp-overlap did not say so"; exit 1; }
  [ "$(ls "$out/shards" | grep -c '^shard-')" = "$(ls "$out/shards_overlap" | grep -c '^shard-')" ] ||
    { echo "FAIL: $m: --tp-overlap wrote another number of shards"; exit 1; }
  run mpirun --oversubscribe -np 1 "$aerie" vocab --model "$model" --prepared "$work/prepared.h5" \
      --output "$out/vocab.safetensors" --draft-vocab-size 64
  run mpirun --oversubscribe -np 2 "$aerie" train --model "$model" --shards "$out/shards" \
      --vocab "$out/vocab.safetensors" --output "$out/run" --steps 4 --batch-size 2
  run mpirun --oversubscribe -np 1 "$aerie" export --model "$model" --checkpoint "$out/run" --output "$out/export"
  cfg="$out/export/config.json"
  grep -q '"head_dim": *16' "$cfg" || { cat "$cfg"; echo "FAIL: $m: draft head_dim is not v_head_dim 16"; exit 1; }
  grep -q '"yarn"' "$cfg" || { cat "$cfg"; echo "FAIL: $m: the export lost the target's YaRN rope"; exit 1; }
  grep -q '"eagle_aux_hidden_state_layer_ids"' "$cfg" || { echo "FAIL: $m: no aux ids in the export"; exit 1; }
  echo "$m: extract tp 1 and 2, vocab, train, export ok"
done
# W8A8 (extract --fp8-gemm) on the block-FP8 fixture: shards recording target_gemm, and a resume without
# the flag (one shard of three missing) refused by name (the values: QuantFp8.W8A8* in test_model).
fp8="$src/tests/model/fixtures/hf/deepseek_v3_fp8" out="$work/deepseek_v3_fp8"
run mpirun --oversubscribe -np 1 "$aerie" extract --model "$fp8" --prepared "$work/prepared.h5" \
    --output "$out/shards_w8a8" --aux-layers 0,1,3 --fp8-gemm --samples-per-shard 4
[ "$(ls "$out/shards_w8a8" | grep -c '^shard-')" = 3 ] || { echo "FAIL: --fp8-gemm wrote no 3 shards"; exit 1; }
grep -aq "w8a8-fp8-block" "$out/shards_w8a8/shard-00000.h5" ||
  { echo "FAIL: the --fp8-gemm shard does not record target_gemm"; exit 1; }
rm "$out/shards_w8a8/shard-00000.h5"
if mpirun --oversubscribe -np 1 "$aerie" extract --model "$fp8" --prepared "$work/prepared.h5" \
    --output "$out/shards_w8a8" --aux-layers 0,1,3 --samples-per-shard 4 >"$work/last.log" 2>&1; then
  echo "FAIL: a resume of --fp8-gemm shards without it was accepted"; exit 1
fi
grep -q -- "rerun with --fp8-gemm" "$work/last.log" || { cat "$work/last.log"; echo "FAIL: the refusal names no option"; exit 1; }
# A folder mixing plain and W8A8 shards (copied together by hand) is refused by train, naming both kinds.
run mpirun --oversubscribe -np 1 "$aerie" extract --model "$fp8" --prepared "$work/prepared.h5" \
    --output "$out/shards_plain4" --aux-layers 0,1,3 --samples-per-shard 4
mkdir -p "$out/mixed" && cp "$out/shards_plain4/shard-00000.h5" "$out/shards_w8a8/shard-00001.h5" \
  "$out/shards_w8a8/shard-00002.h5" "$out/mixed/"
if mpirun --oversubscribe -np 1 "$aerie" train --model "$fp8" --shards "$out/mixed" --vocab "$out/vocab.safetensors" \
    --output "$out/run_mixed" --steps 2 --batch-size 2 >"$work/last.log" 2>&1; then
  echo "FAIL: train accepted a folder of plain and W8A8 shards"; exit 1
fi
grep -q "mixes hidden states of two target precisions" "$work/last.log" ||
  { cat "$work/last.log"; echo "FAIL: the mixed-folder refusal names nothing"; exit 1; }
# A draft trained on W8A8 shards: its checkpoints and its export say so.
rm "$out/mixed/shard-00000.h5"
run mpirun --oversubscribe -np 1 "$aerie" train --model "$fp8" --shards "$out/mixed" --vocab "$out/vocab.safetensors" \
    --output "$out/run_w8a8" --steps 2 --batch-size 2 --allow-missing-shards
run mpirun --oversubscribe -np 1 "$aerie" export --model "$fp8" --checkpoint "$out/run_w8a8" --output "$out/export_w8a8"
grep -q '"target_gemm": *"w8a8-fp8-block, tp 1"' "$out/export_w8a8/config.json" ||
  { cat "$out/export_w8a8/config.json"; echo "FAIL: the export does not record the W8A8 hidden states"; exit 1; }
echo "deepseek_v3_fp8: extract --fp8-gemm ok, resume without it and a mixed shard folder refused, export records it"
# A draft shape of its own (SpecForge's DeepSeek-V3 draft is 56 heads / 8 kv / 40960): 6 heads of 8, 2 kv
# heads, MLP 80, exported as such; a resume with another shape is refused by name.
out="$work/own_shape"
run mpirun --oversubscribe -np 1 "$aerie" train --model "$src/tests/model/fixtures/hf/deepseek_v3" \
    --shards "$work/deepseek_v3/shards" --vocab "$work/deepseek_v3/vocab.safetensors" --output "$out/run" \
    --steps 2 --batch-size 2 --draft-heads 6 --draft-kv-heads 2 --draft-head-dim 8 --draft-intermediate 80
run mpirun --oversubscribe -np 1 "$aerie" export --model "$src/tests/model/fixtures/hf/deepseek_v3" \
    --checkpoint "$out/run" --output "$out/export"
for kv in '"num_attention_heads": *6' '"num_key_value_heads": *2' '"head_dim": *8' '"intermediate_size": *80'; do
  grep -q "$kv" "$out/export/config.json" || { cat "$out/export/config.json"; echo "FAIL: no $kv"; exit 1; }
done
if mpirun --oversubscribe -np 1 "$aerie" train --model "$src/tests/model/fixtures/hf/deepseek_v3" \
    --shards "$work/deepseek_v3/shards" --output "$out/run" --steps 2 --batch-size 2 --draft-heads 4 \
    --draft-kv-heads 2 --draft-head-dim 8 --draft-intermediate 80 >"$work/last.log" 2>&1; then
  echo "FAIL: a resume with another --draft-heads was accepted"; exit 1
fi
grep -q -- "--draft-heads" "$work/last.log" || { cat "$work/last.log"; echo "FAIL: the refusal names no option"; exit 1; }
echo "own draft shape: trained, exported, resume with another shape refused"
# The MLA draft (--draft-attention mla): trained on 2 ranks, exported for vLLM's Eagle3DeepseekV2ForCausalLM
# (the target's LoRA ranks and head dims); a resume as the Llama draft, a head override and the speculators
# format are refused by name. (Its eval is in deepseek_chat_pipeline.sh.)
out="$work/mla"
ds="$src/tests/model/fixtures/hf/deepseek_v3"
run mpirun --oversubscribe -np 2 "$aerie" train --model "$ds" --shards "$work/deepseek_v3/shards" \
    --vocab "$work/deepseek_v3/vocab.safetensors" --output "$out/run" --steps 4 --batch-size 2 --draft-attention mla
run mpirun --oversubscribe -np 1 "$aerie" export --model "$ds" --checkpoint "$out/run" --output "$out/export"
for kv in '"Eagle3DeepseekV2ForCausalLM"' '"model_type": *"deepseek_v2"' '"n_routed_experts": *0,' '"q_lora_rank": *32' '"kv_lora_rank": *32' '"v_head_dim": *16' '"yarn"'; do
  grep -q "$kv" "$out/export/config.json" || { cat "$out/export/config.json"; echo "FAIL: MLA export: no $kv"; exit 1; }
done
refused() {  # refused NEEDLE CMD...: the command must fail and name NEEDLE
  local needle=$1; shift
  if "$@" >"$work/last.log" 2>&1; then echo "FAIL: accepted: $*"; exit 1; fi
  grep -q -- "$needle" "$work/last.log" || { cat "$work/last.log"; echo "FAIL: the refusal names no $needle"; exit 1; }
}
refused "--draft-attention" mpirun --oversubscribe -np 1 "$aerie" train --model "$ds" --shards "$work/deepseek_v3/shards" \
    --output "$out/run" --steps 4 --batch-size 2
refused "--draft-heads" mpirun --oversubscribe -np 1 "$aerie" train --model "$ds" --shards "$work/deepseek_v3/shards" \
    --vocab "$work/deepseek_v3/vocab.safetensors" --output "$out/run2" --steps 1 --draft-attention mla --draft-heads 2
refused "--draft-norm-before-fc" mpirun --oversubscribe -np 2 "$aerie" train --model "$ds" \
    --shards "$work/deepseek_v3/shards" --vocab "$work/deepseek_v3/vocab.safetensors" --output "$out/run3" --steps 1 \
    --draft-attention mla --draft-norm-before-fc
refused "--draft-sliding-window goes with the Llama draft only" mpirun --oversubscribe -np 2 "$aerie" train --model "$ds" \
    --shards "$work/deepseek_v3/shards" --vocab "$work/deepseek_v3/vocab.safetensors" --output "$out/run5" --steps 1 \
    --draft-attention mla --draft-sliding-window 64
refused "use --draft-attention llama" mpirun --oversubscribe -np 2 "$aerie" train --model "$tok" \
    --shards "$work/deepseek_v3/shards" --vocab "$work/deepseek_v3/vocab.safetensors" --output "$out/run4" --steps 1 \
    --draft-attention mla --draft-fc-norm  # the target's lack of MLA is named first, not the option beside it
grep -q "MPI_ABORT" "$work/last.log" && { cat "$work/last.log"; echo "FAIL: the refusal went through MPI_Abort"; exit 1; }
refused "format eagle3" mpirun --oversubscribe -np 1 "$aerie" export --model "$ds" --checkpoint "$out/run" \
    --output "$out/export_spec" --format speculators --verifier x
echo "MLA draft: trained, exported for Eagle3DeepseekV2ForCausalLM; other attention on resume, head override," \
     "norm_before_fc, a sliding window, a Llama target (usage error on every rank) and the speculators format refused"
