# Sourced by the test scripts that drive the aerie binary (provenance.sh, extract_nonfinite.sh) after they
# set aerie, model and work: skips (exit 77) without the converted model, starts an empty work folder, and
# defines
#   run LOG NP ARGS...            aerie ARGS on NP ranks, output in WORK/LOG.log (kept in $last); its status;
#   refused LOG PATTERN NP ARGS... aerie must fail with PATTERN (grep -E) in its log;
#   fail MESSAGE                  prints MESSAGE and the last log's tail, exits 1;
#   small_shards SAMPLES PER_SHARD  prepare (TEXT, up to SAMPLES samples of 64 tokens), vocab (K 64) and extract
#                                 (aux layers 1,2,4, 2 ranks) into WORK/prepared.h5, vocab.safetensors, s/.
[ -f "$model/config.json" ] || { echo "no converted model at $model: skipped"; exit 77; }
export OPENBLAS_NUM_THREADS=1
rm -rf "$work"
mkdir -p "$work"
fail() { echo "FAIL: $*"; [ -n "${last:-}" ] && tail -20 "$last"; exit 1; }
run() {
  last="$work/$1.log"; local np=$2; shift 2
  mpirun --oversubscribe -np "$np" "$aerie" "$@" >"$last" 2>&1
}
small_shards() {
  run prepare 1 prepare --input "$text" --tokenizer "$model" --output "$work/prepared.h5" --max-length 64 \
    --max-samples "$1" || fail prepare
  run vocab 1 vocab --prepared "$work/prepared.h5" --model "$model" --draft-vocab-size 64 \
    --output "$work/vocab.safetensors" || fail vocab
  run extract 2 extract --model "$model" --prepared "$work/prepared.h5" --samples-per-shard "$2" \
    --aux-layers 1,2,4 --output "$work/s" || fail extract
}
refused() {
  local log=$1 pattern=$2; shift 2
  if run "$log" "$@"; then fail "$log: accepted (expected a refusal matching: $pattern)"; fi
  grep -Eq -- "$pattern" "$last" || fail "$log: refused, but not with: $pattern"
}
