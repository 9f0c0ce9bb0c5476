#!/usr/bin/env python3
"""Convert a llama2.c checkpoint + tokenizer to the Hugging Face layout (Python 3 stdlib only).

    convert_llama2c.py MODEL.bin TOKENIZER.bin OUT_DIR     # config.json, model.safetensors, tokenizer files
    convert_llama2c.py --tokenizer-only TOKENIZER.bin|TOKENIZER.model OUT_DIR  # tokenizer files only

Writes OUT_DIR/config.json (LlamaForCausalLM), OUT_DIR/model.safetensors (F32, Hugging Face tensor
names), OUT_DIR/tokenizer.json (sentencepiece-style BPE with byte fallback) and tokenizer_config.json.

llama2.c "legacy v0" checkpoint (karpathy/llama2.c run.c, read_checkpoint/memory_map_weights):
  header: 7 little-endian int32: dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
          (vocab_size < 0: the classifier is not shared with the embedding and follows at the end)
  fp32:   token_embedding [V, dim], rms_att [L, dim], wq [L, dim, dim], wk [L, kv_dim, dim],
          wv [L, kv_dim, dim], wo [L, dim, dim], rms_ffn [L, dim], w1 [L, hidden, dim],
          w2 [L, dim, hidden], w3 [L, hidden, dim], rms_final [dim],
          freq_cis_real/imag [seq_len, head_size/2] (skipped), wcls [V, dim] if unshared.
  w1 = gate_proj, w3 = up_proj, w2 = down_proj.

RoPE layout: llama2.c rotates interleaved pairs (2i, 2i+1) of each head; Hugging Face's rotate_half rotates
(i, i + head_dim/2) with the same frequency base^(-2i/head_dim). So Hugging Face row i of a head is
llama2.c row 2i and row i + head_dim/2 is row 2i+1: per head, HF rows = [even rows..., odd rows...].
This is the `permute` of transformers' convert_llama_weights_to_hf.py:
  w.view(n_heads, head_dim // 2, 2, dim).transpose(1, 2).reshape(n_heads * head_dim, dim)
applied to wq (n_heads) and wk (n_kv_heads). q.k is unchanged because q and k get the same permutation.

llama2.c tokenizer (tokenizer.bin / tok512.bin, written by llama2.c tokenizer.py): int32 max_token_length,
then per token: float32 score, int32 length, bytes. tokenizer.py replaced sentencepiece's "\u2581" by a
real space and wrote <s>/</s> as "\n<s>\n"/"\n</s>\n"; both are undone here. Ids 0, 1, 2 are <unk>, <s>,
</s>; ids 3..258 are the byte pieces <0x00>..<0xFF>. The tokenizer.json follows transformers'
LlamaConverter (convert_slow_tokenizer.py, legacy mode, as in Llama-2's tokenizer.json): BPE with
byte_fallback and fuse_unk, merges from SentencePieceExtractor (every split of a piece into two pieces
that both exist is a merge; merges sorted by (score of the merged piece, len(left), len(right))
descending, stable, the order before sorting being piece id then (id(left), id(right))).
"""
import array
import json
import os
import struct
import sys

SPIECE_SPACE = "\u2581"


def read_tokenizer_bin(path, vocab_size=None):
    """Returns [(piece, score)] of a llama2.c tokenizer file, pieces in sentencepiece spelling."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 4:
        raise SystemExit(f"{path}: too short for a llama2.c tokenizer")
    off = 4  # max_token_length, unused
    pieces = []
    while off < len(data):
        if off + 8 > len(data):
            raise SystemExit(f"{path}: truncated at token {len(pieces)}")
        score, n = struct.unpack_from("<fi", data, off)
        off += 8
        if n < 0 or off + n > len(data):
            raise SystemExit(f"{path}: token {len(pieces)} has a bad length {n}")
        raw = data[off:off + n]
        off += n
        pieces.append((raw.decode("utf-8"), score))
        if vocab_size is not None and len(pieces) == vocab_size:
            break
    if vocab_size is not None and len(pieces) != vocab_size:
        raise SystemExit(f"{path}: {len(pieces)} tokens, the model has {vocab_size}")
    fixed = {0: "<unk>", 1: "<s>", 2: "</s>"}
    out = []
    for i, (p, s) in enumerate(pieces):
        if i in fixed:
            if p.strip() != fixed[i]:
                raise SystemExit(f"{path}: token {i} is {p!r}, expected {fixed[i]}")
            p = fixed[i]
        else:
            p = p.replace(" ", SPIECE_SPACE)
        out.append((p, s))
    return out


def _varint(data, off):
    v = shift = 0
    while True:
        b = data[off]
        off += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return v, off


def _proto_fields(data):
    """Yields (field number, wire type, value) of one protobuf message (value: int or bytes)."""
    off = 0
    while off < len(data):
        key, off = _varint(data, off)
        field, wire = key >> 3, key & 7
        if wire == 0:
            v, off = _varint(data, off)
        elif wire == 1:
            v, off = data[off:off + 8], off + 8
        elif wire == 2:
            n, off = _varint(data, off)
            v, off = data[off:off + n], off + n
        elif wire == 5:
            v, off = data[off:off + 4], off + 4
        else:
            raise SystemExit(f"unsupported protobuf wire type {wire}")
        yield field, wire, v


def read_sentencepiece_model(path):
    """Returns [(piece, score, type)] of a sentencepiece ModelProto (sentencepiece_model.proto:
    ModelProto.pieces = 1; SentencePiece.piece = 1, score = 2, type = 3 with NORMAL 1, UNKNOWN 2,
    CONTROL 3, USER_DEFINED 4, UNUSED 5, BYTE 6). Only BPE models (trainer_spec.model_type 2)."""
    with open(path, "rb") as f:
        data = f.read()
    pieces = []
    model_type = 1
    for field, wire, v in _proto_fields(data):
        if field == 1 and wire == 2:
            piece, score, typ = "", 0.0, 1
            for f2, w2, v2 in _proto_fields(v):
                if f2 == 1:
                    piece = v2.decode("utf-8")
                elif f2 == 2:
                    score = struct.unpack("<f", v2)[0]
                elif f2 == 3:
                    typ = v2
            pieces.append((piece, score, typ))
        elif field == 2 and wire == 2:  # trainer_spec
            for f2, w2, v2 in _proto_fields(v):
                if f2 == 3:
                    model_type = v2
    if model_type != 2:
        raise SystemExit(f"{path}: sentencepiece model type {model_type} is not BPE (2)")
    return pieces


def generate_merges(pieces):
    """transformers' SentencePieceExtractor.extract / generate_merges with vocab_scores given."""
    vocab = {}
    for i, (p, _) in enumerate(pieces):
        vocab.setdefault(p, i)
    merges = []
    for piece, score in pieces:
        local = []
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            if left in vocab and right in vocab:
                local.append((left, right, score))
        local.sort(key=lambda x: (vocab[x[0]], vocab[x[1]]))
        merges.extend(local)
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [[m[0], m[1]] for m in merges]


def tokenizer_json(pieces, added=None):
    """pieces: [(piece, score)]; added: [(id, content, special)], by default <unk>, <s>, </s>."""
    if added is None:
        added = [(i, p, True) for i, (p, _) in enumerate(pieces) if p in ("<unk>", "<s>", "</s>")]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": i, "content": p, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": sp} for i, p, sp in added],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": SPIECE_SPACE},
            {"type": "Replace", "pattern": {"String": " "}, "content": SPIECE_SPACE}]},
        "pre_tokenizer": None,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": SPIECE_SPACE}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {
            "type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
            "vocab": {p: i for i, (p, _) in enumerate(pieces)},
            "merges": generate_merges(pieces)},
    }


def tokenizer_config(max_len):
    return {
        "add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "pad_token": None, "clean_up_tokenization_spaces": False, "legacy": True,
        "model_max_length": max_len, "tokenizer_class": "LlamaTokenizerFast",
    }


def write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def write_tokenizer(tok_path, out_dir, vocab_size=None, max_len=None):
    """Converts a llama2.c tokenizer.bin, or a sentencepiece BPE *.model (control pieces become special
    added tokens, user-defined pieces plain added tokens, as transformers' converter does)."""
    if tok_path.endswith(".model") or ".model." in os.path.basename(tok_path):
        spm = read_sentencepiece_model(tok_path)
        pieces = [(p, s) for p, s, _ in spm]
        added = [(i, p, t == 3 or t == 2) for i, (p, _, t) in enumerate(spm) if t in (2, 3, 4)]
        write_json(os.path.join(out_dir, "tokenizer.json"), tokenizer_json(pieces, added))
    else:
        pieces = read_tokenizer_bin(tok_path, vocab_size)
        write_json(os.path.join(out_dir, "tokenizer.json"), tokenizer_json(pieces))
    write_json(os.path.join(out_dir, "tokenizer_config.json"), tokenizer_config(max_len or 4096))
    return pieces


def read_checkpoint(path):
    """Returns (header dict, {hf_name: (shape, array('f'))})."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 28:
        raise SystemExit(f"{path}: too short for a llama2.c header")
    dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len = struct.unpack_from("<7i", data, 0)
    shared = vocab > 0
    vocab = abs(vocab)
    head = dim // n_heads
    kv_dim = n_kv * head
    floats = array.array("f")
    floats.frombytes(data[28:len(data) - (len(data) - 28) % 4])
    if sys.byteorder != "little":
        floats.byteswap()
    pos = 0

    def take(*shape):
        nonlocal pos
        n = 1
        for s in shape:
            n *= s
        if pos + n > len(floats):
            raise SystemExit(f"{path}: truncated (needs {n} more floats at float offset {pos})")
        a = floats[pos:pos + n]
        pos += n
        return a

    L = n_layers
    emb = take(vocab, dim)
    rms_att = take(L, dim)
    wq = take(L, dim, dim)
    wk = take(L, kv_dim, dim)
    wv = take(L, kv_dim, dim)
    wo = take(L, dim, dim)
    rms_ffn = take(L, dim)
    w1 = take(L, hidden, dim)
    w2 = take(L, dim, hidden)
    w3 = take(L, hidden, dim)
    rms_final = take(dim)
    take(seq_len, head // 2)  # freq_cis_real
    take(seq_len, head // 2)  # freq_cis_imag
    wcls = None if shared else take(vocab, dim)
    if pos != len(floats):
        raise SystemExit(f"{path}: {len(floats) - pos} trailing floats: not a llama2.c legacy checkpoint")

    def layer(a, i, rows, cols):
        return a[i * rows * cols:(i + 1) * rows * cols]

    def rope_permute(w, heads, cols):
        # HF row h*head + j*(head/2) + r  <-  llama2.c row h*head + 2r + j
        out = array.array("f", bytes(4 * len(w)))
        half = head // 2
        for h in range(heads):
            for j in range(2):
                for r in range(half):
                    src = (h * head + 2 * r + j) * cols
                    dst = (h * head + j * half + r) * cols
                    out[dst:dst + cols] = w[src:src + cols]
        return out

    t = {"model.embed_tokens.weight": ([vocab, dim], emb)}
    for i in range(L):
        p = f"model.layers.{i}."
        t[p + "self_attn.q_proj.weight"] = ([dim, dim], rope_permute(layer(wq, i, dim, dim), n_heads, dim))
        t[p + "self_attn.k_proj.weight"] = ([kv_dim, dim], rope_permute(layer(wk, i, kv_dim, dim), n_kv, dim))
        t[p + "self_attn.v_proj.weight"] = ([kv_dim, dim], layer(wv, i, kv_dim, dim))
        t[p + "self_attn.o_proj.weight"] = ([dim, dim], layer(wo, i, dim, dim))
        t[p + "mlp.gate_proj.weight"] = ([hidden, dim], layer(w1, i, hidden, dim))
        t[p + "mlp.up_proj.weight"] = ([hidden, dim], layer(w3, i, hidden, dim))
        t[p + "mlp.down_proj.weight"] = ([dim, hidden], layer(w2, i, dim, hidden))
        t[p + "input_layernorm.weight"] = ([dim], layer(rms_att, i, 1, dim))
        t[p + "post_attention_layernorm.weight"] = ([dim], layer(rms_ffn, i, 1, dim))
    t["model.norm.weight"] = ([dim], rms_final)
    if wcls is not None:
        t["lm_head.weight"] = ([vocab, dim], wcls)
    hdr = dict(dim=dim, hidden=hidden, n_layers=L, n_heads=n_heads, n_kv=n_kv, vocab=vocab,
               seq_len=seq_len, shared=shared, head=head)
    return hdr, t


def write_safetensors(path, tensors, metadata):
    header = {"__metadata__": metadata}
    off = 0
    names = sorted(tensors)
    for name in names:
        shape, a = tensors[name]
        n = 4 * len(a)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + n]}
        off += n
    hj = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hj += b" " * ((8 - len(hj) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for name in names:
            a = tensors[name][1]
            if sys.byteorder != "little":
                a = array.array("f", a)
                a.byteswap()
            f.write(a.tobytes())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def config_json(h):
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": h["dim"], "intermediate_size": h["hidden"], "num_hidden_layers": h["n_layers"],
        "num_attention_heads": h["n_heads"], "num_key_value_heads": h["n_kv"], "head_dim": h["head"],
        "vocab_size": h["vocab"], "max_position_embeddings": h["seq_len"], "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "tie_word_embeddings": h["shared"], "bos_token_id": 1, "eos_token_id": 2,
        "hidden_act": "silu", "torch_dtype": "float32", "attention_bias": False, "mlp_bias": False,
        "initializer_range": 0.02, "pretraining_tp": 1, "rope_scaling": None, "use_cache": True,
    }


def main(argv):
    if len(argv) == 4 and argv[1] == "--tokenizer-only":
        os.makedirs(argv[3], exist_ok=True)
        pieces = write_tokenizer(argv[2], argv[3])
        print(f"wrote {argv[3]}: tokenizer with {len(pieces)} pieces")
        return 0
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    model_path, tok_path, out_dir = argv[1:]
    os.makedirs(out_dir, exist_ok=True)
    hdr, tensors = read_checkpoint(model_path)
    write_tokenizer(tok_path, out_dir, hdr["vocab"], hdr["seq_len"])
    write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors,
                      {"format": "pt", "source": os.path.basename(model_path) + " (llama2.c legacy)"})
    # config.json last: the build uses it as the "conversion done" marker.
    write_json(os.path.join(out_dir, "config.json"), config_json(hdr))
    print(f"wrote {out_dir}: {len(tensors)} tensors, vocab {hdr['vocab']}, dim {hdr['dim']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
