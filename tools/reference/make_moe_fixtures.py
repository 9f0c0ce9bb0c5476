#!/usr/bin/env python3
"""Parity fixtures of the softmax-router MoE targets (Qwen3-MoE, Mixtral) for tests/model/moe_families_test.cc:
small RANDOM-weight models written by Hugging Face transformers itself (save_pretrained, which writes the real
checkpoints' per-expert tensor names), and the float64 forward of transformers on fixed ids.

    python3 tools/reference/make_moe_fixtures.py [OUT_DIR]     (default tests/model/fixtures/hf)

Needs torch and transformers 5.17 (a CPU torch is enough). Deterministic for given versions (seeded, one thread).

Each OUT_DIR/NAME/ holds config.json, model.safetensors and reference.safetensors (the layout of
tools/reference/make_hf_fixtures.py: ids [T] I32, r [N+1, T, H] F32 (r^k = input of decoder layer k, r^N = input
of the final norm), z [T, H], logits [T, V]) plus, for every MoE layer l:
  router.{l}.logits   [T, E] F32   the gate's logits (float64 rounded to fp32)
  router.{l}.indices  [T, K] I32   the experts chosen (torch.topk: probability descending)
  router.{l}.weights  [T, K] F32   their weights
The metadata holds the versions and the smallest router margin (the K-th probability minus the (K+1)-th, over
every token and MoE layer), so a test knows how far an fp32 router may drift before a selection flips.
The reference runs in float64 with eager attention and transformers' eager experts on the weights as stored
(bf16 widened exactly).

Models (hidden 64, 4 heads / 2 kv heads, vocab 300, T = 24 ids, BF16 weights):
  qwen3_moe  Qwen3MoeForCausalLM: head_dim 32, q/k norms, 3 layers with mlp_only_layers [0] (layer 0 dense MLP of
             intermediate 96), 8 experts of moe_intermediate 32, top-2, norm_topk_prob true
  mixtral    MixtralForCausalLM: 2 layers, 4 experts of intermediate 48, top-2 (always renormalized),
             sliding_window 8 < T (the window bites); checkpoint names block_sparse_moe.experts.{e}.w1/w2/w3
"""
import json
import os
import struct
import sys

import torch
import transformers
from transformers import MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

H, NH, NKV, V, T = 64, 4, 2, 300, 24
COMMON = dict(hidden_size=H, num_attention_heads=NH, num_key_value_heads=NKV, vocab_size=V,
              max_position_embeddings=128, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
              tie_word_embeddings=False)


def models():
    """(name, model class, config)."""
    return [
        ("qwen3_moe", Qwen3MoeForCausalLM,
         Qwen3MoeConfig(**COMMON, num_hidden_layers=3, head_dim=32, intermediate_size=96, moe_intermediate_size=32,
                        num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
                        mlp_only_layers=[0], rope_theta=1000000.0, attention_bias=False)),
        ("mixtral", MixtralForCausalLM,
         MixtralConfig(**COMMON, num_hidden_layers=2, intermediate_size=48, num_local_experts=4,
                       num_experts_per_tok=2, sliding_window=8, rope_theta=1000000.0)),
    ]


def save_safetensors(path, tensors, meta):
    """tensors: {name: torch tensor (F32 or I32)} -> the safetensors format, metadata keys sorted (a rerun gives
    the same bytes)."""
    header, blobs, off = {"__metadata__": dict(sorted(meta.items()))}, [], 0
    for name, t in tensors.items():
        data = t.contiguous().numpy().tobytes()
        dt = {torch.float32: "F32", torch.int32: "I32"}[t.dtype]
        header[name] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def randomize(model, seed):
    """Weights ~ U(-0.3, 0.3), norm weights (q_norm/k_norm too) ~ U(0.5, 1.5); router weights ~ U(-1, 1), so that
    the experts' probabilities spread and the selections are far from ties."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            elif name.endswith("gate.weight"):
                p.uniform_(-1.0, 1.0)
            else:
                p.uniform_(-0.3, 0.3)


def reference(cls, model_dir, ids):
    model = cls.from_pretrained(model_dir, dtype=torch.float64, attn_implementation="eager")
    model.config._experts_implementation = "eager"
    model.eval()
    captured, routers = {}, {}
    layers = model.model.layers
    for k, layer in enumerate(layers):
        def pre_hook(mod, args, kwargs, k=k):
            captured[k] = (args[0] if args else kwargs["hidden_states"]).clone()
        layer.register_forward_pre_hook(pre_hook, with_kwargs=True)
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None and hasattr(gate, "top_k"):
            def router_hook(mod, args, output, k=k):
                routers[k] = [o.detach().clone() for o in output]
            gate.register_forward_hook(router_hook)

    def norm_hook(mod, args, output):
        captured[len(layers)] = args[0].clone()
        captured["z"] = output.clone()
    model.model.norm.register_forward_hook(norm_hook)
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=False, output_hidden_states=True)
    n = len(layers)
    for k in range(n):
        assert torch.equal(out.hidden_states[k], captured[k]), f"hidden_states[{k}] differs from layer {k}'s input"
    res = {"r": torch.stack([captured[k][0] for k in range(n + 1)]).float(), "z": captured["z"][0].float(),
           "logits": out.logits[0].float()}
    margin = float("inf")
    for k, (logits, w, idx) in sorted(routers.items()):
        p = torch.softmax(logits.double(), dim=-1).sort(dim=-1, descending=True)[0]
        kk = idx.shape[1]
        margin = min(margin, (p[:, kk - 1] - p[:, kk]).min().item())
        res[f"router.{k}.logits"] = logits.float()
        res[f"router.{k}.indices"] = idx.to(torch.int32)
        res[f"router.{k}.weights"] = w.float()
    return res, margin


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "model", "fixtures", "hf")
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(7)
    ids = [1] + torch.randint(3, V, (T - 1,), generator=g).tolist()
    for seed, (name, cls, cfg) in enumerate(models(), start=400):
        model_dir = os.path.join(out_dir, name)
        os.makedirs(model_dir, exist_ok=True)
        for f in os.listdir(model_dir):
            os.remove(os.path.join(model_dir, f))
        model = cls(cfg)
        randomize(model, seed)
        model.to(torch.bfloat16).save_pretrained(model_dir)
        res, margin = reference(cls, model_dir, ids)
        meta = {"source": "tools/reference/make_moe_fixtures.py", "transformers": transformers.__version__,
                "torch": torch.__version__, "router_min_margin": repr(margin)}
        save_safetensors(os.path.join(model_dir, "reference.safetensors"),
                         dict({"ids": torch.tensor(ids, dtype=torch.int32)}, **res), meta)
        files = sorted(os.listdir(model_dir))
        size = sum(os.path.getsize(os.path.join(model_dir, f)) for f in files)
        print(f"{name}: {files} {size} bytes; |logits|max {res['logits'].abs().max().item():.3f}; "
              f"router min margin {margin:.3g}")


if __name__ == "__main__":
    main()
