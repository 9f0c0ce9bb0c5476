# Sourced by the test scripts that drive the aerie binary (provenance.sh, extract_nonfinite.sh) after they
# set aerie, model and work: skips (exit 77) without the converted model, starts an empty work folder, and
# defines
#   run LOG NP ARGS...            aerie ARGS on NP ranks, output in WORK/LOG.log (kept in $last); its status;
#   refused LOG PATTERN NP ARGS... aerie must fail with PATTERN (grep -E) in its log;
#   fail MESSAGE                  prints MESSAGE and the last log's tail, exits 1.
[ -f "$model/config.json" ] || { echo "no converted model at $model: skipped"; exit 77; }
export OPENBLAS_NUM_THREADS=1
rm -rf "$work"
mkdir -p "$work"
fail() { echo "FAIL: $*"; [ -n "${last:-}" ] && tail -20 "$last"; exit 1; }
run() {
  last="$work/$1.log"; local np=$2; shift 2
  mpirun --oversubscribe -np "$np" "$aerie" "$@" >"$last" 2>&1
}
refused() {
  local log=$1 pattern=$2; shift 2
  if run "$log" "$@"; then fail "$log: accepted (expected a refusal matching: $pattern)"; fi
  grep -Eq -- "$pattern" "$last" || fail "$log: refused, but not with: $pattern"
}
