# shellcheck shell=bash
# Shared pieces of the benchmark scripts (tools/bench/bench_extract.sh, tools/bench/bench_scaling.sh).
# Source it: `source "$(dirname "$0")/common.sh"`. Needs bash, python3 (json, random, re: standard library).
# Functions (all print errors to stderr and return non-zero on failure; the callers run with set -e):
#   bench_mpi_env                    the Open MPI settings of root runs and one BLAS thread per rank
#   bench_write_llama_config DIR H LAYERS HEADS KV_HEADS MLP VOCAB HEAD_DIM
#                                    DIR/config.json of a Llama-3-style target of that shape (llama3 rope)
#   bench_random_samples PATH N T [MAX_ID]
#                                    N pre-tokenized samples of T random ids in [3, MAX_ID) (512), all in the loss
#   bench_prepare AERIE TOKENIZER JSONL OUT SEQ LOG
#                                    aerie prepare of those samples (--format tokenized) into OUT
#   bench_mpi_cmd NP CMD...          sets the array BENCH_CMD to `mpirun --oversubscribe -np NP CMD...`
#                                    (CMD alone when NP is 1 and BENCH_NO_MPIRUN_FOR_ONE=1)
#   bench_run LOG                    prints "$BENCH_TAG: <BENCH_CMD>" to stderr and runs BENCH_CMD, its output
#                                    into LOG (and to stderr when BENCH_VERBOSE=1); returns its exit status
#   bench_extract_stats LOG          one JSON object of the extract log: samples, tokens, seconds, tokens_per_s,
#                                    peak_gib (the largest per-rank pool high-water mark, null on the CPU),
#                                    writer_gb_per_s and writer_wait_s (group 0's shard writer)
# BENCH_TAG (default "bench") prefixes the messages.

BENCH_TAG=${BENCH_TAG:-bench}

bench_mpi_env() {
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
}

# Llama-3 shape fields as meta-llama's config.json files name them; rope: Llama-3.1/3.3's llama3 scaling.
bench_write_llama_config() {
  local dir=$1 h=$2 layers=$3 heads=$4 kv=$5 mlp=$6 vocab=$7 head_dim=$8
  mkdir -p "$dir"
  cat > "$dir/config.json" <<EOF
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": $h,
 "intermediate_size": $mlp, "num_hidden_layers": $layers, "num_attention_heads": $heads,
 "num_key_value_heads": $kv, "head_dim": $head_dim, "vocab_size": $vocab, "max_position_embeddings": 131072,
 "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
 "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192},
 "tie_word_embeddings": false, "bos_token_id": 128000, "eos_token_id": 128001, "torch_dtype": "bfloat16"}
EOF
}

# Random ids below MAX_ID (default 512: the stories260K tokenizer that validates them in aerie prepare; the
# speed of the target does not depend on the ids). Seeded: the same N, T give the same file.
bench_random_samples() {
  python3 - "$1" "$2" "$3" "${4:-512}" <<'EOF'
import json, random, sys
path, n, t, max_id = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(0)
with open(path, "w") as f:
    for _ in range(n):
        f.write(json.dumps({"input_ids": [rng.randrange(3, max_id) for _ in range(t)], "loss_mask": [1] * t}) + "\n")
EOF
}

bench_prepare() {
  local aerie=$1 tokenizer=$2 jsonl=$3 out=$4 seq=$5 log=$6
  "$aerie" prepare --input "$jsonl" --format tokenized --tokenizer "$tokenizer" --output "$out" \
    --max-length "$seq" > "$log" 2>&1 || { echo "$BENCH_TAG: aerie prepare failed, see $log" >&2; tail -5 "$log" >&2; return 1; }
}

bench_mpi_cmd() {
  local np=$1; shift
  if [ "$np" = 1 ] && [ "${BENCH_NO_MPIRUN_FOR_ONE:-0}" = 1 ]; then
    BENCH_CMD=("$@")
  else
    BENCH_CMD=(mpirun --oversubscribe -np "$np" "$@")
  fi
}

bench_run() {
  local log=$1 rc=0
  echo "$BENCH_TAG: ${BENCH_CMD[*]}" >&2
  if [ "${BENCH_VERBOSE:-0}" = 1 ]; then
    "${BENCH_CMD[@]}" 2>&1 | tee "$log" >&2 || rc=${PIPESTATUS[0]}
  else
    "${BENCH_CMD[@]}" > "$log" 2>&1 || rc=$?
  fi
  return "$rc"
}

bench_extract_stats() {
  python3 - "$1" <<'EOF'
import json, re, sys
log = open(sys.argv[1]).read()
m = re.search(r"extract: wrote \d+ shard\(s\), (\d+) samples, (\d+) tokens in ([0-9.e+-]+) s", log)
if not m:
    sys.exit("bench: no 'extract: wrote' line in " + sys.argv[1])
samples, tokens, secs = int(m.group(1)), int(m.group(2)), float(m.group(3))
peaks = [float(x) for x in re.findall(r"peak memory ([0-9.e+-]+) GiB", log)]
# Group 0's shard writer: its write rate and how long the forwards waited for it (absent in older logs).
w = re.search(r"shard writer took ([0-9.]+) GB of hidden states in ([0-9.]+) s of writes \(([0-9.]+) GB/s\); "
              r"its forwards waited ([0-9.]+) s", log)
print(json.dumps({"samples": samples, "tokens": tokens, "seconds": secs, "tokens_per_s": tokens / secs,
                  "peak_gib": max(peaks) if peaks else None,
                  "writer_gb_per_s": float(w.group(3)) if w else None,
                  "writer_wait_s": float(w.group(4)) if w else None}))
EOF
}
