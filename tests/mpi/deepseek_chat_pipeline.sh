#!/usr/bin/env bash
# The whole pipeline with real conversations on the tiny DeepSeek-V3-architecture fixtures
# (tests/model/fixtures/hf), on the CPU: generate, prepare with the model's chat template, extract, vocab,
# train on 2 ranks, export, and `aerie eval` with its lossless check (speculative decoding's output must
# equal plain greedy decoding of the target, token for token, for the trained and the untrained draft).
#
# The fixtures' vocabulary (256) is no tokenizer's. So at test time tests/tools/widen_vocab.cc (built with
# the tests) copies a fixture into WORK_DIR with embed_tokens and lm_head widened to the real model's
# vocab_size (the fixture's rows kept bit for bit, the new rows deterministic pseudo-random, uniform in the
# fixture's range), vocab_size / bos / eos / pad patched in config.json (text_config for Kimi-K2.5), and the
# tokenizer's files beside the weights: the widened folder is --model and --tokenizer at once. Nothing is
# committed; the copies are about 20-45 MB each (bf16 [V, 64] tables).
#   deepseek_v3_fp8 (block-FP8)     + ../shared/data/tokenizers/deepseek-v3 (V 129280), template deepseek-v3
#   kimi_k25_int4 (Kimi-K2.5, INT4) + ../shared/data/tokenizers/kimi-k2     (V 163840), template kimi-k2
# The chain is the one for a chat target (docs/preparing-data.md, sections 4-5): `aerie generate`
# regenerates the assistant turns of the first 16 sharegpt-fastchat conversations with the target (greedy,
# 16 new tokens, the template's generation prompt), `prepare` renders and tokenizes them with the same
# template, then extract, vocab (K 256), train (40 steps of 4 samples on 2 ranks: enough for the draft to
# learn these few answers), export, and eval on the first user turns of the same conversations (8 prompts,
# 16 new tokens, chains of 3), at tp 1 (2 data-parallel ranks), at tp 2 (the MLA heads split) and at tp 2
# with --expert-parallel (4 whole experts per rank).
# Checked: eval is lossless for the trained and (at tp 1) the untrained draft; the trained draft's
# acceptance length is above the untrained one's (so draft tokens were accepted, and the lossless check
# covered the verified chains kept in the latent KV cache, not only rejections); tp 2 and ep 2 give tp 1's tokens
# and figures (in f32 the other summation order of the all-reduce flips no argmax of these runs); eval's
# prompt is rendered with the template's special tokens. The weights are random: the acceptance length
# measures recall of the training answers, not a draft's quality (2026-12-05, on a 2-core x86-64 machine:
# DeepSeek-V3 FP8 3.33, Kimi-K2.5 INT4 3.53, untrained 1.0; the figures move with any change of the
# training's arithmetic or defaults, which is why only "above untrained" is checked). Then the MLA draft
# (--draft-attention mla) on the same shards: trained, exported for vLLM's Eagle3DeepseekV2ForCausalLM, eval
# lossless (trained and untrained) and accepted more than untrained (3.53 and 3.16 that day). About a minute
# on 2 cores.
# usage: deepseek_chat_pipeline.sh AERIE WIDEN_VOCAB SOURCE_DIR SHARED_DATA WORK_DIR
# Exits 77 (CTest: skipped) when SHARED_DATA lacks the tokenizers or the conversations.
set -euo pipefail
aerie=$1 widen=$2 src=$3 data=$4 work=$5
for f in tokenizers/deepseek-v3/tokenizer.json tokenizers/kimi-k2/tiktoken.model \
         sharegpt-fastchat/dummy_conversation.json; do
  [ -f "$data/$f" ] || { echo "no $data/$f: skipped"; exit 77; }
done
export OPENBLAS_NUM_THREADS=1
rm -rf "$work" && mkdir -p "$work"
run() { "$@" >"$work/last.log" 2>&1 || { cat "$work/last.log"; echo "FAIL: $*"; exit 1; }; }
fail() { echo "FAIL: $*"; exit 1; }
t0=$SECONDS
# A number of eval.json (the first match of "KEY": VALUE).
num() { grep -o "\"$1\": *[0-9.e+-]*" "$2" | head -1 | sed 's/.*: *//'; }
# fixture, tokenizer folder, the real model's vocab_size, template, a special token of the template
for c in "deepseek_v3_fp8 deepseek-v3 129280 deepseek-v3 <｜User｜>" \
         "kimi_k25_int4 kimi-k2 163840 kimi-k2 <|im_user|>user<|im_middle|>"; do
  read -r m tokdir V tmpl marker <<<"$c"
  out="$work/$m" model="$work/$m/model"
  # Kimi-K2.5 runs with the shipped settings for the real model (configs/runs/kimi-k25: every key must parse
  # and work), the fixture's sizes given on the command line, which overrides them (tp, lengths, steps,
  # vocabulary, f32 for the exact lossless check); its fp8 shards are extracted, trained on and evaluated.
  kc() { [ "$m" = kimi_k25_int4 ] && printf -- '--config\n%s\n' "$src/configs/runs/kimi-k25/$1.ini"; return 0; }
  mapfile -t c_prepare < <(kc prepare); mapfile -t c_extract < <(kc extract); mapfile -t c_vocab < <(kc vocab)
  mapfile -t c_train < <(kc train); mapfile -t c_eval < <(kc eval)
  run "$widen" "$src/tests/model/fixtures/hf/$m" "$data/tokenizers/$tokdir" "$V" "$model"
  run mpirun --oversubscribe -np 2 "$aerie" generate --model "$model" --device cpu \
      --input "$data/sharegpt-fastchat/dummy_conversation.json" --format sharegpt --template "$tmpl" \
      --max-conversations 16 --max-new-tokens 16 --output "$out/regen.jsonl"
  run mpirun --oversubscribe -np 2 "$aerie" prepare "${c_prepare[@]}" --input "$out/regen.jsonl" --tokenizer "$model" \
      --template "$tmpl" --max-length 256 --output "$out/prepared.h5"
  run mpirun --oversubscribe -np 2 "$aerie" extract "${c_extract[@]}" --model "$model" --device cpu \
      --prepared "$out/prepared.h5" --output "$out/shards" --aux-layers 0,1,3 --samples-per-shard 8 --tp 1
  run mpirun --oversubscribe -np 1 "$aerie" vocab "${c_vocab[@]}" --model "$model" --prepared "$out/prepared.h5" \
      --output "$out/vocab.safetensors" --draft-vocab-size 256
  run mpirun --oversubscribe -np 2 "$aerie" train "${c_train[@]}" --model "$model" --device cpu --shards "$out/shards" \
      --vocab "$out/vocab.safetensors" --output "$out/run" --steps 40 --batch-size 4 --lr 1e-2 --eval-fraction 0
  if [ "$m" = kimi_k25_int4 ]; then
    grep -q "hidden states stored as fp8" "$work/last.log" || { cat "$work/last.log"; fail "$m: not fp8 shards (extract.ini)"; }
  fi
  run mpirun --oversubscribe -np 1 "$aerie" export --model "$model" --checkpoint "$out/run" --output "$out/export"
  grep -q "\"vocab_size\": *$V" "$out/export/config.json" || fail "$m: the export's vocab_size is not $V"
  # tp 1 with the untrained draft too (eval's "lossless" then covers both); tp 2 the trained one only,
  # with the experts split by intermediate size and by expert (--expert-parallel: "ep2").
  for tp in 1 2 ep2; do
    untrained=() && [ $tp = 1 ] && untrained=(--untrained)
    split=(--tp "${tp#ep}") && [ $tp = ep2 ] && split+=(--expert-parallel)
    run mpirun --oversubscribe -np 2 "$aerie" eval "${c_eval[@]}" --model "$model" --draft "$out/export" --device cpu \
        --dtype f32 "${split[@]}" \
        --chat-template "$tmpl" --prompts "$out/regen.jsonl" --num-prompts 8 --max-new-tokens 16 \
        --num-draft-tokens 3 "${untrained[@]}" --output "$out/eval_tp$tp.json"
    j="$out/eval_tp$tp.json"
    for kv in '"lossless": true' '"lossless_failures": 0' '"num_prompts": 8'; do
      grep -q "$kv" "$j" || { cat "$j"; fail "$m: tp $tp: eval.json has no $kv"; }
    done
    grep -qF "$marker" "$j" || { cat "$j"; fail "$m: eval's prompt was not rendered with the $tmpl template"; }
  done
  j="$out/eval_tp1.json"
  acc=$(num acceptance_length "$j") acc_u=$(num acceptance_length_untrained "$j")
  awk -v a="$acc" -v u="$acc_u" 'BEGIN { exit !(a > u) }' ||
    { cat "$j"; fail "$m: the trained draft's acceptance length $acc is not above the untrained one's $acc_u"; }
  grep -q '"lossless_failures_untrained": 0' "$j" ||
    { cat "$j"; fail "$m: eval is not lossless with the untrained draft"; }
  for other in tp2 tpep2; do
    for k in acceptance_length tokens_generated verify_passes greedy_tokens; do
      [ "$(num $k "$j")" = "$(num $k "$out/eval_$other.json")" ] || fail "$m: eval's $k differs between tp 1 and $other"
    done
    [ "$(grep '"output"' "$j")" = "$(grep '"output"' "$out/eval_$other.json")" ] || fail "$m: $other decoded other tokens"
  done
  echo "$m ($tmpl, V $V): generate, prepare, extract, vocab, train, export, eval at tp 1, tp 2 and ep 2 ok: lossless," \
       "acceptance length $acc (untrained $acc_u), $(num tokens_generated "$j") tokens (${SECONDS}s)"
  # The MLA draft (--draft-attention mla, issue 15): the same shards and recipe, exported in the layout of
  # vLLM's Eagle3DeepseekV2ForCausalLM, and eval lossless with it and with its untrained twin.
  run mpirun --oversubscribe -np 2 "$aerie" train "${c_train[@]}" --model "$model" --device cpu --shards "$out/shards" \
      --vocab "$out/vocab.safetensors" --output "$out/run_mla" --steps 40 --batch-size 4 --lr 1e-2 --eval-fraction 0 \
      --draft-attention mla
  grep -q "draft layer: MLA" "$work/last.log" || { cat "$work/last.log"; fail "$m: train did not log the MLA draft"; }
  run mpirun --oversubscribe -np 1 "$aerie" export --model "$model" --checkpoint "$out/run_mla" --output "$out/export_mla"
  for kv in '"Eagle3DeepseekV2ForCausalLM"' '"kv_lora_rank": *32' '"qk_rope_head_dim": *8'; do
    grep -q "$kv" "$out/export_mla/config.json" || { cat "$out/export_mla/config.json"; fail "$m: MLA export has no $kv"; }
  done
  run mpirun --oversubscribe -np 1 "$aerie" eval "${c_eval[@]}" --model "$model" --draft "$out/export_mla" --device cpu \
      --dtype f32 --tp 1 \
      --chat-template "$tmpl" --prompts "$out/regen.jsonl" --num-prompts 8 --max-new-tokens 16 \
      --num-draft-tokens 3 --untrained --output "$out/eval_mla.json"
  j="$out/eval_mla.json"
  for kv in '"lossless": true' '"lossless_failures": 0' '"lossless_failures_untrained": 0'; do
    grep -q "$kv" "$j" || { cat "$j"; fail "$m: MLA draft: eval.json has no $kv"; }
  done
  acc_m=$(num acceptance_length "$j") acc_mu=$(num acceptance_length_untrained "$j")
  awk -v a="$acc_m" -v u="$acc_mu" 'BEGIN { exit !(a > u) }' ||
    { cat "$j"; fail "$m: the trained MLA draft's acceptance length $acc_m is not above the untrained one's $acc_mu"; }
  echo "$m: MLA draft trained, exported, eval lossless: acceptance length $acc_m (Llama draft $acc, untrained $acc_mu)"
done
echo "deepseek_chat_pipeline: $((SECONDS - t0))s"
