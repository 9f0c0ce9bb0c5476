#!/usr/bin/env python3
"""Converts a Llama-architecture GGUF file (llama.cpp) into the Hugging Face layout aerie loads.

    python3 tools/convert_gguf.py MODEL.gguf OUT_DIR [--dtype f32|bf16]

writes OUT_DIR/config.json, model.safetensors, tokenizer.json, tokenizer_config.json (with the GGUF's
chat template), generation_config.json and special_tokens_map.json.

Weights: every tensor is dequantised with ggml's own reader (the `gguf` package from PyPI:
gguf.GGUFReader + gguf.quants.dequantize; Q4_0/Q4_1/Q5_x/Q8_0/K-quants/F16/BF16/F32, whatever the file
holds) to float32 and stored as F32 (default, exact) or BF16 (round to nearest even). llama.cpp's
convert_hf_to_gguf.py permutes the rows of q_proj and k_proj of Llama models from Hugging Face's
"rotate half" RoPE layout to ggml's interleaved one:
    W.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2).reshape(rows, cols)
(n_head = num_key_value_heads for k_proj); this script applies the inverse. Tensor names map as in
llama.cpp's gguf-py/gguf/tensor_mapping.py (token_embd -> model.embed_tokens, blk.N.attn_q ->
model.layers.N.self_attn.q_proj, ffn_norm -> post_attention_layernorm, output -> lm_head, ...). Without
an output.weight the embeddings are tied (tie_word_embeddings = true).

Tokenizer: GGUF tokenizer.ggml.model "gpt2" (byte-level BPE) becomes a tokenizer.json with the vocabulary
(tokenizer.ggml.tokens), merges (tokenizer.ggml.merges), the control / user-defined tokens
(tokenizer.ggml.token_type 3 / 4) as added tokens, and the pre-tokenizer that tokenizer.ggml.pre names,
written as Split regexes + ByteLevel (the form of Llama-3's and Qwen's tokenizer.json): "smollm" (also
starcoder, refact, ...) splits every digit off and then applies GPT-2's regex, as llama.cpp's
llama-vocab.cpp does. Unknown pre-tokenizer names are an error (add them to PRE_TOKENIZERS).

Needs: numpy and gguf (pip install gguf). The output does not depend on anything but the input file.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

try:
    import gguf
except ImportError:  # pragma: no cover
    sys.exit("convert_gguf.py needs the 'gguf' package: pip install gguf")

GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")
# tokenizer.ggml.pre -> the Split regexes applied in order (llama.cpp src/llama-vocab.cpp).
PRE_TOKENIZERS = {
    "default": [GPT2_REGEX],
    "gpt-2": [GPT2_REGEX],
    "smollm": [r"\p{N}", GPT2_REGEX],
    "starcoder": [r"\p{N}", GPT2_REGEX],
    "refact": [r"\p{N}", GPT2_REGEX],
    "llama-bpe": [LLAMA3_REGEX],
    "llama3": [LLAMA3_REGEX],
    "qwen2": [QWEN2_REGEX],
}

# GGUF tensor name (after "blk.N.") -> Hugging Face name (after "model.layers.N.").
LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6


def field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def unpermute(w, n_head):
    """Inverse of convert_hf_to_gguf.py's LlamaModel.permute for a [rows, cols] q/k weight."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_name(gguf_name):
    base, _, kind = gguf_name.rpartition(".")  # kind: weight / bias
    if base.startswith("blk."):
        _, layer, part = base.split(".", 2)
        if part not in LAYER_NAMES:
            raise SystemExit(f"convert_gguf: unknown layer tensor {gguf_name}")
        return f"model.layers.{layer}.{LAYER_NAMES[part]}.{kind}"
    if base not in GLOBAL_NAMES:
        raise SystemExit(f"convert_gguf: unknown tensor {gguf_name}")
    return f"{GLOBAL_NAMES[base]}.{kind}"


def f32_to_bf16_bits(a):
    """float32 array -> uint16 bf16 bits, round to nearest even (NaN kept NaN)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    rounded = (u + (0x7FFF + ((u >> 16) & 1))) >> 16
    return np.where(np.isnan(a), 0x7FC0, rounded).astype(np.uint16)


def save_safetensors(path, tensors, dtype):
    """Writes {name: float32 array} as safetensors (F32 or BF16), names sorted."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        a = tensors[name]
        data = f32_to_bf16_bits(a).tobytes() if dtype == "bf16" else np.ascontiguousarray(a, "<f4").tobytes()
        header[name] = {"dtype": "BF16" if dtype == "bf16" else "F32", "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def convert_weights(reader, n_head, n_kv):
    out = {}
    for t in reader.tensors:
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        # ggml lists dims fastest first; numpy's shape is the row-major [rows, cols] of Hugging Face.
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        w = w.reshape(shape)
        name = hf_name(t.name)
        if name.endswith("self_attn.q_proj.weight") or name.endswith("self_attn.q_proj.bias"):
            w = unpermute(w, n_head)
        elif name.endswith("self_attn.k_proj.weight") or name.endswith("self_attn.k_proj.bias"):
            w = unpermute(w, n_kv)
        out[name] = w
    return out


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def tokenizer_files(reader, out_dir):
    model = field(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise SystemExit(f"convert_gguf: tokenizer.ggml.model '{model}' is not supported (only gpt2 byte-level BPE)")
    pre = field(reader, "tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise SystemExit(f"convert_gguf: tokenizer.ggml.pre '{pre}' unknown; add it to PRE_TOKENIZERS")
    tokens = field(reader, "tokenizer.ggml.tokens")
    types = field(reader, "tokenizer.ggml.token_type", [TOKEN_NORMAL] * len(tokens))
    merges = field(reader, "tokenizer.ggml.merges", [])
    bos = field(reader, "tokenizer.ggml.bos_token_id")
    eos = field(reader, "tokenizer.ggml.eos_token_id")
    unk = field(reader, "tokenizer.ggml.unknown_token_id")
    pad = field(reader, "tokenizer.ggml.padding_token_id")
    added = []
    for i, (tok, ty) in enumerate(zip(tokens, types)):
        if ty in (TOKEN_CONTROL, TOKEN_USER_DEFINED):
            added.append({"id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": ty != TOKEN_CONTROL, "special": ty == TOKEN_CONTROL})
    pretok = [{"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": False}
              for r in PRE_TOKENIZERS[pre]]
    pretok.append({"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False})
    tj = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": pretok},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {tok: i for i, tok in enumerate(tokens)},
                  "merges": [m.split(" ", 1) for m in merges]},
    }
    write_json(os.path.join(out_dir, "tokenizer.json"), tj)

    def name(i):
        return tokens[i] if i is not None and 0 <= i < len(tokens) else None

    cfg = {
        "add_bos_token": bool(field(reader, "tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(field(reader, "tokenizer.ggml.add_eos_token", False)),
        "added_tokens_decoder": {str(a["id"]): {k: v for k, v in a.items() if k != "id"} for a in added},
        "bos_token": name(bos), "eos_token": name(eos), "unk_token": name(unk), "pad_token": name(pad),
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(field(reader, "llama.context_length", 2048)),
        "tokenizer_class": "GPT2Tokenizer",
    }
    template = field(reader, "tokenizer.chat_template")
    if template is not None:
        cfg["chat_template"] = template
    write_json(os.path.join(out_dir, "tokenizer_config.json"), cfg)
    write_json(os.path.join(out_dir, "special_tokens_map.json"),
               {k: v for k, v in (("bos_token", name(bos)), ("eos_token", name(eos)), ("unk_token", name(unk)),
                                  ("pad_token", name(pad))) if v is not None})
    return bos, eos, pad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("gguf", help="input .gguf file (general.architecture llama)")
    ap.add_argument("out", help="output folder (created)")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32",
                    help="stored weight type (f32: the dequantised values exactly)")
    args = ap.parse_args()

    reader = gguf.GGUFReader(args.gguf)
    arch = field(reader, "general.architecture")
    if arch != "llama":
        raise SystemExit(f"convert_gguf: general.architecture '{arch}' is not supported (llama only)")
    a = lambda k, d=None: field(reader, f"llama.{k}", d)  # noqa: E731
    hidden, n_head = int(a("embedding_length")), int(a("attention.head_count"))
    n_kv = int(a("attention.head_count_kv", n_head))
    head_dim = int(a("attention.key_length", hidden // n_head))
    rope_dim = int(a("rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise SystemExit(f"convert_gguf: partial rotary (rope.dimension_count {rope_dim} != head_dim {head_dim})")
    if field(reader, "llama.rope.scaling.type") not in (None, "none"):
        raise SystemExit("convert_gguf: rope scaling in the GGUF is not converted yet")

    os.makedirs(args.out, exist_ok=True)
    weights = convert_weights(reader, n_head, n_kv)
    vocab = weights["model.embed_tokens.weight"].shape[0]
    tied = "lm_head.weight" not in weights
    bos, eos, pad = tokenizer_files(reader, args.out)

    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(a("feed_forward_length")),
        "num_hidden_layers": int(a("block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": int(a("context_length", 2048)),
        "rms_norm_eps": float(a("attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(a("rope.freq_base", 10000.0)),
        "rope_scaling": None,
        "attention_bias": "model.layers.0.self_attn.q_proj.bias" in weights,
        "mlp_bias": False,
        "tie_word_embeddings": tied,
        "vocab_size": vocab,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "torch_dtype": "bfloat16" if args.dtype == "bf16" else "float32",
        "converted_from": {"gguf": os.path.basename(args.gguf), "name": field(reader, "general.name"),
                           "file_type": field(reader, "general.file_type")},
    }
    write_json(os.path.join(args.out, "config.json"), config)
    gen = {k: v for k, v in (("bos_token_id", bos), ("eos_token_id", eos), ("pad_token_id", pad)) if v is not None}
    write_json(os.path.join(args.out, "generation_config.json"), gen)
    save_safetensors(os.path.join(args.out, "model.safetensors"), weights, args.dtype)
    print(f"convert_gguf: {len(weights)} tensors, {sum(w.size for w in weights.values()) / 1e6:.1f}M parameters, "
          f"{config['num_hidden_layers']} layers, vocab {vocab}, tied {tied} -> {args.out}")


if __name__ == "__main__":
    main()
