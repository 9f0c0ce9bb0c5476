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
# Environment: SAMPLES (64), SEQ (2048), LAYERS (32), SAMPLES_PER_SHARD (16), HF_BATCH (16),
#   PEAK_TFLOPS (989, the dense bf16 peak of an H100/H200 SXM), WORK (a scratch folder), SKIP_HF (1 to
#   skip the transformers run), NP (ranks, 1), TP (1).
set -euo pipefail

BUILD=${1:-build}
SAMPLES=${SAMPLES:-64}
SEQ=${SEQ:-2048}
LAYERS=${LAYERS:-32}
SAMPLES_PER_SHARD=${SAMPLES_PER_SHARD:-16}
HF_BATCH=${HF_BATCH:-16}
PEAK_TFLOPS=${PEAK_TFLOPS:-989}
NP=${NP:-1}
TP=${TP:-1}
WORK=${WORK:-$(mktemp -d /tmp/aerie-bench-extract.XXXXXX)}
TOKENIZER=${TOKENIZER:-$BUILD/models/stories260K}
AERIE=$BUILD/aerie
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1

[ -x "$AERIE" ] || { echo "bench_extract: no $AERIE (build aerie first)" >&2; exit 2; }
[ -f "$TOKENIZER/tokenizer.json" ] || { echo "bench_extract: no $TOKENIZER/tokenizer.json" >&2; exit 2; }
mkdir -p "$WORK/model"

# The target's config (Llama-3.1-8B: meta-llama/Llama-3.1-8B config.json's shape fields).
cat > "$WORK/model/config.json" <<EOF
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
 "intermediate_size": 14336, "num_hidden_layers": $LAYERS, "num_attention_heads": 32,
 "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256, "max_position_embeddings": 131072,
 "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
 "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192},
 "tie_word_embeddings": false, "bos_token_id": 128000, "eos_token_id": 128001, "torch_dtype": "bfloat16"}
EOF

# SAMPLES pre-tokenized samples of SEQ random ids, all tokens in the loss.
python3 - "$WORK/samples.jsonl" "$SAMPLES" "$SEQ" <<'EOF'
import json, random, sys
path, n, t = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(0)
with open(path, "w") as f:
    for _ in range(n):
        f.write(json.dumps({"input_ids": [rng.randrange(3, 512) for _ in range(t)], "loss_mask": [1] * t}) + "\n")
EOF
"$AERIE" prepare --input "$WORK/samples.jsonl" --format tokenized --tokenizer "$TOKENIZER" \
  --output "$WORK/prepared.h5" --max-length "$SEQ" > "$WORK/prepare.log" 2>&1

rm -rf "$WORK/shards"
CMD=("$AERIE" extract --model "$WORK/model" --random-weights 0 --device cuda --dtype bf16
     --prepared "$WORK/prepared.h5" --output "$WORK/shards" --samples-per-shard "$SAMPLES_PER_SHARD" --tp "$TP")
if [ "$NP" -gt 1 ]; then CMD=(mpirun --oversubscribe -np "$NP" "${CMD[@]}"); fi
echo "bench_extract: ${CMD[*]}" >&2
"${CMD[@]}" 2>&1 | tee "$WORK/extract.log" >&2

# The job's own numbers -> one JSON line.
python3 - "$WORK/extract.log" "$SEQ" "$LAYERS" "$PEAK_TFLOPS" "$NP" "$TP" <<'EOF'
import json, re, sys
log, seq, layers, peak, np_, tp = open(sys.argv[1]).read(), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
m = re.search(r"extract: wrote \d+ shard\(s\), (\d+) samples, (\d+) tokens in ([0-9.e+-]+) s", log)
if not m:
    sys.exit("bench_extract: no 'extract: wrote' line in the log")
samples, tokens, secs = int(m.group(1)), int(m.group(2)), float(m.group(3))
peaks = [float(x) for x in re.findall(r"peak memory ([0-9.e+-]+) GiB", log)]
H, HEADS, KV, MLP, D = 4096, 32, 8, 14336, 128
params = layers * (H * HEADS * D + 2 * H * KV * D + HEADS * D * H + 3 * H * MLP + 2 * H) + H  # no embedding/lm_head
flops = 2 * params * tokens + layers * 2 * 2 * samples * seq * seq / 2 * HEADS * D  # causal QK^T + PV
print(json.dumps({"bench": "extract", "impl": "aerie (incl. D2H copy + HDF5 write)", "gpus": np_,
                  "tp": tp, "samples": samples, "seq": seq, "layers": layers,
                  "tokens_per_s": tokens / secs, "seconds": secs,
                  "peak_gib": max(peaks) if peaks else None, "mfu": flops / secs / (peak * 1e12) / np_}))
EOF

if [ "${SKIP_HF:-0}" != 1 ]; then
  if python3 -c "import torch, transformers" 2>/dev/null; then
    python3 "$(dirname "$0")/hf_reference.py" extract --batch "$HF_BATCH" --seq "$SEQ" --layers "$LAYERS" \
      --peak-tflops "$PEAK_TFLOPS"
  else
    echo "bench_extract: torch/transformers not importable, transformers baseline skipped" >&2
  fi
fi
echo "bench_extract: files in $WORK" >&2
