#!/usr/bin/env bash
# Causal GQA attention, forward and backward, bf16, on one GPU in one call: aerie's kernels (BUILD_DIR/bench_attention)
# as the GPU is and as an RTX PRO 6000 plans (AERIE_CUDA_EMULATE=sm_120: the mma.sync kernels within 99 KiB of shared
# memory per block and as many blocks per SM as its 100 KiB hold), beside torch's FlashAttention-2 backend (F.scaled_dot_product_attention under
# sdpa_kernel(SDPBackend.FLASH_ATTENTION), is_causal) on the same shapes: 32 query / 8 kv heads, one sequence of T
# tokens, head dims 64 and 128, T 2048 and 8192. FLOPs count the causal half (forward 4 T^2 / 2 heads d, backward
# 2.5 times that) on both sides.
# Prints the JSON lines of both ("impl": "aerie" with its "path", "impl": "torch_flash"), then one line per shape and
# path with aerie's time over torch's ("ratio_fwd", "ratio_bwd": above 1, aerie is faster).
# Environment: HEAD_DIMS (64,128), TOKENS (2048,8192), HEADS (32), KV_HEADS (8), ITERS (20), PATHS ("native sm_120":
#   "native" or an AERIE_CUDA_EMULATE value, each optionally "+KERNEL" for AERIE_ATTENTION_FORWARD_KERNEL and
#   _BACKWARD_KERNEL, e.g. "sm_120+mma64"), SKIP_TORCH (0).
# Usage: tools/bench/bench_attention.sh [BUILD_DIR]
set -euo pipefail
case "${1:-}" in -h | --help)
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 0 ;;
esac
BUILD=${1:-build}
HEAD_DIMS=${HEAD_DIMS:-64,128}
TOKENS=${TOKENS:-2048,8192}
HEADS=${HEADS:-32}
KV_HEADS=${KV_HEADS:-8}
ITERS=${ITERS:-20}
BENCH=$BUILD/bench_attention
[ -x "$BENCH" ] || { echo "bench_attention: no $BENCH (a CUDA build makes it)" >&2; exit 2; }
lines=$(mktemp)
trap 'rm -f "$lines"' EXIT

for path in ${PATHS:-native sm_120}; do
  setting=${path%%+*} kernel=
  [ "$setting" = "$path" ] || kernel=${path#*+}
  envs=(AERIE_ATTENTION_FORWARD_KERNEL="$kernel" AERIE_ATTENTION_BACKWARD_KERNEL="$kernel")
  if [ "$setting" = native ]; then envs+=(AERIE_CUDA_EMULATE=); else envs+=(AERIE_CUDA_EMULATE="$setting"); fi
  env "${envs[@]}" "$BENCH" --head-dims "$HEAD_DIMS" --tokens "$TOKENS" --heads "$HEADS" --kv-heads "$KV_HEADS" \
    --iters "$ITERS"
done | tee -a "$lines"

if [ "${SKIP_TORCH:-0}" != 1 ]; then
  python3 -c "import torch" 2>/dev/null ||
    { echo "bench_attention: torch does not import here; SKIP_TORCH=1 runs aerie's side alone" >&2; exit 2; }
  PYTHONPATH="$(dirname "$0")${PYTHONPATH:+:$PYTHONPATH}" \
    python3 - "$HEAD_DIMS" "$TOKENS" "$HEADS" "$KV_HEADS" "$ITERS" <<'PY' | tee -a "$lines"
import json, sys
import torch
from hf_reference import timed  # tools/bench/hf_reference.py
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

dims = [int(x) for x in sys.argv[1].split(",")]
tokens = [int(x) for x in sys.argv[2].split(",")]
heads, kv_heads, iters = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
dev = torch.device("cuda")


for d in dims:
    for t in tokens:
        g = torch.Generator(device=dev).manual_seed(0)
        q = torch.rand(1, heads, t, d, device=dev, generator=g).mul_(2).sub_(1).to(torch.bfloat16)
        k = torch.rand(1, kv_heads, t, d, device=dev, generator=g).mul_(2).sub_(1).to(torch.bfloat16)
        v = torch.rand(1, kv_heads, t, d, device=dev, generator=g).mul_(2).sub_(1).to(torch.bfloat16)
        dout = torch.rand(1, heads, t, d, device=dev, generator=g).mul_(2).sub_(1).to(torch.bfloat16)
        # GQA inside the kernel where this torch's flash backend takes enable_gqa; else k / v expanded to every
        # query head beforehand (outside the timing), which gives the kernel the same FLOPs.
        gqa = "enable_gqa"
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            try:
                F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            except RuntimeError:
                gqa = "expanded"
        if gqa == "expanded":
            k = k.repeat_interleave(heads // kv_heads, dim=1).contiguous()
            v = v.repeat_interleave(heads // kv_heads, dim=1).contiguous()
        extra = {"enable_gqa": True} if gqa == "enable_gqa" else {}
        q.requires_grad_(True)
        k.requires_grad_(True)
        v.requires_grad_(True)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            fwd = 1e3 * timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, **extra).detach(),
                              3, iters)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, **extra)
            bwd = 1e3 * timed(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), 3, iters)
        flop = 4.0 * t * t / 2.0 * heads * d
        print(json.dumps({"bench": "attention", "impl": "torch_flash", "torch": torch.__version__, "gqa": gqa,
                          "gpu": torch.cuda.get_device_name(), "d": d, "tokens": t, "heads": heads,
                          "kv_heads": kv_heads, "fwd_ms": round(fwd, 4), "bwd_ms": round(bwd, 4),
                          "fwd_tflops": round(flop / fwd * 1e-9, 1), "bwd_tflops": round(2.5 * flop / bwd * 1e-9, 1)}),
              flush=True)
PY

  python3 - "$lines" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
torch_rows = {(r["d"], r["tokens"]): r for r in rows if r["impl"] == "torch_flash"}
for r in rows:
    ref = torch_rows.get((r["d"], r["tokens"]))
    if r["impl"] != "aerie" or ref is None:
        continue
    print(json.dumps({"bench": "attention_ratio", "path": r["path"], "d": r["d"], "tokens": r["tokens"],
                      "ratio_fwd": round(ref["fwd_ms"] / r["fwd_ms"], 3),
                      "ratio_bwd": round(ref["bwd_ms"] / r["bwd_ms"], 3)}))
PY
fi
