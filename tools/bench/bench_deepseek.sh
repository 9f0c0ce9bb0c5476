#!/usr/bin/env bash
# The DeepSeek-V3-architecture extraction benchmark (issue 12, item 9), on one GPU, in one call:
#   1. writes two configs (the real checkpoints' config.json fields, ../shared/data/kimi-deepseek-configs,
#      truncated to LAYERS layers with layer 0 dense and the rest MoE):
#        kimi_k25_int4:  Kimi-K2.5's text model (H 7168, 64 MLA heads, 384 routed experts + 1 shared, top-8,
#                        YaRN 64) with its compressed-tensors INT4 quantization_config (routed experts INT4);
#        deepseek_v3:    DeepSeek-V3 (128 heads, 256 experts, grouped routing 8/4) with bf16 experts;
#        deepseek_v3_fp8 (FP8=1): the same with its block-FP8 quantization_config (every Linear FP8);
#        kimi_k25_int4_tp8_rank (TP8_RANK=1, the default): one tp 8 rank of Kimi-K2.5 (heads and every
#                        intermediate / 8), aerie only;
#   2. runs BUILD_DIR/bench_deepseek on each (random weights in those formats: one MoE block, one MLA
#      block, the whole forward; tools/bench/bench_deepseek.cc says what is counted);
#   3. runs transformers' DeepseekV3 (tools/bench/hf_deepseek.py, bf16 weights) on the same shapes when
#      torch and transformers import: DeepSeek-V3's whole model and blocks, Kimi-K2.5's blocks.
# Prints JSON lines. Environment: TOKENS (2048,8192), LAYERS (4), ITERS (5), WORK (scratch folder), FP8 (0), TP8_RANK (1), EP8_RANK (1),
#   SKIP_HF (1: no transformers run), PEAK_TFLOPS (989: H100/H200 SXM dense bf16), CONFIGS ("kimi_k25_int4
#   deepseek_v3": which of the two to run), BLOCKS_ONLY (1: the blocks, not the whole forward).
# Usage: tools/bench/bench_deepseek.sh [BUILD_DIR]
set -euo pipefail
case "${1:-}" in -h | --help)
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 0 ;;
esac
BUILD=${1:-build}
TOKENS=${TOKENS:-2048,8192}
LAYERS=${LAYERS:-4}
ITERS=${ITERS:-5}
PEAK_TFLOPS=${PEAK_TFLOPS:-989}
CONFIGS=${CONFIGS:-kimi_k25_int4 deepseek_v3}
WORK=${WORK:-$(mktemp -d /tmp/aerie-bench-deepseek.XXXXXX)}
BENCH=$BUILD/bench_deepseek
[ -x "$BENCH" ] || { echo "bench_deepseek: no $BENCH (a CUDA build makes it)" >&2; exit 2; }

python3 - "$WORK" "$LAYERS" <<'PY'
import json, os, sys
work, layers = sys.argv[1], int(sys.argv[2])
common = dict(model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"], hidden_size=7168,
              intermediate_size=18432, moe_intermediate_size=2048, num_hidden_layers=layers, n_shared_experts=1,
              kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128,
              num_experts_per_tok=8, first_k_dense_replace=1, norm_topk_prob=True, topk_method="noaux_tc",
              scoring_func="sigmoid", moe_layer_freq=1, hidden_act="silu", tie_word_embeddings=False,
              torch_dtype="bfloat16", num_nextn_predict_layers=0)
ds = dict(common, vocab_size=129280, num_attention_heads=128, num_key_value_heads=128, n_routed_experts=256,
          routed_scaling_factor=2.5, n_group=8, topk_group=4, rope_theta=10000, max_position_embeddings=163840,
          rms_norm_eps=1e-6, rope_scaling={"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                                           "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                                           "type": "yarn"})
kimi = dict(common, vocab_size=163840, num_attention_heads=64, num_key_value_heads=64, n_routed_experts=384,
            routed_scaling_factor=2.827, n_group=1, topk_group=1, rope_theta=50000.0, max_position_embeddings=262144,
            rms_norm_eps=1e-5, rope_scaling={"beta_fast": 32.0, "beta_slow": 1.0, "factor": 64.0, "mscale": 1.0,
                                             "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                                             "type": "yarn"},
            quantization_config={
                "config_groups": {"group_0": {"input_activations": None, "output_activations": None,
                                              "targets": ["Linear"],
                                              "weights": {"actorder": None, "block_structure": None, "dynamic": False,
                                                          "group_size": 32, "num_bits": 4, "observer": "minmax",
                                                          "observer_kwargs": {}, "strategy": "group",
                                                          "symmetric": True, "type": "int"}}},
                "format": "pack-quantized",
                "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
                           "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
                "kv_cache_scheme": None, "quant_method": "compressed-tensors", "quantization_status": "compressed"})
fp8 = dict(ds, quantization_config={"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                    "weight_block_size": [128, 128]})
# One rank of Kimi-K2.5 at tp 8: the heads, the dense and shared intermediates and every expert's
# intermediate divided by 8, as aerie's tensor parallelism splits them (the compute of one rank; no
# all-reduce on one GPU).
kimi_tp8 = dict(kimi, num_attention_heads=8, num_key_value_heads=8, intermediate_size=18432 // 8,
                moe_intermediate_size=2048 // 8)
for name, c in [("kimi_k25_int4", kimi), ("deepseek_v3", ds), ("deepseek_v3_fp8", fp8), ("kimi_k25_int4_tp8_rank", kimi_tp8)]:
    os.makedirs(f"{work}/{name}", exist_ok=True)
    json.dump(c, open(f"{work}/{name}/config.json", "w"), indent=1)
PY

run_aerie() {  # NAME [more bench_deepseek options]
  local name=$1; shift
  "$BENCH" --config "$WORK/$name" --tokens "$TOKENS" --iters "$ITERS" --peak-tflops "$PEAK_TFLOPS" --label "$name" "$@"
}
blocks=(); [ "${BLOCKS_ONLY:-0}" = 1 ] && blocks=(--no-forward)
wants() { case " $CONFIGS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
if wants kimi_k25_int4; then run_aerie kimi_k25_int4 "${blocks[@]}"; fi
if wants deepseek_v3; then run_aerie deepseek_v3 "${blocks[@]}"; fi
if [ "${FP8:-0}" = 1 ]; then run_aerie deepseek_v3_fp8 --no-forward; fi
if [ "${TP8_RANK:-1}" = 1 ]; then run_aerie kimi_k25_int4_tp8_rank "${blocks[@]}"; fi
# One rank of tp 8 with the experts split by expert (48 whole experts, ~1/8 of the pairs) against the
# line above (every expert's 1/8): the blocks only (EP8_RANK=0 leaves it out).
if [ "${EP8_RANK:-1}" = 1 ]; then
  run_aerie kimi_k25_int4 --no-forward --rank-of 8 --expert-parallel --label kimi_k25_int4_ep8_rank
fi

if [ "${SKIP_HF:-0}" != 1 ] && python3 -c "import torch, transformers" 2>/dev/null; then
  hf=$(dirname "$0")/hf_deepseek.py
  hf_blocks=(); [ "${BLOCKS_ONLY:-0}" = 1 ] && hf_blocks=(--blocks-only)
  if wants deepseek_v3; then
    python3 "$hf" "$WORK/deepseek_v3" --tokens "$TOKENS" --iters "$ITERS" --label deepseek_v3 \
      --peak-tflops "$PEAK_TFLOPS" "${hf_blocks[@]}"
  fi
  if wants kimi_k25_int4; then
    python3 "$hf" "$WORK/kimi_k25_int4" --tokens "$TOKENS" --iters "$ITERS" --label kimi_k25_bf16 --blocks-only \
      --peak-tflops "$PEAK_TFLOPS"
  fi
fi
