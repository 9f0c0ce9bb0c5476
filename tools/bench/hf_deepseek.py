#!/usr/bin/env python3
"""transformers' DeepseekV3 forward as the reference of tools/bench/bench_deepseek.sh (issue 12, item 9).

Reads the config.json that bench_deepseek.sh wrote for aerie (DeepSeek-V3's or Kimi-K2.5's text shape,
truncated layers; a quantization_config is dropped: transformers runs bf16 weights), builds the model with
random bf16 weights on the GPU (DeepseekV3Model, attn_implementation sdpa, the experts' default
implementation, grouped_mm in transformers 5.x), and times for each --tokens T (one sequence of T tokens):
  - one DeepseekV3MoE block (the first MoE layer's mlp) on [1, T, H],
  - one DeepseekV3Attention block (causal, no cache) on [1, T, H],
  - unless --blocks-only, the whole model's forward with output_hidden_states (what an extraction needs).
FLOPs are counted as bench_deepseek.cc counts them (active parameters; causal QK^T over qk_head_dim, PV
over v_head_dim). One JSON object per line, as aerie's.

Usage: python3 tools/bench/hf_deepseek.py CONFIG_DIR [--tokens 2048,8192] [--iters 5] [--blocks-only]
"""
import argparse
import json

import torch

from hf_reference import timed  # tools/bench/hf_reference.py, beside this script


def hf_config(path, layers):
    import transformers
    from transformers import DeepseekV3Config

    c = json.load(open(path + "/config.json"))
    c.pop("quantization_config", None)
    rs = dict(c.pop("rope_scaling"))
    rs.pop("type", None)
    rp = dict(rs, rope_type="yarn", rope_theta=float(c.pop("rope_theta")))
    keep = {k: c[k] for k in ["vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
                              "num_attention_heads", "num_key_value_heads", "n_shared_experts",
                              "n_routed_experts", "routed_scaling_factor", "kv_lora_rank", "q_lora_rank",
                              "qk_rope_head_dim", "v_head_dim", "qk_nope_head_dim", "n_group", "topk_group",
                              "num_experts_per_tok", "first_k_dense_replace", "norm_topk_prob",
                              "max_position_embeddings", "rms_norm_eps"]}
    keep["num_hidden_layers"] = layers or c["num_hidden_layers"]
    cfg = DeepseekV3Config(**keep, rope_parameters=rp, attn_implementation="sdpa")
    return cfg, transformers.__version__


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config")
    p.add_argument("--tokens", default="2048,8192")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--layers", type=int, default=0, help="0: the config's")
    p.add_argument("--blocks-only", action="store_true")
    p.add_argument("--label", default="")
    p.add_argument("--peak-tflops", type=float, default=989.0)
    a = p.parse_args()
    from transformers import DeepseekV3Model

    cfg, version = hf_config(a.config, 2 if a.blocks_only else a.layers)
    if a.blocks_only:
        cfg.first_k_dense_replace = 1  # layer 0 dense, layer 1 MoE (only layer 1 is timed)
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)  # made in bf16 on the GPU: no fp32 copy of ~70 GB of experts
    with torch.device("cuda"):
        model = DeepseekV3Model(cfg).eval()
    torch.set_default_dtype(torch.float32)
    H, nh = cfg.hidden_size, cfg.num_attention_heads
    dk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    q = H * cfg.q_lora_rank + cfg.q_lora_rank * nh * dk
    kv = H * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) + cfg.kv_lora_rank * nh * (cfg.qk_nope_head_dim + cfg.v_head_dim)
    mla_proj = 2.0 * (q + kv + nh * cfg.v_head_dim * H)
    moe = 2.0 * ((cfg.num_experts_per_tok + cfg.n_shared_experts) * 3.0 * H * cfg.moe_intermediate_size +
                 H * cfg.n_routed_experts)
    dense = 2.0 * 3.0 * H * cfg.intermediate_size
    layer = model.layers[cfg.first_k_dense_replace]
    experts_impl = getattr(cfg, "_experts_implementation", None) or "default"
    impl = f"transformers {version} sdpa, experts {experts_impl}"
    for T in [int(t) for t in a.tokens.split(",")]:
        x = torch.randn(1, T, H, device="cuda", dtype=torch.bfloat16)
        pos = torch.arange(T, device="cuda")[None]
        with torch.no_grad():
            pe = model.rotary_emb(x, pos)
            torch.cuda.reset_peak_memory_stats()
            s = timed(lambda: layer.mlp(x), a.warmup, a.iters)
            tf = moe * T / s / 1e12
            print(json.dumps({"bench": "deepseek_block", "label": a.label, "impl": impl, "block": "moe",
                              "n_routed_experts": cfg.n_routed_experts, "tokens": T, "ms": s * 1e3,
                              "active_tflops": tf, "mfu": tf / a.peak_tflops,
                              "peak_gib": torch.cuda.max_memory_allocated() / 2**30}), flush=True)
            s = timed(lambda: layer.self_attn(hidden_states=x, position_embeddings=pe, attention_mask=None),
                      a.warmup, a.iters)
            tf = (mla_proj * T + 2.0 * T * T / 2 * nh * (dk + cfg.v_head_dim)) / s / 1e12
            print(json.dumps({"bench": "deepseek_block", "label": a.label, "impl": impl, "block": "mla",
                              "heads": nh, "tokens": T, "ms": s * 1e3, "tflops": tf, "mfu": tf / a.peak_tflops}),
                  flush=True)
            if a.blocks_only:
                continue
            ids = torch.randint(0, cfg.vocab_size, (1, T), device="cuda")
            s = timed(lambda: model(input_ids=ids, output_hidden_states=True, use_cache=False), a.warmup, a.iters)
            N = cfg.num_hidden_layers
            flops = sum(mla_proj * T + 2.0 * T * T / 2 * nh * (dk + cfg.v_head_dim) +
                        (moe if l >= cfg.first_k_dense_replace else dense) * T for l in range(N))
            print(json.dumps({"bench": "deepseek_forward", "label": a.label, "impl": impl, "layers": N,
                              "tokens": T, "seconds": s, "tokens_per_s": T / s, "tflops": flops / s / 1e12,
                              "mfu": flops / s / 1e12 / a.peak_tflops,
                              "peak_gib": torch.cuda.max_memory_allocated() / 2**30}), flush=True)


if __name__ == "__main__":
    main()
