#!/usr/bin/env python3
"""Golden token ids for aerie's tokenizer tests (tests/fixtures/tokenizer/*.json).

    pip install tokenizers sentencepiece        # for this generator only; aerie never needs them
    python3 tools/reference/tokenizer_golden.py [DATA_DIR] [OUT_DIR]
    python3 tools/reference/tokenizer_golden.py --byte-level [DATA_DIR] [OUT_DIR]   # the byte-level ones only

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
Byte-level BPE (Llama-3, Qwen3, DeepSeek-V3, used as they are in DATA_DIR/tokenizers): byte_level_strings()
encoded with ids, decode and offsets (HF character offsets converted to UTF-8 byte offsets) into
{llama3,qwen3,deepseek_v3}.json, and deepseek_v3_llamacpp.json: DeepSeek-V3's ids for llama.cpp's 46 strings
(its vocabulary is not the deepseek-llm one llama.cpp has goldens for; the script prints how many agree).

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


# ---- byte-level BPE tokenizers (Llama-3, Qwen3, DeepSeek-V3): used as they are, no conversion ----
BYTE_LEVEL = {"llama3": "tokenizers/llama3", "qwen3": "tokenizers/qwen3", "deepseek_v3": "tokenizers/deepseek-v3"}


def byte_level_strings():
    """Edge cases of the pre-tokenizer regexes, normalizers and added tokens, beyond llama.cpp's strings."""
    return [
        "", " ", "Hello world", "  leading spaces", "trailing spaces  ", "a\n\nb\r\nc\rd", "\t\tindented\n",
        "I'M DON'T we'LL 'S 's 'Re he'd", "it\u017fs \u02bcs 'K", "x = f(a, b) { return a+b; } // c++ ->",
        "def f(x):\n    return [i**2 for i in range(10)]\n", '{"key": [1, 2.5, -3e10], "ok": true}',
        "digits 0123456789 12345 3.14159 1,000,000 2024-11-29 \u0661\u0662\u0663 \u00b2\u00bd",
        "caf\u00e9 cafe\u0301 \u212b A\u030a \ufb01 \u1e9b\u0323", "na\u00efve r\u00e9sum\u00e9 \u00c4pfel Stra\u00dfe",
        "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440!", "\u4f60\u597d\uff0c\u4e16\u754c\uff01\u4eca\u5929\u662f2024\u5e74",
        "\u3053\u3093\u306b\u3061\u306f\u30ab\u30bf\u30ab\u30ca", "\ud55c\uad6d\uc5b4 \u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22",
        "\u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u05e2\u05d1\u05e8\u05d9\u05ea",
        "emoji \U0001F600\U0001F999 \U0001F469\u200d\U0001F4BB \U0001F1FA\U0001F1F8 \u2764\ufe0f",
        "\u00a0nbsp\u2009thin\u3000ideographic\u000bvtab\u0085nel\u2028ls\u000cff",
        "quotes \u201cdouble\u201d \u2018single\u2019 \u2014 dash \u2026 \u00ab\u00bb",
        "!!!!!! ??? ... ,,, ;;; ::: --- ___ *** ### $$$ %%% &&& @@@ ^^^ ~~~ ``` |||",
        "http://example.com/a?b=c&d=e#f user@mail.org C:\\path\\file.txt",
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>",
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nOK<|im_end|>",
        "<\uff5cbegin\u2581of\u2581sentence\uff5c><\uff5cUser\uff5c>Hi<\uff5cAssistant\uff5c>Hello<\uff5cend\u2581of\u2581sentence\uff5c>",
        "<tool_call>\n{\"name\": \"f\"}\n</tool_call> text<|endoftext|>more", "< |im_start| > <|im_start", "<s> </s> <unk>",
        "\u0120\u010a already-mapped \u0100", "A" * 300, "ab " * 100,
    ]


def char_to_byte_offsets(text, offsets):
    pos = [0]
    for ch in text:
        pos.append(pos[-1] + len(ch.encode("utf-8")))
    return [[pos[b], pos[e]] for b, e in offsets]


def write_byte_level_fixtures(data, out_dir):
    from tokenizers import Tokenizer
    texts = {}
    for name, rel in BYTE_LEVEL.items():
        tok = Tokenizer.from_file(os.path.join(data, rel, "tokenizer.json"))
        cases = []
        for s in byte_level_strings():
            enc = tok.encode(s, add_special_tokens=False)
            cases.append({"text": s, "ids": enc.ids, "decoded": tok.decode(enc.ids, skip_special_tokens=True),
                          "offsets": char_to_byte_offsets(s, enc.offsets)})
        fixture = {"tokenizer": name, "source": rel + "/tokenizer.json",
                   "generator": "tools/reference/tokenizer_golden.py (HF tokenizers encode(text, "
                                "add_special_tokens=False); offsets: HF character offsets as UTF-8 byte offsets)",
                   "cases": cases}
        path = os.path.join(out_dir, f"{name}.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(fixture, f, ensure_ascii=False, indent=0)
            f.write("\n")
        print(f"{name}: wrote {path} ({len(cases)} cases)")
    # DeepSeek-V3 on llama.cpp's strings: its vocabulary is not deepseek-llm's (llama.cpp has no V3 goldens).
    tok = Tokenizer.from_file(os.path.join(data, BYTE_LEVEL["deepseek_v3"], "tokenizer.json"))
    gold = llamacpp_cases(data, "deepseek-llm")
    same = sum(tok.encode(t, add_special_tokens=False).ids == ids for t, ids in gold)
    print(f"deepseek-v3 vs llama.cpp deepseek-llm goldens: {same}/{len(gold)} equal (a different vocabulary)")
    cases = [{"text": t, "ids": tok.encode(t, add_special_tokens=False).ids} for t, _ in gold]
    path = os.path.join(out_dir, "deepseek_v3_llamacpp.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"tokenizer": "deepseek_v3", "source": "tokenizers/deepseek-v3/tokenizer.json on "
                   "llama.cpp-vocab-tests/ggml-vocab-deepseek-llm.gguf.inp",
                   "generator": "tools/reference/tokenizer_golden.py (HF tokenizers, add_special_tokens=False)",
                   "cases": cases}, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print(f"deepseek_v3: wrote {path} ({len(cases)} cases)")
    for name, tk in (("llama-bpe", "llama3"), ("qwen2", "qwen3")):
        tok = Tokenizer.from_file(os.path.join(data, BYTE_LEVEL[tk], "tokenizer.json"))
        gold = llamacpp_cases(data, name)
        same = sum(tok.encode(t, add_special_tokens=False).ids == ids for t, ids in gold)
        print(f"{tk} vs llama.cpp {name} goldens: {same}/{len(gold)} equal")


def gpt2_bytes_to_unicode():
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def synthetic_byte_level(pre_tokenizer, normalizer=None, ignore_merges=False, post_processor=None, array_merges=False):
    """A tiny byte-level BPE tokenizer.json (256 byte pieces + a few merges, added tokens) around
    `pre_tokenizer`, to pin down the Split behaviors, Digits, ByteLevel options and added-token flags."""
    m = gpt2_bytes_to_unicode()
    vocab = {m[b]: i for i, b in enumerate(sorted(m))}
    pairs = [("\u0120", "t"), ("h", "e"), ("\u0120t", "he"), ("i", "n"), ("\u0120", "a"), ("1", "2"), ("e", "r"),
             ("\u0120", "\u0120"), ("o", "r"), ("w", "or"), ("\u0120w", "or"), ("\u0120", "w"), ("l", "d"),
             ("\u0120wor", "ld"), ("\u00c3", "\u00a9"), (",", "\u0120")]
    merges = []
    for a, b in pairs:
        vocab.setdefault(a + b, len(vocab))
        merges.append([a, b] if array_merges else f"{a} {b}")
    vocab["\u0120the\u0120end"] = len(vocab)  # only reachable through ignore_merges
    added = [
        {"id": len(vocab), "content": "<|bos|>", "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True},
        {"id": len(vocab) + 1, "content": "<|sep|>", "single_word": False, "lstrip": True, "rstrip": True,
         "normalized": False, "special": True},
        {"id": len(vocab) + 2, "content": "[tool]", "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": True, "special": False},
    ]
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": normalizer,
            "pre_tokenizer": pre_tokenizer, "post_processor": post_processor,
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                      "ignore_merges": ignore_merges, "vocab": vocab, "merges": merges}}


def write_synthetic_fixture(out_dir):
    from tokenizers import Tokenizer
    bl = lambda prefix, regex: {"type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": False,
                                "use_regex": regex}
    split = lambda pat, behavior, invert=False, key="Regex": {
        "type": "Split", "pattern": {key: pat}, "behavior": behavior, "invert": invert}
    seq = lambda *p: {"type": "Sequence", "pretokenizers": list(p)}
    bos = {"type": "TemplateProcessing",
           "single": [{"SpecialToken": {"id": "<|bos|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
           "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
           "special_tokens": {"<|bos|>": {"id": "<|bos|>", "ids": [256 + 17], "tokens": ["<|bos|>"]}}}
    variants = {
        "gpt2_prefix": dict(pre_tokenizer=bl(True, True)),
        "removed_digits": dict(pre_tokenizer=seq(split("\\d+", "Removed"), bl(True, False))),
        "merged_with_previous": dict(pre_tokenizer=seq(split(" ", "MergedWithPrevious", key="String"), bl(False, False))),
        "merged_with_next": dict(pre_tokenizer=seq(split("[,.]", "MergedWithNext"),
                                                   {"type": "Digits", "individual_digits": True}, bl(False, False))),
        "contiguous_invert": dict(pre_tokenizer=seq(split("\\s+", "Contiguous", invert=True),
                                                    {"type": "Digits", "individual_digits": False}, bl(False, True))),
        "isolated_invert": dict(pre_tokenizer=seq(split("[a-z]+", "Isolated", invert=True), bl(False, False))),
        "nfkc_ignore_merges_template": dict(
            pre_tokenizer=bl(True, True), normalizer={"type": "Sequence", "normalizers": [{"type": "NFKC"}]},
            ignore_merges=True, post_processor={"type": "Sequence", "processors": [bl(True, False), bos]},
            array_merges=True),
    }
    strings = ["the end", "the world, 12345 and 6789.", "  the  world  ", "in in\tinner 12,34.5", "caf\u00e9 \ufb01ne \u2460",
               "a<|sep|>b  <|sep|>  c", "<|bos|>the end<|bos|>", "x[tool]y \uff3btool\uff3d", "", " ", "1", "the\u00a0end\n\nthe end "]
    out = []
    for name, kw in variants.items():
        tj = synthetic_byte_level(**kw)
        tok = Tokenizer.from_str(json.dumps(tj))
        cases = []
        for s in strings:
            enc = tok.encode(s, add_special_tokens=False)
            cases.append({"text": s, "ids": enc.ids, "decoded": tok.decode(enc.ids, skip_special_tokens=True),
                          "offsets": char_to_byte_offsets(s, enc.offsets),
                          "ids_with_specials": tok.encode(s).ids})
        out.append({"name": name, "tokenizer": tj, "cases": cases})
    path = os.path.join(out_dir, "synthetic_byte_level.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"generator": "tools/reference/tokenizer_golden.py (HF tokenizers on synthetic tokenizer.json "
                   "variants)", "variants": out}, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"synthetic: wrote {path} ({len(out)} variants x {len(strings)} strings)")


def fnv1a64(ids):
    h = 0xcbf29ce484222325
    for i in ids:
        for k in range(4):
            h ^= (i >> (8 * k)) & 0xFF
            h = (h * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def write_sharegpt_fixture(data, out_dir):
    """Total ids and an FNV-1a hash (over the ids as little-endian int32, prompt after prompt) of all 2,978
    ShareGPT prompts, per byte-level tokenizer: a cheap golden over 1.7 MB of real chat text."""
    import time
    from tokenizers import Tokenizer
    path = os.path.join(data, "sharegpt-v3-prompts", "sg_90k_part1_html_cleaned_lang_first_sampled_sorted.json")
    prompts = [c["conversations"][0]["value"] if c["conversations"] else "" for c in json.load(open(path, encoding="utf-8"))]
    res = {"source": "sharegpt-v3-prompts/sg_90k_part1_html_cleaned_lang_first_sampled_sorted.json: "
                     "conversations[0].value of every record (\"\" if none)", "prompts": len(prompts), "tokenizers": {}}
    for name, rel in BYTE_LEVEL.items():
        tok = Tokenizer.from_file(os.path.join(data, rel, "tokenizer.json"))
        t0 = time.time()
        all_ids, counts = [], []
        for p in prompts:
            ids = tok.encode(p, add_special_tokens=False).ids
            all_ids.extend(ids)
            counts.append(len(ids))
        dt = time.time() - t0
        res["tokenizers"][name] = {"total_ids": len(all_ids), "fnv1a64": f"{fnv1a64(all_ids):016x}",
                                   "first_ten_counts": counts[:10]}
        print(f"sharegpt {name}: {len(all_ids)} ids, HF tokenizers {dt:.2f} s (one thread)")
    with open(os.path.join(out_dir, "sharegpt_prompts.json"), "w", encoding="utf-8") as f:
        json.dump(res, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--byte-level":
        d = os.path.abspath(sys.argv[2] if len(sys.argv) > 2 else os.path.join(REPO, "..", "shared", "data"))
        o = sys.argv[3] if len(sys.argv) > 3 else os.path.join(REPO, "tests", "fixtures", "tokenizer")
        write_byte_level_fixtures(d, o)
        write_synthetic_fixture(o)
        write_sharegpt_fixture(d, o)
    else:
        main()
        write_byte_level_fixtures(os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                                                  os.path.join(REPO, "..", "shared", "data")),
                                  sys.argv[2] if len(sys.argv) > 2 else
                                  os.path.join(REPO, "tests", "fixtures", "tokenizer"))
        write_synthetic_fixture(sys.argv[2] if len(sys.argv) > 2 else os.path.join(REPO, "tests", "fixtures", "tokenizer"))
        write_sharegpt_fixture(os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                                               os.path.join(REPO, "..", "shared", "data")),
                               sys.argv[2] if len(sys.argv) > 2 else os.path.join(REPO, "tests", "fixtures", "tokenizer"))
