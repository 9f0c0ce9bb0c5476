#!/usr/bin/env python3
"""Random bf16 weights of a Llama target as a Hugging Face model.safetensors, for benchmarks.

`aerie extract --random-weights` needs no checkpoint file, but `aerie train` reads the target's
model.embed_tokens.weight and lm_head.weight ([V, H]) from MODEL_DIR/model.safetensors
(src/train/target_head.h). This writes them (the default, --head-only) or every tensor of the Llama
decoder of MODEL_DIR/config.json (--full: embed_tokens, the layers' norms and q/k/v/o/gate/up/down
projections, the final norm, lm_head), so that `aerie extract` without --random-weights loads the same
model at every tp (its --random-weights model depends on tp: see bench_scaling.sh).

Values: N(0, std^2) (std 0.02), rounded to bf16 (nearest even); a pool of about 16M values drawn once with
numpy (seeded) is tiled into each tensor from a tensor-dependent offset (as aerie's random_weights
does), so a 70B-shaped head (2 x 128256 x 8192 values, 4.2 GB) is written at disk speed. RMSNorm weights
are 1. The file is written tensor by tensor (memory: the pool plus one window), with a hand-written
safetensors header (8-byte little-endian header length, JSON header, data), so only numpy is needed.

usage: make_target_head.py MODEL_DIR [--full] [--seed 0] [--std 0.02] [--output MODEL_DIR/model.safetensors]
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

POOL = (1 << 24) + 4099  # odd-sized, so that the rows of a tensor do not repeat in step


def bf16_bits(x):
    """float32 array -> uint16 bf16 bits, round to nearest even (no NaNs here)."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def tensors(cfg, full):
    """(name, shape, kind) in file order; kind 'w' random, 'one' RMSNorm weight."""
    H, V = cfg["hidden_size"], cfg["vocab_size"]
    nh, nkv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    d = cfg.get("head_dim") or H // nh
    inter = cfg["intermediate_size"]
    out = [("model.embed_tokens.weight", (V, H), "w")]
    if full:
        for layer in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{layer}."
            out += [(p + "input_layernorm.weight", (H,), "one"),
                    (p + "post_attention_layernorm.weight", (H,), "one"),
                    (p + "self_attn.q_proj.weight", (nh * d, H), "w"),
                    (p + "self_attn.k_proj.weight", (nkv * d, H), "w"),
                    (p + "self_attn.v_proj.weight", (nkv * d, H), "w"),
                    (p + "self_attn.o_proj.weight", (H, nh * d), "w"),
                    (p + "mlp.gate_proj.weight", (inter, H), "w"),
                    (p + "mlp.up_proj.weight", (inter, H), "w"),
                    (p + "mlp.down_proj.weight", (H, inter), "w")]
        out.append(("model.norm.weight", (H,), "one"))
    if not cfg.get("tie_word_embeddings", False):
        out.append(("lm_head.weight", (V, H), "w"))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("--full", action="store_true", help="every tensor of the decoder, not only embed_tokens/lm_head")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--std", type=float, default=0.02)
    ap.add_argument("--output", default=None, help="default MODEL_DIR/model.safetensors")
    a = ap.parse_args()
    cfg = json.load(open(os.path.join(a.model_dir, "config.json")))
    for key in ("qkv_bias", "attention_bias", "mlp_bias", "qk_norm"):
        if cfg.get(key):
            sys.exit(f"make_target_head.py: config.json sets {key}; only plain Llama decoders are written")
    items = tensors(cfg, a.full)
    header, offset = {}, 0
    for name, shape, _ in items:
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    header["__metadata__"] = {"format": "pt", "source": "tools/bench/make_target_head.py (random)"}
    hjson = json.dumps(header, separators=(",", ":")).encode()
    hjson += b" " * (-len(hjson) % 8)

    rng = np.random.default_rng(a.seed)
    pool = bf16_bits(rng.standard_normal(2 * POOL, dtype=np.float32) * np.float32(a.std))
    one = np.full(max(s[0] for _, s, k in items if k == "one") if a.full else 1, 0x3F80, dtype=np.uint16)
    out = a.output or os.path.join(a.model_dir, "model.safetensors")
    tmp = out + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for name, shape, kind in items:
            n = int(np.prod(shape))
            if kind == "one":
                f.write(one[:n].tobytes())
                continue
            o = int(rng.integers(0, POOL))
            i = 0
            while i < n:
                m = min(POOL, n - i)
                f.write(pool[o:o + m].tobytes())
                i += m
                o = (o + 7919) % POOL
    os.replace(tmp, out)
    print(json.dumps({"file": out, "tensors": len(items), "bytes": os.path.getsize(out), "full": a.full}))


if __name__ == "__main__":
    main()
