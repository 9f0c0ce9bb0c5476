#!/usr/bin/env python3
"""Checks tools/convert_llama2c.py end to end (Python stdlib only, slow but tiny model):

    python3 tools/reference/stories260K_greedy.py MODEL_DIR [N_TOKENS]

Runs a Hugging Face-style Llama forward (rotate_half RoPE, GQA, SwiGLU, RMSNorm, tied lm_head) on
MODEL_DIR/model.safetensors + config.json, greedy-decodes N_TOKENS (default 40) after BOS and compares the
text with the start of the greedy sample in stories260K.md (llama2.c run.c -t 0.0). A wrong q/k row
permutation in the converter breaks the match within a few tokens.
"""
import array
import json
import math
import os
import struct
import sys

SAMPLE = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
          "One day, she saw a big, red ball. She wanted to play with it, but it was too high.")


def load_safetensors(path):
    data = open(path, "rb").read()
    n, = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        assert e["dtype"] == "F32", name
        a = array.array("f")
        b, c = e["data_offsets"]
        a.frombytes(data[8 + n + b:8 + n + c])
        out[name] = (e["shape"], a)
    return out


def matvec(w, rows, cols, x):
    return [sum(w[r * cols + k] * x[k] for k in range(cols)) for r in range(rows)]


def rmsnorm(x, w, eps):
    s = 1.0 / math.sqrt(sum(v * v for v in x) / len(x) + eps)
    return [v * s * w[i] for i, v in enumerate(x)]


def main():
    model_dir = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    t = load_safetensors(os.path.join(model_dir, "model.safetensors"))
    tok = json.load(open(os.path.join(model_dir, "tokenizer.json")))
    pieces = {i: p for p, i in tok["model"]["vocab"].items()}
    D, H, KV, HD = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    F, L, V, eps = cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"], cfg["rms_norm_eps"]
    theta = cfg["rope_theta"]
    W = {k: v[1] for k, v in t.items()}
    emb = W["model.embed_tokens.weight"]
    cache_k = [[] for _ in range(L)]
    cache_v = [[] for _ in range(L)]

    def rope(vec, heads, pos):
        out = list(vec)
        half = HD // 2
        for h in range(heads):
            for i in range(half):
                f = pos * theta ** (-2.0 * i / HD)
                c, s = math.cos(f), math.sin(f)
                a, b = vec[h * HD + i], vec[h * HD + i + half]
                out[h * HD + i] = a * c - b * s
                out[h * HD + i + half] = b * c + a * s
        return out

    def forward(token, pos):
        x = list(emb[token * D:(token + 1) * D])
        for l in range(L):
            p = f"model.layers.{l}."
            h = rmsnorm(x, W[p + "input_layernorm.weight"], eps)
            q = rope(matvec(W[p + "self_attn.q_proj.weight"], H * HD, D, h), H, pos)
            k = rope(matvec(W[p + "self_attn.k_proj.weight"], KV * HD, D, h), KV, pos)
            v = matvec(W[p + "self_attn.v_proj.weight"], KV * HD, D, h)
            cache_k[l].append(k)
            cache_v[l].append(v)
            att = [0.0] * (H * HD)
            for hh in range(H):
                g = hh // (H // KV)
                sc = [sum(q[hh * HD + d] * kk[g * HD + d] for d in range(HD)) / math.sqrt(HD) for kk in cache_k[l]]
                m = max(sc)
                e = [math.exp(s - m) for s in sc]
                z = sum(e)
                for j, vv in enumerate(cache_v[l]):
                    for d in range(HD):
                        att[hh * HD + d] += e[j] / z * vv[g * HD + d]
            o = matvec(W[p + "self_attn.o_proj.weight"], D, H * HD, att)
            x = [a + b for a, b in zip(x, o)]
            h = rmsnorm(x, W[p + "post_attention_layernorm.weight"], eps)
            gt = matvec(W[p + "mlp.gate_proj.weight"], F, D, h)
            up = matvec(W[p + "mlp.up_proj.weight"], F, D, h)
            act = [g / (1 + math.exp(-g)) * u for g, u in zip(gt, up)]
            x = [a + b for a, b in zip(x, matvec(W[p + "mlp.down_proj.weight"], D, F, act))]
        x = rmsnorm(x, W["model.norm.weight"], eps)
        head = W.get("lm_head.weight", emb)
        return matvec(head, V, D, x)

    token, ids = 1, []
    for pos in range(steps):
        logits = forward(token, pos)
        token = max(range(V), key=lambda i: logits[i])
        ids.append(token)
    text = ""
    for i in ids:
        p = pieces[i]
        text += chr(int(p[3:5], 16)) if p.startswith("<0x") else p.replace("\u2581", " ")
    text = text[1:] if text.startswith(" ") else text
    ok = SAMPLE.startswith(text)
    print(f"greedy ids: {ids}\ntext: {text!r}\nmatches stories260K.md: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
