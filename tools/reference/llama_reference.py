#!/usr/bin/env python3
"""Golden values of the target forward from Hugging Face transformers (LlamaForCausalLM, eager
attention, float64), for tests/model/target_hf_test.cc.

    python3 tools/reference/llama_reference.py MODEL_DIR OUT.safetensors [ids...]
    python3 tools/reference/llama_reference.py --make-tiny MODEL_DIR OUT.safetensors

MODEL_DIR is a Hugging Face directory (here the converted stories260K: build/models/stories260K).
--make-tiny first writes a small random Llama with save_pretrained into MODEL_DIR (bf16, untied lm_head,
head_dim 16 != hidden/heads, GQA 2:1, llama3 rope_scaling with original_max_position_embeddings 32 so
that the 40 positions used cross all three frequency bands), then computes its reference on 40 ids.
Writes a safetensors file (stdlib writer, no safetensors package needed) with
  ids      [T] I32      the input ids (positions 0..T-1, no cache)
  r        [N+1, T, H]  F32: r^k = the INPUT of decoder layer k (k < N, captured by forward pre-hooks),
                        r^N = the input of model.norm (eagle3.md section 1)
  z        [T, H]       F32: the output of model.norm (final_norm(r^N))
  logits   [T, V]       F32: LlamaForCausalLM logits
Hooks are used instead of output_hidden_states because transformers puts the NORMED last state into
hidden_states[N] (and its recording differs between versions).
Needs torch and transformers (the GPU machine has them; a CPU install works too).
"""
import json
import struct
import sys

import torch
from transformers import LlamaForCausalLM

DEFAULT_IDS = [1, 403, 407, 261, 378, 410, 261, 285, 374, 264, 275, 401, 353, 46, 306, 289]


def save_safetensors(path, tensors):
    """tensors: {name: (dtype string, shape, bytes)} -> the safetensors format (README of the format)."""
    header, blobs, off = {}, [], 0
    for name, (dt, shape, data) in tensors.items():
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    header["__metadata__"] = {"source": "tools/reference/llama_reference.py",
                              "transformers": __import__("transformers").__version__,
                              "torch": torch.__version__}
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def f32(t):
    return ("F32", tuple(t.shape), t.detach().to(torch.float32).contiguous().numpy().tobytes())


def make_tiny(model_dir):
    from transformers import LlamaConfig
    torch.manual_seed(1234)
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, vocab_size=96, max_position_embeddings=128,
                      rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=1,
                      eos_token_id=2,
                      rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 32})
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            else:
                p.uniform_(-0.3, 0.3)
    model.to(torch.bfloat16).save_pretrained(model_dir, safe_serialization=True)
    g = torch.Generator().manual_seed(5)
    return [1] + torch.randint(0, 96, (39,), generator=g).tolist()


def main():
    args = sys.argv[1:]
    tiny = args[0] == "--make-tiny"
    if tiny:
        args = args[1:]
    model_dir, out = args[0], args[1]
    ids = make_tiny(model_dir) if tiny else ([int(x) for x in args[2:]] or DEFAULT_IDS)
    model = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float64, attn_implementation="eager")
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
        logits = model(torch.tensor([ids]), use_cache=False).logits[0]
    r = torch.stack([captured[k][0] for k in range(len(layers) + 1)])
    save_safetensors(out, {
        "ids": ("I32", (len(ids),), torch.tensor(ids, dtype=torch.int32).numpy().tobytes()),
        "r": f32(r), "z": f32(captured["z"][0]), "logits": f32(logits)})
    print(f"wrote {out}: T={len(ids)} r{tuple(r.shape)} logits{tuple(logits.shape)}; "
          f"argmax {logits.argmax(-1).tolist()}")


if __name__ == "__main__":
    main()
