#!/usr/bin/env bash
# The extraction benchmark (issue: the CUDA backend, item 5), on one GPU machine:
#   1. aerie extract over S prepared samples of T random tokens with a Llama-3.1-8B-shaped target
#      (H 4096, 32 layers, 32 / 8 heads, MLP 14336, vocabulary 128256, llama3 rope; random bf16 weights
#      made on the GPU: --random-weights), timed by the job itself: tokens/s of the whole run INCLUDING
#      the device-to-host copies and the HDF5 shard writes, and the GPU's peak memory;
#   2. the transformers + PyTorch forward alone (tools/bench/hf_reference.py extract), when torch is
#      importable.
# Prints both as JSON lines (MFU = model FLOPs / time / peak; model FLOPs as hf_reference.py counts them:
# 2 x non-embedding parameters per token plus causal attention; extraction computes no lm_head).
#
# Usage: tools/bench/bench_extract.sh [BUILD_DIR] (default build; needs BUILD_DIR/aerie and the
# stories260K tokenizer the build makes in BUILD_DIR/models/stories260K, whose 512-token vocabulary is
# only used to validate the random ids: speed does not depend on the ids).
# Environment: SAMPLES (128), SEQ (2048), LAYERS (32), SAMPLES_PER_SHARD (16), HF_BATCH (16),
#   PEAK_TFLOPS (989, the dense bf16 peak of an H100/H200 SXM), WORK (a scratch folder), SKIP_HF (1 to
#   skip the transformers run), NP (ranks, 1), TP (1), EXTRACT_ARGS (more `aerie extract` options, e.g.
#   "--batch-tokens 0" for one sample per forward), FP8 (1: a second extraction with --fp8-gemm, W8A8
#   block-FP8 GEMMs, and a line "extract_compare" with the relative L2 of its hidden states against the
#   first's).
set -euo pipefail

case "${1:-}" in -h | --help)
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 0 ;;
esac
BUILD=${1:-build}
SAMPLES=${SAMPLES:-128}
SEQ=${SEQ:-2048}
LAYERS=${LAYERS:-32}
SAMPLES_PER_SHARD=${SAMPLES_PER_SHARD:-16}
HF_BATCH=${HF_BATCH:-16}
PEAK_TFLOPS=${PEAK_TFLOPS:-989}
NP=${NP:-1}
TP=${TP:-1}
TOKENIZER=${TOKENIZER:-$BUILD/models/stories260K}
AERIE=$BUILD/aerie
BENCH_TAG=bench_extract
# shellcheck source=tools/bench/common.sh
source "$(dirname "$0")/common.sh"
bench_mpi_env

[ -x "$AERIE" ] || { echo "bench_extract: no $AERIE (build aerie first)" >&2; exit 2; }
[ -f "$TOKENIZER/tokenizer.json" ] || {
  echo "bench_extract: no $TOKENIZER/tokenizer.json (make -C $BUILD stories260K_model, or set TOKENIZER)" >&2
  exit 2
}
WORK=${WORK:-$(mktemp -d /tmp/aerie-bench-extract.XXXXXX)}
mkdir -p "$WORK/model"

# The target's config (Llama-3.1-8B: meta-llama/Llama-3.1-8B config.json's shape fields).
bench_write_llama_config "$WORK/model" 4096 "$LAYERS" 32 8 14336 128256 128
# SAMPLES pre-tokenized samples of SEQ random ids, all tokens in the loss.
bench_random_samples "$WORK/samples.jsonl" "$SAMPLES" "$SEQ"
bench_prepare "$AERIE" "$TOKENIZER" "$WORK/samples.jsonl" "$WORK/prepared.h5" "$SEQ" "$WORK/prepare.log"

# extract_once NAME ARGS...: one extraction into $WORK/shards_NAME, one JSON line.
extract_once() {
  local name=$1
  shift
  rm -rf "$WORK/shards_$name"
  # shellcheck disable=SC2086  # EXTRACT_ARGS: several words
  BENCH_NO_MPIRUN_FOR_ONE=1 bench_mpi_cmd "$NP" "$AERIE" extract --model "$WORK/model" --random-weights 0 --device cuda \
    --dtype bf16 --prepared "$WORK/prepared.h5" --output "$WORK/shards_$name" --samples-per-shard "$SAMPLES_PER_SHARD" \
    --tp "$TP" ${EXTRACT_ARGS:-} "$@"
  BENCH_VERBOSE=1 bench_run "$WORK/extract_$name.log"
  # The job's own numbers -> one JSON line.
  local stats
  stats=$(bench_extract_stats "$WORK/extract_$name.log")
  python3 - "$stats" "$SEQ" "$LAYERS" "$PEAK_TFLOPS" "$NP" "$TP" "${EXTRACT_ARGS:-} $*" <<'EOF'
import json, sys
st, seq, layers, peak, np_, tp = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
samples, tokens, secs = st["samples"], st["tokens"], st["seconds"]
H, HEADS, KV, MLP, D = 4096, 32, 8, 14336, 128
params = layers * (H * HEADS * D + 2 * H * KV * D + HEADS * D * H + 3 * H * MLP + 2 * H) + H  # no embedding/lm_head
flops = 2 * params * tokens + layers * 2 * 2 * samples * seq * seq / 2 * HEADS * D  # causal QK^T + PV
print(json.dumps({"bench": "extract", "impl": "aerie (incl. D2H copy + HDF5 write)", "gpus": np_,
                  "extract_args": sys.argv[7].strip(),
                  "tp": tp, "samples": samples, "seq": seq, "layers": layers,
                  "tokens_per_s": tokens / secs, "seconds": secs,
                  "peak_gib": st["peak_gib"], "mfu": flops / secs / (peak * 1e12) / np_,
                  "writer_gb_per_s": st["writer_gb_per_s"], "writer_wait_s": st["writer_wait_s"]}))
EOF
}

extract_once bf16
if [ "${FP8:-0}" = 1 ]; then
  # The W8A8 block-FP8 GEMMs (--fp8-gemm) on the same prepared file and weights, then how far its hidden
  # states are from the BF16 run's (bench_util.py compare-shards: relative L2 per dataset).
  extract_once fp8 --fp8-gemm
  python3 "$(dirname "$0")/bench_util.py" compare-shards "$WORK/shards_bf16" "$WORK/shards_fp8" 1.0 |
    python3 -c "import json,sys; r=json.load(sys.stdin); r['bench']='extract_compare'; r['a']='bf16'; r['b']='--fp8-gemm'; print(json.dumps(r))"
fi

if [ "${SKIP_HF:-0}" != 1 ]; then
  if python3 -c "import torch, transformers" 2>/dev/null; then
    python3 "$(dirname "$0")/hf_reference.py" extract --batch "$HF_BATCH" --seq "$SEQ" --layers "$LAYERS" \
      --peak-tflops "$PEAK_TFLOPS"
  else
    echo "bench_extract: torch/transformers not importable, transformers baseline skipped" >&2
  fi
fi
echo "bench_extract: files in $WORK" >&2
