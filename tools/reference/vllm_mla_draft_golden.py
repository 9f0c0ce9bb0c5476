#!/usr/bin/env python3
"""Golden step-0 logits of an MLA draft export as vLLM 0.26.0 computes them, written from vLLM's released code.

aerie's MLA draft export (`export --for vllm` of a `train --draft-attention mla` run) is read by vLLM's
Eagle3DeepseekV2ForCausalLM. Whether the engine computes the draft as trained could not be shown through a
random-weight DeepSeek/Kimi target (docs/performance.md: its greedy answers part between engines within a few
dozen tokens), so this checks the draft alone: the export's config keys and tensors read the way vLLM 0.26.0 reads
them, on fixed inputs, in float64. The math, from the wheel (`pip download --no-deps vllm==0.26.0`):
  - model_executor/models/deepseek_eagle3.py: fc on the concatenated aux hidden states (no fc_norm); layer 0:
    embeds = input_layernorm(embed_tokens[ids]); hidden, residual = hidden_norm(h), and the residual is the normed
    hidden under norm_before_residual (else the raw one); attention over cat([embeds, hidden]) (input width 2H);
    post_attention_layernorm(attn, residual) adds the residual first (fused add + norm); the dense MLP; the final
    norm(mlp, residual) likewise; lm_head over the draft vocabulary.
  - model_executor/models/deepseek_v2.py, DeepseekV2MLAAttention: q = q_b_proj(q_a_layernorm(q_a_proj(x))) (or
    q_proj), [c | k_pe] = kv_a_proj_with_mqa(x), [k_nope | v] = kv_b_proj(kv_a_layernorm(c)) per head, the rope on
    q_pe and the shared k_pe with is_neox_style=False, softmax scale qk_head_dim^-0.5 times
    yarn_get_mscale(factor, mscale_all_dim)^2 when rope_scaling is set (the config's rope_type becomes
    "deepseek_yarn" in deepseek_eagle3.py).
  - model_executor/layers/rotary_embedding: get_rope's deepseek_yarn -> DeepseekScalingRotaryEmbedding with
    max_position_embeddings = original_max_position_embeddings: inv_freq blends interpolation (1 / (factor *
    base^(2i/d))) and extrapolation by yarn_linear_ramp_mask over yarn_find_correction_range(beta_fast, beta_slow);
    cos/sin times yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim); rotate_gptj pairs
    (2i, 2i+1).
Row t of the golden is the draft at position t reading token ids[t] and aux hidden states aux[t] (vLLM's draft
input: the target's next token and the hidden states of the position before it), causal over rows 0..t.

    /tmp/venv/bin/python tools/reference/vllm_mla_draft_golden.py EXPORT_DIR TARGET_DIR OUT_DIR [--tokens 80]

Writes OUT_DIR/config.json (the export's, without its provenance keys), OUT_DIR/model.safetensors (the export's tensors, names, shapes and dtypes,
with every float tensor redrawn: norms 1 + N(0, 0.2), matrices N(0, 1 / fan_in), rounded to the stored bf16, so that
a swapped norm or matrix cannot hide behind unit weights) and OUT_DIR/golden.safetensors: ids I32 [T], aux F32
[T, 3 H_t], logits F32 [T, K]. The target's embed_tokens comes from TARGET_DIR/model.safetensors (vLLM shares the
target's embedding with a draft that ships none). Needs torch and safetensors.
"""
import argparse
import json
import math
import os

import torch
from safetensors.torch import load_file, save_file


def yarn_get_mscale(scale, mscale=1.0):
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_inv_freq(rotary_dim, base, factor, original_max, beta_fast, beta_slow):
    def correction_dim(rot):
        return rotary_dim * math.log(original_max / (rot * 2 * math.pi)) / (2 * math.log(base))
    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), rotary_dim - 1)
    if low == high:
        high += 0.001
    pos_freqs = base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    ramp = torch.clamp((torch.arange(rotary_dim // 2, dtype=torch.float64) - low) / (high - low), 0, 1)
    mask = 1 - ramp  # extrapolation_factor 1
    return (1.0 / (factor * pos_freqs)) * (1 - mask) + (1.0 / pos_freqs) * mask


def rope_gptj(x, positions, inv_freq, mscale):
    """x [T, ..., d]: pairs (2i, 2i+1) rotated by positions * inv_freq[i], times mscale (vLLM's cos/sin cache)."""
    freqs = positions[:, None] * inv_freq[None, :]  # [T, d/2]
    cos = (freqs.cos() * mscale).repeat_interleave(2, dim=-1)
    sin = (freqs.sin() * mscale).repeat_interleave(2, dim=-1)
    shape = [x.shape[0]] + [1] * (x.dim() - 2) + [x.shape[-1]]
    cos, sin = cos.reshape(shape), sin.reshape(shape)
    x1, x2 = x[..., ::2], x[..., 1::2]
    rotated = torch.stack((-x2, x1), dim=-1).flatten(-2)
    return x * cos + rotated * sin


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def draft_logits(c, w, embed, ids, aux):
    """vLLM 0.26.0's Eagle3DeepseekV2ForCausalLM forward (one layer) and compute_logits before the d2t scatter."""
    eps, H = c["rms_norm_eps"], c["hidden_size"]
    nh, nope, rope_d, vd, lora = (c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"],
                                  c["v_head_dim"], c["kv_lora_rank"])
    T = ids.shape[0]
    L = "midlayer."
    lin = lambda name, x: x @ w[name + ".weight"].T
    hidden = aux @ w["fc.weight"].T
    e = rms(embed[ids], w[L + "input_layernorm.weight"], eps)
    hn = rms(hidden, w[L + "hidden_norm.weight"], eps)
    residual = hn if c.get("norm_before_residual", False) else hidden
    x = torch.cat([e, hn], dim=-1)  # [T, 2H]
    a = L + "self_attn."
    if c.get("q_lora_rank"):
        q = lin(a + "q_b_proj", rms(lin(a + "q_a_proj", x), w[a + "q_a_layernorm.weight"], eps))
    else:
        q = lin(a + "q_proj", x)
    q = q.reshape(T, nh, nope + rope_d)
    kv_a = lin(a + "kv_a_proj_with_mqa", x)
    latent, k_pe = kv_a[:, :lora], kv_a[:, lora:]
    kv = lin(a + "kv_b_proj", rms(latent, w[a + "kv_a_layernorm.weight"], eps)).reshape(T, nh, nope + vd)
    k_nope, v = kv[..., :nope], kv[..., nope:]
    scale = (nope + rope_d) ** -0.5
    positions = torch.arange(T, dtype=torch.float64)
    rs = c.get("rope_scaling")
    if rs:
        factor = rs["factor"]
        inv = yarn_inv_freq(rope_d, c["rope_theta"], factor, rs["original_max_position_embeddings"],
                            rs.get("beta_fast", 32), rs.get("beta_slow", 1))
        mscale = yarn_get_mscale(factor, rs.get("mscale", 1)) / yarn_get_mscale(factor, rs.get("mscale_all_dim", 0))
        scale *= yarn_get_mscale(factor, float(rs.get("mscale_all_dim", False))) ** 2
    else:
        inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, rope_d, 2, dtype=torch.float64) / rope_d))
        mscale = 1.0
    q_pe = rope_gptj(q[..., nope:], positions, inv, mscale)
    k_pe = rope_gptj(k_pe[:, None, :], positions, inv, mscale).expand(T, nh, rope_d)
    qf = torch.cat([q[..., :nope], q_pe], dim=-1)  # [T, nh, nope + rope]
    kf = torch.cat([k_nope, k_pe], dim=-1)
    s = torch.einsum("thd,uhd->htu", qf, kf) * scale
    s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1)[None], float("-inf"))
    o = torch.einsum("htu,uhd->thd", torch.softmax(s, dim=-1), v).reshape(T, nh * vd)
    attn = lin(a + "o_proj", o)
    residual = attn + residual
    h = rms(residual, w[L + "post_attention_layernorm.weight"], eps)
    m = L + "mlp."
    mlp = lin(m + "down_proj", torch.nn.functional.silu(lin(m + "gate_proj", h)) * lin(m + "up_proj", h))
    residual = mlp + residual
    return rms(residual, w["norm.weight"], eps) @ w["lm_head.weight"].T


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("export_dir")
    p.add_argument("target_dir")
    p.add_argument("out_dir")
    p.add_argument("--tokens", type=int, default=80, help="rows (past the fixture's original_max_position 64)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    c = json.load(open(os.path.join(a.export_dir, "config.json")))
    stored = load_file(os.path.join(a.export_dir, "model.safetensors"))
    g = torch.Generator().manual_seed(a.seed)
    redrawn = {}
    for name, t in sorted(stored.items()):
        if not t.is_floating_point():
            redrawn[name] = t
        elif t.dim() == 1:
            redrawn[name] = (1 + 0.2 * torch.randn(t.shape, generator=g, dtype=torch.float64)).to(t.dtype)
        else:
            redrawn[name] = (torch.randn(t.shape, generator=g, dtype=torch.float64) / math.sqrt(t.shape[1])).to(t.dtype)
    target = load_file(os.path.join(a.target_dir, "model.safetensors"))
    embed = next(v for k, v in target.items() if k.endswith("embed_tokens.weight")).to(torch.float64)
    w = {k: v.to(torch.float64) for k, v in redrawn.items() if v.is_floating_point()}
    T, V = a.tokens, c["vocab_size"]
    ids = torch.randint(0, V, (T,), generator=g)
    aux = torch.randn(T, w["fc.weight"].shape[1], generator=g, dtype=torch.float64).to(torch.float32)
    logits = draft_logits(c, w, embed, ids, aux.to(torch.float64))
    os.makedirs(a.out_dir, exist_ok=True)
    # The export's config without its provenance (local paths of the run that made it).
    kept = {k: v for k, v in c.items() if k not in ("aerie_checkpoint", "aerie_version")}
    with open(os.path.join(a.out_dir, "config.json"), "w") as f:
        json.dump(kept, f, indent=2)
        f.write("\n")
    save_file(redrawn, os.path.join(a.out_dir, "model.safetensors"))
    save_file({"ids": ids.to(torch.int32), "aux": aux, "logits": logits.to(torch.float32)},
              os.path.join(a.out_dir, "golden.safetensors"))
    print(f"vllm_mla_draft_golden: {T} rows, K {logits.shape[1]}, |logits| max {logits.abs().max():.3f} -> {a.out_dir}")


if __name__ == "__main__":
    main()
