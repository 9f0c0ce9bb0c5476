#!/usr/bin/env bash
# The DeepSeek-V3 / Kimi-K2.5 fixtures' extract and eval on the GPU against the CPU, on one GPU machine
# (issue 12's "done when"): for the FP8 DeepSeek-V3 and INT4 Kimi-K2.5 fixtures, widened to the real
# vocabularies (tests/tools/widen_vocab) and with the draft that ctest deepseek_chat_pipeline trained,
#   - aerie extract in BF16 on the CPU and on the GPU over the same prepared file: the relative L2 of
#     every shard dataset (aux and final hidden states) between the two;
#   - aerie eval (BF16, 8 prompts, 16 new tokens, 3 draft tokens) on both: lossless, acceptance length and
#     whether the example's decoded text and the greedy token count are the same.
# Usage: tools/check_deepseek_gpu.sh AERIE WIDEN_VOCAB SOURCE_DIR TOKENIZERS_DIR CHAT_WORK_DIR OUT_DIR
#   CHAT_WORK_DIR: build/test-scratch/deepseek_chat_pipeline (its */export, */prepared.h5, */regen.jsonl).
# Needs python3 with h5py and numpy for the shard comparison. Prints one line per check.
set -euo pipefail
aerie=$1 widen=$2 src=$3 toks=$4 chat=$5 out=$6
mkdir -p "$out"
for c in "deepseek_v3_fp8 deepseek-v3 129280 deepseek-v3" "kimi_k25_int4 kimi-k2 163840 kimi-k2"; do
  read -r m tokdir V tmpl <<<"$c"
  w="$out/$m" && mkdir -p "$w"
  "$widen" "$src/tests/model/fixtures/hf/$m" "$toks/$tokdir" "$V" "$w/model" >/dev/null
  for dev in cpu cuda; do
    "$aerie" extract --model "$w/model" --device $dev --dtype bf16 --prepared "$chat/$m/prepared.h5" \
      --output "$w/shards_$dev" --aux-layers 0,1,3 --samples-per-shard 8 >"$w/extract_$dev.log" 2>&1
    "$aerie" eval --model "$w/model" --draft "$chat/$m/export" --device $dev --dtype bf16 --chat-template "$tmpl" \
      --prompts "$chat/$m/regen.jsonl" --num-prompts 8 --max-new-tokens 16 --num-draft-tokens 3 \
      --output "$w/eval_$dev.json" >"$w/eval_$dev.log" 2>&1
  done
  python3 - "$w" "$m" <<'PY'
import glob, json, os, sys
import h5py, numpy as np
w, m = sys.argv[1], sys.argv[2]
worst = {}
for f in sorted(glob.glob(f"{w}/shards_cpu/shard-*.h5")):
    g = f.replace("shards_cpu", "shards_cuda")
    with h5py.File(f) as a, h5py.File(g) as b:
        def visit(name, obj):
            if not (isinstance(obj, h5py.Dataset) and name.endswith("hidden_states") and obj.size):
                return
            def f32(d):  # BF16 shards hold the bf16 bits as uint16
                v = np.asarray(d[()])
                return (v.astype(np.uint32) << 16).view(np.float32) if v.dtype == np.uint16 else v.astype(np.float32)
            x, y = f32(a[name]), f32(b[name])
            r = float(np.linalg.norm(x - y) / max(np.linalg.norm(x), 1e-30))
            worst[name] = max(worst.get(name, 0.0), r)
        a.visititems(visit)
e = {d: json.load(open(f"{w}/eval_{d}.json")) for d in ("cpu", "cuda")}
same = e["cpu"].get("example") == e["cuda"].get("example") and e["cpu"].get("greedy_tokens") == e["cuda"].get("greedy_tokens")
print(json.dumps({"check": "deepseek_gpu", "fixture": m, "extract_rel_l2_worst": worst,
                  "eval": {d: {k: e[d].get(k) for k in ("acceptance_length", "lossless", "lossless_failures",
                                                         "tokens_generated")} for d in e},
                  "eval_same_example_output": same}))
PY
done
