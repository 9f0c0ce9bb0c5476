#!/usr/bin/env python3
"""Prompts longer than any training sample, for the acceptance length on long contexts (issue 15 item 5).

Joins the 80 summarization articles of Spec-Bench (../shared/data/spec-bench/question.jsonl, category
"summarization"), longest first, into N prompts of K articles each (prompt i takes articles i, i + N, ...,
so every prompt mixes long and short ones; no article twice) under one instruction, and writes them as
MT-Bench-style JSONL (question_id, category "long_summarization", turns [text]) that `aerie eval --prompts`
reads. With the defaults (16 prompts of 5 articles): 14,183-20,117 characters, 3,839 SmolLM2 tokens on
average with the smollm2 chat template, against training samples of at most 2,048 tokens.

usage: long_prompts.py SPEC_BENCH_JSONL OUT_JSONL [N=16] [K=5]
"""
import json
import sys


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    src, dst = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 16
    k = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    articles = []
    with open(src, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                q = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"long_prompts.py: {src}:{line_no}: not JSON ({e})")
            if q.get("category") == "summarization":
                articles.append(q["turns"][0])
    if len(articles) < n * k:
        sys.exit(f"long_prompts.py: {src} has {len(articles)} summarization prompts, {n} x {k} needed")
    articles.sort(key=len, reverse=True)
    with open(dst, "w", encoding="utf-8") as out:
        for i in range(n):
            parts = [articles[i + n * j] for j in range(k)]
            count = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six"}.get(k, str(k))
            text = f"Summarize each of the following {count} texts in a few sentences.\n\n" + "\n\n".join(
                f"Text {j + 1}:\n{t}" for j, t in enumerate(parts))
            out.write(json.dumps({"question_id": 9000 + i, "category": "long_summarization", "turns": [text]}) + "\n")


if __name__ == "__main__":
    main()
