#!/usr/bin/env python3
"""A random-weight DeepSeek-V3 checkpoint with block-FP8 weights, in shapes that the serving engines' kernels take.

The parity fixtures of tests/model/fixtures/hf (hidden 64, kv_lora_rank 32, qk_rope_head_dim 8) are too small for
vLLM's MLA and block-FP8 kernels; this writes the same architecture at engine-sized head dimensions (MLA with
kv_lora_rank 512, qk_nope 128, qk_rope 64, v_head 128 as DeepSeek-V3 has them; every FP8 matrix a whole number of
128 x 128 blocks but DeepSeek's own partial one, kv_a_proj_with_mqa's 576 rows), few layers, few experts and the
real tokenizer's vocabulary, so that one checkpoint is read by `aerie` and by vLLM alike:

    python3 tools/bench/make_random_deepseek.py OUT_DIR --tokenizer ../shared/data/tokenizers/deepseek-v3
        [--layers 8] [--hidden 1024] [--heads 8] [--experts 16] [--seed 0]
    python3 tools/bench/make_random_deepseek.py OUT_DIR --format kimi-k25-int4 --tokenizer ../shared/data/tokenizers/kimi-k2

OUT_DIR gets config.json (DeepSeek-V3's layout: quantization_config fp8 e4m3, weight_block_size [128, 128],
rope_scaling {"type": "yarn", ...}), model.safetensors and the tokenizer's tokenizer.json / tokenizer_config.json.
Tensor names and formats are DeepSeek-V3's (../shared/docs/deepseek-v3.md section 5): every Linear of attention,
the dense MLP, the routed and the shared experts is F8_E4M3 [N, K] with weight_scale_inv F32 [ceil(N/128),
ceil(K/128)] (the dequantized weight is fp8 * scale_inv, per block); embed_tokens, lm_head, the norms and the router
(gate.weight BF16, e_score_correction_bias F32) are not quantized. Layer 0 is dense (first_k_dense_replace 1), the
others MoE (noaux_tc: n_group 4, topk_group 2, sigmoid scores, routed_scaling_factor 2.5).

--format kimi-k25-int4 writes Kimi-K2.5 instead: the multimodal wrapper's config.json (model_type kimi_k25, the text
model in text_config with Kimi-K2.5's routing (n_group 1, routed_scaling_factor 2.827), YaRN factor 64 and rope_theta
5e4, Kimi-K2.5's vision_config, which engines read even when they serve the text alone) and the text model's tensors
under language_model.*, with only the routed experts quantized, as compressed-tensors pack-quantized INT4
(weight_packed I32 [N, K/8]: 8 signed 4-bit values per word, value j of a row in bits 4(j%8).. as q + 8;
weight_scale BF16 [N, K/32]; weight_shape I32 [2]; symmetric, group 32, dequantized as q * scale), everything else
BF16 (Kimi-K2.5's quantization_config ignores attention, dense MLPs and shared experts). No vision tower tensors:
aerie skips them and an engine serving the text alone does not build the tower. The tokenizer folder's
tiktoken.model and tokenizer_config.json are copied.

Weights: normal(0, 0.02) (initializer_range) with numpy's PCG64 from --seed, norms 1, the correction bias 0; the
lm_head's standard deviation is --lm-head-std (default 0.1): a random model's logits are otherwise so flat that
bf16 roundings of two engines pick different argmaxes at most steps, and their greedy outputs part at once; the
routers' is --router-std (default 0.02), at which the top-k experts of a token flip between two engines' roundings
often enough that their greedy outputs part within a few dozen tokens (a draft trained on one engine's answers then
meets other continuations in the other). The weights are random: what a draft learns of this target measures whether an engine serves the draft as trained,
not a draft's quality. Needs numpy only (the safetensors file and the e4m3 rounding are written here).
"""
import argparse
import json
import os
import shutil
import struct
import sys

import numpy as np

BLOCK = 128
E4M3_MAX = 448.0


def e4m3_table():
    """The 127 non-negative finite float8 e4m3fn values, ascending, indexed by their code (0x00-0x7E)."""
    codes = np.arange(0x7F, dtype=np.uint32)
    e = (codes >> 3) & 0xF
    m = (codes & 7).astype(np.float64)
    sub = m / 8.0 * 2.0 ** -6
    norm = (1.0 + m / 8.0) * 2.0 ** (e.astype(np.float64) - 7.0)
    return np.where(e == 0, sub, norm)


_E4M3 = e4m3_table()


def to_e4m3(x):
    """float32 array -> uint8 e4m3fn codes, round to nearest, ties to the even code; |x| > 448 saturates."""
    a = np.minimum(np.abs(x).astype(np.float64), E4M3_MAX)
    hi = np.clip(np.searchsorted(_E4M3, a), 1, len(_E4M3) - 1)
    lo = hi - 1
    dlo, dhi = a - _E4M3[lo], _E4M3[hi] - a
    pick_hi = (dhi < dlo) | ((dhi == dlo) & (hi % 2 == 0))
    code = np.where(pick_hi, hi, lo).astype(np.uint8)
    return code | np.where(np.signbit(x), np.uint8(0x80), np.uint8(0)).astype(np.uint8)


def to_bf16(x):
    """float32 array -> uint16 bf16 bits, round to nearest even (no NaNs here)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def quantize_blocks(w):
    """w [N, K] float32 -> (codes uint8 [N, K], scale_inv float32 [ceil(N/128), ceil(K/128)]): per 128 x 128 block,
    scale = amax / 448, codes = e4m3(w / scale); DeepSeek's weight_dequant multiplies them back."""
    n, k = w.shape
    bn, bk = -(-n // BLOCK), -(-k // BLOCK)
    scale = np.ones((bn, bk), np.float32)
    codes = np.empty((n, k), np.uint8)
    for i in range(bn):
        for j in range(bk):
            blk = w[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK]
            amax = float(np.abs(blk).max())
            s = np.float32(amax / E4M3_MAX) if amax > 0 else np.float32(1.0)
            scale[i, j] = s
            codes[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK] = to_e4m3(blk / s)
    return codes, scale


def quantize_int4_groups(w, group=32):
    """w [N, K] float32 -> (weight_packed int32 [N, K/8], weight_scale bf16 bits [N, K/group]): symmetric int4 per
    group of `group` columns, scale = amax / 7 (no value clips), q = round(w / scale) in [-8, 7], stored as q + 8."""
    n, k = w.shape
    g = w.reshape(n, k // group, group)
    scale = np.abs(g).max(axis=2) / 7.0
    scale = np.where(scale > 0, scale, 1.0).astype(np.float32)
    scale_bf16 = to_bf16(scale)
    scale_used = (scale_bf16.astype(np.uint32) << 16).view(np.float32)  # the rounded scale the reader multiplies
    q = np.clip(np.rint(g / scale_used[:, :, None]), -8, 7).astype(np.int64).reshape(n, k) + 8
    nib = q.reshape(n, k // 8, 8).astype(np.uint64)
    words = np.zeros((n, k // 8), np.uint64)
    for j in range(8):
        words |= nib[:, :, j] << np.uint64(4 * j)
    return words.astype(np.uint32).view(np.int32), scale_bf16


class Writer:
    """Collects tensors (name -> (dtype string, shape, bytes)) and writes one safetensors file."""

    def __init__(self):
        self.tensors = {}

    def add(self, name, dtype, array):
        self.tensors[name] = (dtype, list(array.shape), np.ascontiguousarray(array).tobytes())

    def linear(self, name, n, k, rng, std, fp8, int4=False):
        w = rng.normal(0.0, std, size=(n, k)).astype(np.float32)
        if int4:
            packed, scale = quantize_int4_groups(w)
            self.add(name + ".weight_packed", "I32", packed)
            self.add(name + ".weight_scale", "BF16", scale)
            self.add(name + ".weight_shape", "I32", np.array([n, k], np.int32))
        elif fp8:
            codes, scale = quantize_blocks(w)
            self.add(name + ".weight", "F8_E4M3", codes)
            self.add(name + ".weight_scale_inv", "F32", scale)
        else:
            self.add(name + ".weight", "BF16", to_bf16(w))

    def norm(self, name, n):
        self.add(name + ".weight", "BF16", to_bf16(np.ones(n, np.float32)))

    def write(self, path):
        header, offset, order = {"__metadata__": {"format": "pt"}}, 0, sorted(self.tensors)
        for name in order:
            dtype, shape, data = self.tensors[name]
            header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
            offset += len(data)
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(raw)))
            f.write(raw)
            for name in order:
                f.write(self.tensors[name][2])
        os.replace(tmp, path)


def make_config(a, vocab, bos, eos):
    return {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "attention_bias": False,
        "attention_dropout": 0.0, "bos_token_id": bos, "eos_token_id": eos, "ep_size": 1,
        "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": a.hidden, "initializer_range": 0.02,
        "intermediate_size": a.intermediate, "kv_lora_rank": 512, "max_position_embeddings": 163840,
        "moe_intermediate_size": a.moe_intermediate, "moe_layer_freq": 1, "n_group": 4,
        "n_routed_experts": a.experts, "n_shared_experts": 1, "norm_topk_prob": True,
        "num_attention_heads": a.heads, "num_experts_per_tok": a.experts_per_token, "num_hidden_layers": a.layers,
        "num_key_value_heads": a.heads, "num_nextn_predict_layers": 0, "q_lora_rank": a.q_lora_rank,
        "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
        "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                "weight_block_size": [BLOCK, BLOCK]},
        "rms_norm_eps": 1e-6,
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "original_max_position_embeddings": 4096, "type": "yarn"},
        "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "tie_word_embeddings": False,
        "topk_group": 2, "topk_method": "noaux_tc", "torch_dtype": "bfloat16", "use_cache": True,
        "vocab_size": vocab,
    }


KIMI_INT4 = {"config_groups": {"group_0": {
    "input_activations": None, "output_activations": None, "targets": ["Linear"],
    "weights": {"actorder": None, "block_structure": None, "dynamic": False, "group_size": 32, "num_bits": 4,
                "observer": "minmax", "observer_kwargs": {}, "strategy": "group", "symmetric": True, "type": "int"}}},
    "format": "pack-quantized",
    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
    "kv_cache_scheme": None, "quant_method": "compressed-tensors", "quantization_status": "compressed"}
KIMI_VISION = {"init_pos_emb_height": 64, "init_pos_emb_time": 4, "init_pos_emb_width": 64, "merge_kernel_size": [2, 2],
               "merge_type": "sd2_tpool", "mm_hidden_size": 1152, "mm_projector_type": "patchmerger", "model_type": "",
               "patch_size": 14, "pos_emb_type": "divided_fixed", "projector_hidden_act": "gelu",
               "projector_ln_eps": 1e-05, "video_attn_type": "spatial_temporal", "vt_hidden_size": 1152,
               "vt_intermediate_size": 4304, "vt_num_attention_heads": 16, "vt_num_hidden_layers": 27}


def make_kimi_config(a, vocab, bos, eos, pad):
    """Kimi-K2.5's wrapper config (../shared/data/kimi-deepseek-configs/config-kimi-k25) at this checkpoint's sizes."""
    t = make_config(a, vocab, bos, eos)
    del t["quantization_config"]
    t.update(n_group=1, topk_group=1, routed_scaling_factor=2.827, rms_norm_eps=1e-5, rope_theta=50000,
             max_position_embeddings=262144, pad_token_id=pad, quantization_config=KIMI_INT4,
             rope_scaling={"beta_fast": 32, "beta_slow": 1, "factor": 64, "mscale": 1.0, "mscale_all_dim": 1.0,
                           "original_max_position_embeddings": 4096, "type": "yarn"})
    return {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25", "bos_token_id": bos,
            "eos_token_id": eos, "pad_token_id": pad, "ignore_index": -100, "media_placeholder_token_id": 163605,
            "quantization_config": KIMI_INT4, "text_config": t, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16", "use_unified_vision_chunk": True,
            "video_placeholder": "<|kimi_k25_video_placeholder|>",
            "vision_config": dict(KIMI_VISION, text_hidden_size=a.hidden)}


def tokenizer_facts(tok_dir):
    """(number of token ids, bos id, eos id, pad id or None) from tokenizer.json / tokenizer_config.json, or for a
    tiktoken folder (Kimi) from tokenizer_config.json's added_tokens_decoder."""
    tc = json.load(open(os.path.join(tok_dir, "tokenizer_config.json"), encoding="utf-8"))
    if not os.path.isfile(os.path.join(tok_dir, "tokenizer.json")):
        inv = {v["content"]: int(k) for k, v in tc.get("added_tokens_decoder", {}).items()}
        tok = lambda key: inv.get(tc.get(key) if not isinstance(tc.get(key), dict) else tc[key].get("content"))
        if tok("bos_token") is None or tok("eos_token") is None:
            sys.exit(f"make_random_deepseek: {tok_dir}/tokenizer_config.json: no bos_token / eos_token among its "
                     "added tokens")
        return max(inv.values()) + 1, tok("bos_token"), tok("eos_token"), tok("pad_token")
    tj = json.load(open(os.path.join(tok_dir, "tokenizer.json"), encoding="utf-8"))
    ids = list(tj["model"]["vocab"].values()) + [t["id"] for t in tj.get("added_tokens", [])]
    inv = {t["content"]: t["id"] for t in tj.get("added_tokens", [])}

    def token_id(key):
        v = tc.get(key)
        v = v.get("content") if isinstance(v, dict) else v
        if v not in inv:
            sys.exit(f"make_random_deepseek: {tok_dir}/tokenizer_config.json: {key} {v!r} is no added token")
        return inv[v]
    return max(ids) + 1, token_id("bos_token"), token_id("eos_token"), None


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--tokenizer", required=True, help="a folder with tokenizer.json and tokenizer_config.json")
    p.add_argument("--format", choices=["fp8", "kimi-k25-int4"], default="fp8",
                   help="fp8: DeepSeek-V3, block FP8; kimi-k25-int4: Kimi-K2.5's wrapper, INT4 routed experts")
    p.add_argument("--vocab-size", type=int, help="default DeepSeek-V3's 129280 / Kimi-K2.5's 163840; at least the "
                   "tokenizer's")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--q-lora-rank", type=int, default=512)
    p.add_argument("--intermediate", type=int, default=2048, help="layer 0's dense MLP")
    p.add_argument("--moe-intermediate", type=int, default=256)
    p.add_argument("--experts", type=int, default=16)
    p.add_argument("--experts-per-token", type=int, default=4)
    p.add_argument("--lm-head-std", type=float, default=0.1)
    p.add_argument("--router-std", type=float, default=0.02,
                   help="standard deviation of the routers' gate.weight: larger keeps the top-k choice away from ties")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    for name in ("hidden", "q_lora_rank", "intermediate", "moe_intermediate"):
        if getattr(a, name) % BLOCK:
            p.error(f"--{name.replace('_', '-')} {getattr(a, name)} is not a multiple of {BLOCK} (the FP8 block)")
    if a.experts % 4 or a.experts_per_token > a.experts // 2:
        p.error("--experts must be a multiple of n_group 4 and --experts-per-token at most the 2 kept groups' experts")
    kimi = a.format == "kimi-k25-int4"
    a.vocab_size = a.vocab_size or (163840 if kimi else 129280)
    n_ids, bos, eos, pad = tokenizer_facts(a.tokenizer)
    if a.vocab_size < n_ids:
        p.error(f"--vocab-size {a.vocab_size} is below the {n_ids} ids of {a.tokenizer}")
    vocab = a.vocab_size
    os.makedirs(a.out, exist_ok=True)
    rng = np.random.Generator(np.random.PCG64(a.seed))
    w, h, nh = Writer(), a.hidden, a.heads
    fp8 = not kimi  # Kimi-K2.5: attention, dense MLP and shared experts BF16, the routed experts INT4
    top = "language_model." if kimi else ""
    w.add(top + "model.embed_tokens.weight", "BF16", to_bf16(rng.normal(0, 0.02, (vocab, h)).astype(np.float32)))
    for l in range(a.layers):
        pre = f"{top}model.layers.{l}."
        w.norm(pre + "input_layernorm", h)
        w.norm(pre + "post_attention_layernorm", h)
        at = pre + "self_attn."
        w.linear(at + "q_a_proj", a.q_lora_rank, h, rng, 0.02, fp8)
        w.norm(at + "q_a_layernorm", a.q_lora_rank)
        w.linear(at + "q_b_proj", nh * (128 + 64), a.q_lora_rank, rng, 0.02, fp8)
        w.linear(at + "kv_a_proj_with_mqa", 512 + 64, h, rng, 0.02, fp8)
        w.norm(at + "kv_a_layernorm", 512)
        w.linear(at + "kv_b_proj", nh * (128 + 128), 512, rng, 0.02, fp8)
        w.linear(at + "o_proj", h, nh * 128, rng, 0.02, fp8)
        mlp = pre + "mlp."
        if l == 0:
            for n, k, name in ((a.intermediate, h, "gate_proj"), (a.intermediate, h, "up_proj"),
                               (h, a.intermediate, "down_proj")):
                w.linear(mlp + name, n, k, rng, 0.02, fp8)
            continue
        w.add(mlp + "gate.weight", "BF16", to_bf16(rng.normal(0, a.router_std, (a.experts, h)).astype(np.float32)))
        w.add(mlp + "gate.e_score_correction_bias", "F32", np.zeros(a.experts, np.float32))
        for e in [f"experts.{i}." for i in range(a.experts)] + ["shared_experts."]:
            m, int4 = a.moe_intermediate, kimi and e != "shared_experts."
            w.linear(mlp + e + "gate_proj", m, h, rng, 0.02, fp8, int4)
            w.linear(mlp + e + "up_proj", m, h, rng, 0.02, fp8, int4)
            w.linear(mlp + e + "down_proj", h, m, rng, 0.02, fp8, int4)
    w.norm(top + "model.norm", h)
    w.add(top + "lm_head.weight", "BF16", to_bf16(rng.normal(0, a.lm_head_std, (vocab, h)).astype(np.float32)))
    w.write(os.path.join(a.out, "model.safetensors"))
    with open(os.path.join(a.out, "config.json"), "w", encoding="utf-8") as f:
        json.dump(make_kimi_config(a, vocab, bos, eos, pad) if kimi else make_config(a, vocab, bos, eos), f, indent=2)
    for name in ("tokenizer.json", "tokenizer_config.json", "tiktoken.model"):
        if os.path.isfile(os.path.join(a.tokenizer, name)):
            shutil.copyfile(os.path.join(a.tokenizer, name), os.path.join(a.out, name))
    n_params = sum(int(np.prod(s)) for _, s, _ in w.tensors.values())
    print(f"make_random_deepseek: {a.out}: {'Kimi-K2.5 INT4' if kimi else 'DeepSeek-V3 block-FP8'}, {a.layers} layers, hidden {h}, {nh} heads, "
          f"{a.experts} experts (top {a.experts_per_token}), vocab {vocab}, {n_params / 1e6:.1f}M values")


if __name__ == "__main__":
    main(sys.argv[1:])
