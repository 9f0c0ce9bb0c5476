#!/usr/bin/env python3
"""Golden token ids of the Kimi-K2 tokenizer for aerie's tests (tests/fixtures/tokenizer/kimi_k2.json).

    pip install tiktoken                        # for this generator only; aerie never needs it
    python3 tools/reference/kimi_tokenizer_golden.py [DATA_DIR] [OUT_DIR]

DATA_DIR defaults to ../shared/data beside the checkout, OUT_DIR to tests/fixtures/tokenizer.

The ids come from OpenAI's `tiktoken` package itself, set up as Moonshot AI's tokenization_kimi.py
(TikTokenTokenizer) sets it up: mergeable ranks from DATA_DIR/tokenizers/kimi-k2/tiktoken.model, the split
regex pat_str (pat_str.txt there, checked against the copy below), and special tokens at ids
n .. n+255 after the n ranks, named by tokenizer_config.json's added_tokens_decoder, the others
<|reserved_token_ID|>. encode() is tokenization_kimi.py's: tiktoken encode(allowed_special="all") on
pieces of at most 400,000 characters and 25,000 consecutive (non-)whitespace characters.
"decoded" is tiktoken's decode (errors="replace") of the ids without the special tokens ("special": true
in the config, and the reserved ones), which is what aerie's decode returns.

Strings: llama.cpp's 46 vocab-test strings (llama.cpp-vocab-tests/*.inp, split on
"\\n__ggml_vocab_test__\\n"), tokenizer_golden.py's byte_level_strings(), and kimi_strings() below
(Chinese/Japanese with CJK punctuation, emoji, code, Kimi's special tokens, the regex's letter classes).
Also the total ids and an FNV-1a hash of all 2,978 ShareGPT prompts (as sharegpt_prompts.json has them for
the other byte-level tokenizers).
"""
import base64
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from tokenizer_golden import byte_level_strings, fnv1a64  # noqa: E402

# TikTokenTokenizer.pat_str of tokenization_kimi.py.
PAT_STR = "|".join([
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])
NUM_RESERVED = 256


def kimi_strings():
    return [
        "Hello, world!", "\u4f60\u597d\uff0c\u4e16\u754c", "1234567 I'm DON'T",
        "\u4eca\u5929\u5929\u6c14\u5f88\u597d\u3002\u6211\u4eec\u53bb\u516c\u56ed\u5427\uff01\u201c\u5f15\u53f7\u201d\u3001\u300a\u4e66\u540d\u300b",
        "\u4e2d\u6587English\u6df7\u5408mixed\u6587\u672c123\u4e2a", "a\u4e2db \u4e2dA \u6f22\u5b57\u3005\u3007",
        "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3001\u30ab\u30bf\u30ab\u30ca\u30fc\u30fb\u3072\u3089\u304c\u306a\u301c",
        "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8\uc785\ub2c8\ub2e4.", "\u0645\u064e\u0631\u0652\u062d\u064e\u0628\u064b\u0627 \u0928\u092e\u0938\u094d\u0924\u0947",
        "\u01c5ungla \u01c4 \u01c6 \u02b0h \u1d2c\u1d2e", "HelloWorld camelCase XMLHttpRequest iPhone McDonald's",
        "I'M we'LL they'Re it's IT'S she'd 'ſ 'K", "\U0001F600\U0001F680\U0001F469\u200d\U0001F4BB\U0001F1E8\U0001F1F3 \u2764\ufe0f\U0001F44D\U0001F3FD",
        "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
        "#include <stdio.h>\nint main(void) {\n\tprintf(\"%d\\n\", 42);\r\n}\n",
        "SELECT * FROM t WHERE x >= 10 AND y <> 'a';  -- \u6ce8\u91ca", "$$\\frac{a}{b} = \\sum_{i=1}^{n} x_i^2$$",
        "<|im_system|>system<|im_middle|>You are a helpful assistant<|im_end|><|im_user|>user<|im_middle|>\u4f60\u597d<|im_end|><|im_assistant|>assistant<|im_middle|>",
        "[BOS]text[EOS] [UNK][PAD] [EOT]", "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
        "<|tool_call_argument_begin|>{\"city\": \"\u5317\u4eac\"}<|tool_call_end|><|tool_calls_section_end|>",
        "<|reserved_token_163600|> <|reserved_token_163839|> <|reserved_token_163584|>", "<think>\u601d\u8003</think>\u7b54\u6848",
        "<|im_end", "<|im_end|<|im_end|>|>", "\u3000\u5168\u89d2\u7a7a\u683c\u3000\uff21\uff22\uff23\uff11\uff12\uff13",
        " " * 40 + "x", "\n" * 5 + "\t\t", "\u00e9\u0301 e\u0301 \u1e9b\u0323",
    ]


def llamacpp_strings(data):
    text = open(os.path.join(data, "llama.cpp-vocab-tests", "ggml-vocab-llama-bpe.gguf.inp"), encoding="utf-8").read()
    return text.split("\n__ggml_vocab_test__\n")[:46]


def split_long(s, limit=25_000):
    """tokenization_kimi.py _split_whitespaces_or_nonwhitespaces."""
    cur_len, cur_space, start = 0, (s[0].isspace() if s else False), 0
    for i in range(len(s)):
        sp = s[i].isspace()
        if cur_space ^ sp:
            cur_len, cur_space = 1, sp
        else:
            cur_len += 1
            if cur_len > limit:
                yield s[start:i]
                start, cur_len = i, 1
    yield s[start:]


def kimi_encoding(folder):
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe
    pat = open(os.path.join(folder, "pat_str.txt"), encoding="utf-8").read().rstrip("\r\n")
    assert pat == PAT_STR, "pat_str.txt differs from tokenization_kimi.py's pat_str"
    ranks = load_tiktoken_bpe(os.path.join(folder, "tiktoken.model"))
    cfg = json.load(open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8"))
    named = {int(k): v for k, v in cfg["added_tokens_decoder"].items()}
    n = len(ranks)
    specials = {named[i]["content"] if i in named else f"<|reserved_token_{i}|>": i for i in range(n, n + NUM_RESERVED)}
    skip = {i for i in range(n, n + NUM_RESERVED) if i not in named or named[i].get("special", True)}
    enc = tiktoken.Encoding(name="kimi-k2", pat_str=PAT_STR, mergeable_ranks=ranks, special_tokens=specials)

    def encode(text):
        ids = []
        for i in range(0, len(text), 400_000):
            for sub in split_long(text[i:i + 400_000]):
                ids.extend(enc.encode(sub, allowed_special="all"))
        return ids
    return enc, encode, skip, cfg


def main():
    data = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(REPO, "..", "shared", "data"))
    out_dir = sys.argv[2] if len(sys.argv) > 2 else os.path.join(REPO, "tests", "fixtures", "tokenizer")
    folder = os.path.join(data, "tokenizers", "kimi-k2")
    enc, encode, skip, cfg = kimi_encoding(folder)
    strings, seen = [], set()
    for s in llamacpp_strings(data) + byte_level_strings() + kimi_strings():
        if s not in seen:
            seen.add(s)
            strings.append(s)
    cases = []
    for s in strings:
        ids = encode(s)
        cases.append({"text": s, "ids": ids, "decoded": enc.decode([i for i in ids if i not in skip], errors="replace")})
    # SOURCE.txt's ids, checked here too.
    assert encode("Hello, world!") == [19180, 11, 2695, 0]
    assert encode("\u4f60\u597d\uff0c\u4e16\u754c") == [33845, 378, 2243]
    assert encode("1234567 I'm DON'T") == [6694, 12972, 22, 6806, 92629, 64833]

    path = os.path.join(data, "sharegpt-v3-prompts", "sg_90k_part1_html_cleaned_lang_first_sampled_sorted.json")
    prompts = [c["conversations"][0]["value"] if c["conversations"] else "" for c in json.load(open(path, encoding="utf-8"))]
    t0 = time.time()
    all_ids = [i for p in prompts for i in encode(p)]
    print(f"sharegpt: {len(prompts)} prompts, {len(all_ids)} ids, tiktoken {time.time() - t0:.2f} s")

    fixture = {
        "tokenizer": "kimi-k2", "source": "tokenizers/kimi-k2 (tiktoken.model, pat_str.txt, tokenizer_config.json)",
        "generator": f"tools/reference/kimi_tokenizer_golden.py (tiktoken {__import__('tiktoken').__version__})",
        "vocab_size": enc.n_vocab, "bos": cfg["bos_token"], "eos": cfg["eos_token"],
        "sharegpt": {"prompts": len(prompts), "total_ids": len(all_ids), "fnv1a64": f"{fnv1a64(all_ids):016x}"},
        "cases": cases}
    out = os.path.join(out_dir, "kimi_k2.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump(fixture, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    lossy = [c["text"][:30] for c in cases if c["decoded"] != c["text"]]
    print(f"kimi-k2: wrote {out} ({len(cases)} cases, {os.path.getsize(out)} bytes); decode != text for "
          f"{len(lossy)}: {lossy}")


if __name__ == "__main__":
    main()
