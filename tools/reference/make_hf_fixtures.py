#!/usr/bin/env python3
"""Parity fixtures of the target forward for tests/model/target_hf_families_test.cc: small RANDOM-weight
models of each supported family, written by Hugging Face transformers itself (save_pretrained), and
the float64 forward of transformers on fixed ids.

    python3 tools/reference/make_hf_fixtures.py [OUT_DIR]     (default tests/model/fixtures/hf)

Needs torch and transformers (a CPU torch is enough; the GPU machine has both). Deterministic for a
given torch/transformers version (seeded); rerun and commit the output when a model changes here.

For each model NAME it writes OUT_DIR/NAME/ with
  config.json, model.safetensors (or model-0000k-of-0000n.safetensors + model.safetensors.index.json)
      the checkpoint exactly as save_pretrained writes it (one config rewritten to the transformers 4.x
      "rope_theta" + "rope_scaling" spelling, see below)
  reference.safetensors  (stdlib writer, no safetensors package needed)
      ids     [T] I32      the input ids (positions 0..T-1, no cache)
      r       [N+1, T, H]  F32: r^k = the INPUT of decoder layer k (k < N), r^N = the input of
                           model.norm, i.e. the residual stream of eagle3.md section 1
      z       [T, H]       F32: the output of model.norm
      logits  [T, V]       F32: the *ForCausalLM logits
The reference runs in float64 with eager attention on the weights as stored (bf16/fp16 widened
exactly), so aerie's fp32 forward is compared with a forward whose own rounding error is negligible.
r^k for k < N equals output_hidden_states' hidden_states[k] (checked here); r^N is taken with a hook
because transformers puts the NORMED last state into hidden_states[N].

Models (hidden 64, intermediate 96, 4 heads / 2 kv heads, vocab 300, T = 24 ids):
  llama3_tied    Llama 3.x: rope_scaling llama3 (original_max_position_embeddings 32 so that the three
                 frequency bands all occur), rope_theta 500000, head_dim 32 != 64/4, tied embeddings; F32
  llama2_linear  Llama 2 style: rope_scaling linear (factor 2) written the transformers 4.x way,
                 attention_bias and mlp_bias (q/k/v/o and gate/up/down biases); F16, sharded with an index
  mistral_swa    Mistral with sliding_window 8 < T, so that the window bites; BF16
  qwen2          Qwen2/2.5: q/k/v biases, 3 layers; BF16
  qwen3          Qwen3: q_norm/k_norm, head_dim 32 != 64/4, tied embeddings; BF16
"""
import json
import os
import struct
import sys

import torch
import transformers
from transformers import (LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

H, I, NH, NKV, V, T = 64, 96, 4, 2, 300, 24
COMMON = dict(hidden_size=H, intermediate_size=I, num_attention_heads=NH, num_key_value_heads=NKV,
              vocab_size=V, max_position_embeddings=128, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2)


def models():
    """(name, model class, config, storage dtype, max_shard_size or None, rewrite_v4_rope)."""
    return [
        ("llama3_tied", LlamaForCausalLM,
         LlamaConfig(**COMMON, num_hidden_layers=2, head_dim=32, tie_word_embeddings=True,
                     rope_theta=500000.0,
                     rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 32}),
         torch.float32, None, False),
        ("llama2_linear", LlamaForCausalLM,
         LlamaConfig(**COMMON, num_hidden_layers=2, tie_word_embeddings=False, attention_bias=True,
                     mlp_bias=True, rope_theta=10000.0, rope_scaling={"rope_type": "linear", "factor": 2.0}),
         torch.float16, "60KB", True),
        ("mistral_swa", MistralForCausalLM,
         MistralConfig(**COMMON, num_hidden_layers=2, tie_word_embeddings=False, sliding_window=8,
                       rope_theta=10000.0),
         torch.bfloat16, None, False),
        ("qwen2", Qwen2ForCausalLM,
         Qwen2Config(**COMMON, num_hidden_layers=3, tie_word_embeddings=False, rope_theta=1000000.0,
                     use_sliding_window=False),
         torch.bfloat16, None, False),
        ("qwen3", Qwen3ForCausalLM,
         Qwen3Config(**COMMON, num_hidden_layers=2, head_dim=32, tie_word_embeddings=True,
                     rope_theta=1000000.0, attention_bias=False),
         torch.bfloat16, None, False),
    ]


def save_safetensors(path, tensors):
    """tensors: {name: (dtype string, shape, bytes)} -> the safetensors format (README of the format)."""
    header, blobs, off = {}, [], 0
    for name, (dt, shape, data) in tensors.items():
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    header["__metadata__"] = {"source": "tools/reference/make_hf_fixtures.py",
                              "transformers": transformers.__version__, "torch": torch.__version__}
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def f32(t):
    return ("F32", tuple(t.shape), t.detach().to(torch.float32).contiguous().numpy().tobytes())


def randomize(model, seed):
    """Weights ~ U(-0.3, 0.3), biases ~ U(-0.5, 0.5), norm weights (incl. q_norm/k_norm) ~ U(0.5, 1.5):
    far from the default init (norm weights 1, biases 0), so a skipped norm or bias shows."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):
                p.uniform_(-0.5, 0.5)
            else:
                p.uniform_(-0.3, 0.3)


def rewrite_v4_rope(model_dir):
    """transformers 5 writes rope_parameters; checkpoints on the hub mostly carry the 4.x spelling
    rope_theta + rope_scaling {"type": ...}. Rewrite to that, so both spellings are exercised (the
    reference is computed after the rewrite, from the rewritten file)."""
    path = os.path.join(model_dir, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    rp = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rp.pop("rope_theta")
    rope_type = rp.pop("rope_type")
    cfg["rope_scaling"] = None if rope_type == "default" else {"type": rope_type, **rp}
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)


def reference(cls, model_dir, ids):
    model = cls.from_pretrained(model_dir, dtype=torch.float64, attn_implementation="eager")
    model.eval()
    captured = {}
    layers = model.model.layers
    for k, layer in enumerate(layers):
        def pre_hook(mod, args, kwargs, k=k):  # returns None: the inputs are kept as they are
            captured[k] = (args[0] if args else kwargs["hidden_states"]).clone()

        layer.register_forward_pre_hook(pre_hook, with_kwargs=True)

    def norm_hook(mod, args, output):  # returns None: the output is kept as is
        captured[len(layers)] = args[0].clone()
        captured["z"] = output.clone()

    model.model.norm.register_forward_hook(norm_hook)
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=False, output_hidden_states=True)
    n = len(layers)
    for k in range(n):
        assert torch.equal(out.hidden_states[k], captured[k]), f"hidden_states[{k}] differs from layer {k}'s input"
    r = torch.stack([captured[k][0] for k in range(n + 1)])
    return r, captured["z"][0], out.logits[0]


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "model", "fixtures", "hf")
    g = torch.Generator().manual_seed(5)
    ids = [1] + torch.randint(3, V, (T - 1,), generator=g).tolist()
    for seed, (name, cls, cfg, dtype, shard, v4) in enumerate(models(), start=100):
        model_dir = os.path.join(out_dir, name)
        os.makedirs(model_dir, exist_ok=True)
        for f in os.listdir(model_dir):  # a rerun must not leave shards of an older layout behind
            os.remove(os.path.join(model_dir, f))
        model = cls(cfg)
        randomize(model, seed)
        kwargs = {"max_shard_size": shard} if shard else {}
        model.to(dtype).save_pretrained(model_dir, **kwargs)
        if v4:
            rewrite_v4_rope(model_dir)
        r, z, logits = reference(cls, model_dir, ids)
        save_safetensors(os.path.join(model_dir, "reference.safetensors"), {
            "ids": ("I32", (len(ids),), torch.tensor(ids, dtype=torch.int32).numpy().tobytes()),
            "r": f32(r), "z": f32(z), "logits": f32(logits)})
        files = sorted(os.listdir(model_dir))
        size = sum(os.path.getsize(os.path.join(model_dir, f)) for f in files)
        print(f"{name}: {files} {size} bytes; r{tuple(r.shape)} logits{tuple(logits.shape)} "
              f"|logits|max {logits.abs().max().item():.3f}")


if __name__ == "__main__":
    main()
