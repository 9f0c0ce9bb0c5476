#!/usr/bin/env bash
# The draft training benchmark (issue: the CUDA backend, item 5), on one GPU machine:
#   1. BUILD_DIR/bench_train (tools/bench/bench_train.cc): one aerie train_step on a Llama-3.1-8B-shaped
#      target with random weights (H 4096, 32 / 8 heads, MLP 14336, vocabulary 128256, draft vocabulary
#      32000, TTT 7 steps), at 2048 and at 8192 tokens per sample: step time, tokens/s, peak GPU memory,
#      MFU, plus a breakdown line (TTT forward, forward+backward, attention call times);
#   2. the PyTorch draft (tools/bench/hf_reference.py train) at the same lengths, when torch imports (it
#      runs out of memory at 8192 tokens: that line then says "oom");
#   3. SpecForge's own training step (tools/bench/specforge_step.py: its draft, TTT wrapper, flex_attention,
#      loss and BF16Optimizer) at the same lengths, when specforge imports (its wheel carried as
#      described in docs/performance.md).
# Prints the JSON lines of both (MFU = model FLOPs / time / peak, the FLOPs as hf_reference.py counts them).
#
# Usage: tools/bench/bench_train.sh [BUILD_DIR] (default build; needs BUILD_DIR/bench_train, a CUDA build).
# Environment: SEQS ("2048 8192"), TTT (7), ITERS (5), PRECISION (bf16; f32 for the fp32 path),
#   PEAK_TFLOPS (989, the dense bf16 peak of an H100/H200 SXM), SKIP_HF (1 to skip the PyTorch runs),
#   SKIP_SPECFORGE (1 to skip SpecForge's).
set -uo pipefail

BUILD=${1:-build}
SEQS=${SEQS:-"2048 8192"}
TTT=${TTT:-7}
ITERS=${ITERS:-5}
PRECISION=${PRECISION:-bf16}
PEAK_TFLOPS=${PEAK_TFLOPS:-989}
BENCH=$BUILD/bench_train

[ -x "$BENCH" ] || { echo "bench_train: no $BENCH (a CUDA build of target bench_train)" >&2; exit 2; }
status=0
for seq in $SEQS; do
  echo "bench_train: $BENCH --seq $seq --ttt-steps $TTT --iters $ITERS --precision $PRECISION" >&2
  "$BENCH" --seq "$seq" --ttt-steps "$TTT" --iters "$ITERS" --precision "$PRECISION" --peak-tflops "$PEAK_TFLOPS" \
    || status=1
done
if [ "${SKIP_HF:-0}" != 1 ]; then
  if python3 -c "import torch" 2>/dev/null; then
    for seq in $SEQS; do
      python3 "$(dirname "$0")/hf_reference.py" train --seq "$seq" --ttt-steps "$TTT" --iters "$ITERS" \
        --peak-tflops "$PEAK_TFLOPS" || status=1
    done
  else
    echo "bench_train: torch not importable, PyTorch baseline skipped" >&2
  fi
fi
if [ "${SKIP_SPECFORGE:-0}" != 1 ]; then
  if python3 -c "import torch, specforge" 2>/dev/null; then
    python3 "$(dirname "$0")/specforge_step.py" --seq "${SEQS// /,}" --ttt-steps "$TTT" --iters "$ITERS" \
      --peak-tflops "$PEAK_TFLOPS" || status=1
  else
    echo "bench_train: specforge not importable, SpecForge's step skipped" >&2
  fi
fi
exit $status
