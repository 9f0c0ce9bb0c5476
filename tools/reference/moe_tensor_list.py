#!/usr/bin/env python3
"""The tensor list of a Qwen3-MoE or Mixtral checkpoint from its config.json alone, for `aerie plan --tensors`
when the checkpoint's headers are not at hand (the shared data holds the real lists of DeepSeek-V3 and Kimi only).

    python3 tools/reference/moe_tensor_list.py CONFIG.json OUT.jsonl[.gz] [--dtype BF16]
    python3 tools/reference/moe_tensor_list.py --check MODEL_DIR     (the list of MODEL_DIR/config.json against
                                                                      MODEL_DIR's safetensors headers)

One {"name", "shape", "dtype"} per line, in the released checkpoints' names: those transformers' save_pretrained
writes for the family (per-expert tensors; Mixtral's block_sparse_moe.experts.{e}.w1/w2/w3), which --check
compares, name by name and shape by shape, with a checkpoint saved by transformers (the tiny fixtures of
tools/reference/make_moe_fixtures.py). Standard library only.
"""
import gzip
import json
import os
import struct
import sys


def tensors(c):
    """(name, shape) of every tensor of config c."""
    mt, h, n, v = c["model_type"], c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    heads, kv = c["num_attention_heads"], c.get("num_key_value_heads") or c["num_attention_heads"]
    hd = c.get("head_dim") or h // heads
    out = [("model.embed_tokens.weight", [v, h]), ("model.norm.weight", [h])]
    if not c.get("tie_word_embeddings", False):
        out.append(("lm_head.weight", [v, h]))
    for l in range(n):
        p = f"model.layers.{l}."
        out += [(p + "input_layernorm.weight", [h]), (p + "post_attention_layernorm.weight", [h]),
                (p + "self_attn.q_proj.weight", [heads * hd, h]), (p + "self_attn.k_proj.weight", [kv * hd, h]),
                (p + "self_attn.v_proj.weight", [kv * hd, h]), (p + "self_attn.o_proj.weight", [h, heads * hd])]
        if mt == "qwen3_moe":
            out += [(p + "self_attn.q_norm.weight", [hd]), (p + "self_attn.k_norm.weight", [hd])]
            e, step = c.get("num_experts", c.get("num_local_experts", 0)), c.get("decoder_sparse_step", 1)
            moe = e > 0 and l not in (c.get("mlp_only_layers") or []) and (l + 1) % step == 0
            if moe:
                i = c["moe_intermediate_size"]
                out.append((p + "mlp.gate.weight", [e, h]))
                for x in range(e):
                    q = f"{p}mlp.experts.{x}."
                    out += [(q + "gate_proj.weight", [i, h]), (q + "up_proj.weight", [i, h]),
                            (q + "down_proj.weight", [h, i])]
            else:
                i = c["intermediate_size"]
                out += [(p + "mlp.gate_proj.weight", [i, h]), (p + "mlp.up_proj.weight", [i, h]),
                        (p + "mlp.down_proj.weight", [h, i])]
        elif mt == "mixtral":
            e, i = c.get("num_local_experts", 8), c["intermediate_size"]
            out.append((p + "block_sparse_moe.gate.weight", [e, h]))
            for x in range(e):
                q = f"{p}block_sparse_moe.experts.{x}."
                out += [(q + "w1.weight", [i, h]), (q + "w3.weight", [i, h]), (q + "w2.weight", [h, i])]
        else:
            sys.exit(f"moe_tensor_list: model_type {mt!r} is not qwen3_moe or mixtral")
    return out


def headers(model_dir):
    """{name: shape} of model_dir's safetensors files."""
    got = {}
    for f in sorted(os.listdir(model_dir)):
        if f.endswith(".safetensors") and f != "reference.safetensors":
            with open(os.path.join(model_dir, f), "rb") as fh:
                n = struct.unpack("<Q", fh.read(8))[0]
                hdr = json.loads(fh.read(n))
            got.update({k: v["shape"] for k, v in hdr.items() if k != "__metadata__"})
    return got


def main():
    a = sys.argv[1:]
    if len(a) == 2 and a[0] == "--check":
        with open(os.path.join(a[1], "config.json")) as f:
            want = dict(tensors(json.load(f)))
        got = headers(a[1])
        if want != got:
            sys.exit(f"moe_tensor_list: {a[1]}: missing {sorted(set(got) - set(want))[:5]}, extra "
                     f"{sorted(set(want) - set(got))[:5]}, other shapes "
                     f"{[k for k in want if k in got and want[k] != got[k]][:5]}")
        print(f"{a[1]}: {len(want)} tensors, names and shapes as the checkpoint's")
        return
    if len(a) not in (2, 4) or (len(a) == 4 and a[2] != "--dtype"):
        sys.exit(__doc__)
    dtype = a[3] if len(a) == 4 else "BF16"
    with open(a[0]) as f:
        c = json.load(f)
    opener = gzip.open if a[1].endswith(".gz") else open
    listed = tensors(c)
    with opener(a[1], "wt") as f:
        for name, shape in listed:
            f.write(json.dumps({"name": name, "shape": shape, "dtype": dtype}) + "\n")
    print(f"{a[1]}: {len(listed)} tensors of a {c['model_type']} checkpoint ({dtype})")


if __name__ == "__main__":
    main()
