#!/usr/bin/env python3
"""Golden token ids for aerie's tokenizer tests (tests/fixtures/tokenizer/*.json).

    pip install tokenizers sentencepiece        # for this generator only; aerie never needs them
    python3 tools/reference/tokenizer_golden.py [DATA_DIR] [OUT_DIR]

DATA_DIR defaults to ../shared/data beside the checkout, OUT_DIR to tests/fixtures/tokenizer.

For each sentencepiece-BPE tokenizer that aerie reads (stories260K's tok512, Llama-2, Mistral v1), this
converts the original to a Hugging Face tokenizer.json with tools/convert_llama2c.py (the same code the
build runs), encodes a fixed set of strings with the Hugging Face `tokenizers` package
(encode(text, add_special_tokens=False), decode(ids, skip_special_tokens=True)) and writes
{"tokenizer": ..., "source": ..., "cases": [{"text", "ids", "decoded"}]}.

Cross-checks, printed (differences are listed, not hidden):
  * Llama-2: the converted tokenizer.json against llama.cpp's llama-spm goldens (ids that HF transformers
    gave with Meta's own Llama-2 tokenizer.json), and against the sentencepiece library on tokenizer.model.
  * Mistral v1: against the sentencepiece library on tokenizer.model.v1.
  * tok512: against llama2.c run.c's encode (dummy prefix " ", then repeatedly merge the adjacent pair whose
    merged piece has the best score, leftmost on ties) on every TinyStories paragraph.
sentencepiece treats "<s>" in the text as plain characters while HF tokenizers splits out special added
tokens; strings holding them are excluded from the sentencepiece comparison.
"""
import importlib.util
import json
import os
import struct
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def load_converter():
    spec = importlib.util.spec_from_file_location("convert_llama2c", os.path.join(REPO, "tools", "convert_llama2c.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def tinystories_paragraphs(data):
    text = open(os.path.join(data, "tinystories", "tinystories_val.txt"), encoding="utf-8").read()
    return [p for p in text.split("\n\n") if p.strip()]


def test_strings(paragraphs):
    edge = [
        "", " ", "  ", "\n", "\n\n", "\t", "a", "Hello", " Hello", "  Hello", "Hello world", "Hello  world",
        "Hello\nworld", "line one\n\nline two\n", "trailing space ", "   leading and trailing   ",
        "Once upon a time", "Once upon a time, there was a little girl named Lily.",
        "digits 0123456789 3.14159 1,000,000 2024-11-29",
        "caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00c4pfel Stra\u00dfe",
        "\u041f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440", "\u4f60\u597d\uff0c\u4e16\u754c", "\u3053\u3093\u306b\u3061\u306f",
        "emoji \U0001F600 \U0001F999 \U0001F680 \U0001F469\u200d\U0001F4BB", "\u00a0non-breaking\u2009thin",
        "mixed\ttabs\tand spaces", "<s>", "</s>", "<unk>", "a<s>b", "text </s> more", "<s><s>", "<0x41>",
        "\u2581already\u2581metaspace", "quotes \u201cdouble\u201d \u2018single\u2019 \u2014 dash \u2026",
        "!!!!!!", "333333333", "   \n   \n", "ends with newline\n",
    ]
    # TinyStories: short and long paragraphs, and ones with the mojibake the data set has (e.g. "\u00e2\u20ac\u2122").
    picks = paragraphs[:8] + [p for p in paragraphs if "\u00e2" in p][:3] + [max(paragraphs[:200], key=len)]
    return edge + picks


# ---- llama2.c run.c encode (reference for tok512) ----
def read_llama2c_vocab(path):
    data = open(path, "rb").read()
    off, vocab, scores = 4, [], []
    while off < len(data):
        s, n = struct.unpack_from("<fi", data, off)
        off += 8
        vocab.append(data[off:off + n])
        scores.append(s)
        off += n
    return vocab, scores


def llama2c_encode(text, vocab, scores, lookup):
    b = text.encode("utf-8")
    tokens = []
    if b:
        tokens.append(lookup[b" "])
    i = 0
    while i < len(b):
        n = 1
        while i + n < len(b) and (b[i + n] & 0xC0) == 0x80 and n < 4:
            n += 1
        ch = b[i:i + n]
        if ch in lookup:
            tokens.append(lookup[ch])
        else:
            tokens.extend(x + 3 for x in ch)
        i += n
    while True:
        best, best_id, best_i = -1e10, -1, -1
        for k in range(len(tokens) - 1):
            m = lookup.get(vocab[tokens[k]] + vocab[tokens[k + 1]])
            if m is not None and scores[m] > best:
                best, best_id, best_i = scores[m], m, k
        if best_i < 0:
            return tokens
        tokens[best_i:best_i + 2] = [best_id]


def llamacpp_cases(data, name):
    base = os.path.join(data, "llama.cpp-vocab-tests", f"ggml-vocab-{name}.gguf")
    texts = open(base + ".inp", encoding="utf-8").read().split("\n__ggml_vocab_test__\n")
    lines = open(base + ".out", encoding="utf-8").read().split("\n")
    texts, lines = texts[:46], lines[:46]
    return [(t, [int(x) for x in l.split()]) for t, l in zip(texts, lines)]


# Variants of the converted Llama-2 tokenizer.json in the other form Hugging Face writes sentencepiece
# tokenizers in (transformers' LlamaConverter with legacy=False: no normalizer, a Metaspace
# pre-tokenizer). tests/tokenizer/golden_test.cc applies the same edits.
METASPACE_VARIANTS = {
    "llama2_metaspace_first": {
        "normalizer": None,
        "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}},
    "llama2_metaspace_split": {
        "normalizer": None,
        "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True},
        "decoder": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True}},
}


def write_fixture(out_dir, name, rel, tok, strings):
    cases = []
    for s in strings:
        ids = tok.encode(s, add_special_tokens=False).ids
        cases.append({"text": s, "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=True)})
    fixture = {"tokenizer": name, "source": rel,
               "generator": "tools/reference/tokenizer_golden.py (HF tokenizers on tools/convert_llama2c.py output)",
               "cases": cases}
    path = os.path.join(out_dir, f"{name}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(fixture, f, ensure_ascii=False, indent=0)
        f.write("\n")
    bad_rt = [c["text"] for c in cases if c["decoded"] != c["text"]]
    print(f"{name}: wrote {path} ({len(cases)} cases); HF decode(encode(s)) != s for {len(bad_rt)}: "
          f"{[t[:20] for t in bad_rt]}")


def main():
    from tokenizers import Tokenizer
    data = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(REPO, "..", "shared", "data"))
    out_dir = sys.argv[2] if len(sys.argv) > 2 else os.path.join(REPO, "tests", "fixtures", "tokenizer")
    os.makedirs(out_dir, exist_ok=True)
    conv = load_converter()
    paragraphs = tinystories_paragraphs(data)
    strings = test_strings(paragraphs)
    sources = {
        "tok512": "stories260K/tok512.bin",
        "llama2": "tokenizers/llama2-sentencepiece/tokenizer.model",
        "mistral_v1": "tokenizers/mistral/tokenizer.model.v1",
    }
    tmp = tempfile.mkdtemp(prefix="aerie_tok_")
    for name, rel in sources.items():
        src = os.path.join(data, rel)
        d = os.path.join(tmp, name)
        os.makedirs(d)
        conv.write_tokenizer(src, d)
        tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        write_fixture(out_dir, name, rel, tok, strings)
        if name == "llama2":
            base = json.load(open(os.path.join(d, "tokenizer.json"), encoding="utf-8"))
            for vname, edits in METASPACE_VARIANTS.items():
                vt = Tokenizer.from_str(json.dumps(dict(base, **edits)))
                write_fixture(out_dir, vname, rel + " + " + json.dumps(edits, ensure_ascii=False), vt, strings)

        if rel.endswith(".model") or ".model." in rel:
            import sentencepiece as spm
            sp = spm.SentencePieceProcessor(model_file=src)
            diff = [s for s in strings if not any(t in s for t in ("<s>", "</s>", "<unk>"))
                    and sp.encode(s) != tok.encode(s, add_special_tokens=False).ids]
            print(f"  vs sentencepiece: {len(diff)} differences: {[d[:30] for d in diff]}")
        if name == "llama2":
            gold = llamacpp_cases(data, "llama-spm")
            diff = [t for t, ids in gold if tok.encode(t, add_special_tokens=False).ids != ids]
            print(f"  vs llama.cpp llama-spm goldens: {len(gold) - len(diff)}/{len(gold)} equal; "
                  f"differences: {[d[:30] for d in diff]}")
        if name == "tok512":
            vocab, scores = read_llama2c_vocab(src)
            lookup = {}
            for i, v in enumerate(vocab):
                lookup.setdefault(v, i)
            diff = []
            for p in paragraphs:
                a = llama2c_encode(p, vocab, scores, lookup)
                b = tok.encode(p, add_special_tokens=False).ids
                if a != b:
                    diff.append((p[:40], a[:10], b[:10]))
            print(f"  vs llama2.c encode on {len(paragraphs)} TinyStories paragraphs: {len(diff)} differences")
            for d in diff[:5]:
                print("   ", d)


if __name__ == "__main__":
    main()
