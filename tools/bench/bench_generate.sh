#!/usr/bin/env bash
# `aerie generate` (regenerating answers with the target, continuous batching) throughput: N prompt-only
# records answered with sampling by each aerie binary given, REPEAT times each in turn (the binaries
# alternate, so a drift of the machine's clocks hits both), one JSON line per run with the new tokens per
# second that generate logs. For comparing builds (e.g. the batched decoding attention against the
# per-sequence one) on one machine; the model is any target aerie loads (stories260K by default: its
# decoding steps are all launch overhead on a GPU, the case the batching addresses).
# usage: tools/bench/bench_generate.sh OUT_DIR AERIE_BIN [AERIE_BIN...]
#   AERIE_BIN may carry settings in front, NAME=VALUE@PATH (e.g. AERIE_BATCHED_DECODE=1@build/aerie): that
#   run gets NAME=VALUE in its environment, so one binary can be compared with itself.
# Environment: MODEL (default $AERIE_TEST_MODEL or build/models/stories260K), DEVICE (cuda), N (256
#   records), BATCH (64 sequences decoded at once), MAX_NEW (128 tokens), REPEAT (2), TEMPERATURE (0.8).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
W="${1:?usage: bench_generate.sh OUT_DIR AERIE_BIN [AERIE_BIN...]}"; shift
[ $# -ge 1 ] || { echo "bench_generate: name at least one aerie binary" >&2; exit 2; }
mkdir -p "$W" && W="$(cd "$W" && pwd)" || { echo "bench_generate: cannot use $W as the output folder" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
M="${MODEL:-${AERIE_TEST_MODEL:-$root/build/models/stories260K}}"
[ -f "$M/config.json" ] || { echo "bench_generate: no model at $M (set MODEL)" >&2; exit 2; }
starts=("Once upon a time, there was a little girl." "Tom had a red ball." "The sun was hot." "Lily saw a big dog."
        "Ben and Sue went to the park." "The cat sat on the mat." "One day, a bird flew by.")
for i in $(seq 0 $(( ${N:-256} - 1 ))); do
  echo "{\"id\": $i, \"conversations\": [{\"from\": \"human\", \"value\": \"${starts[$((i % 7))]} ($i)\"}]}"
done >"$W/in.jsonl"
for r in $(seq 1 "${REPEAT:-2}"); do
  b=0
  for arg in "$@"; do
    bin="$arg" envs=()
    if [[ "$arg" =~ ^([A-Za-z_][A-Za-z0-9_]*=[^@]*(,[A-Za-z_][A-Za-z0-9_]*=[^@]*)*)@(.+)$ ]]; then
      IFS=, read -r -a envs <<<"${BASH_REMATCH[1]}"
      bin="${BASH_REMATCH[3]}"
    fi
    [ -x "$bin" ] || { echo "bench_generate: $bin is no executable" >&2; exit 2; }
    out="$W/out_b${b}_r$r.jsonl" log="$W/gen_b${b}_r$r.log"
    rm -rf "$out" "$out".*
    env "${envs[@]}" mpirun -np 1 "$bin" generate --model "$M" --input "$W/in.jsonl" --output "$out" --device "${DEVICE:-cuda}" \
      --batch-size "${BATCH:-64}" --max-new-tokens "${MAX_NEW:-128}" --temperature "${TEMPERATURE:-0.8}" --top-p 0.9 \
      --seed 1 >"$log" 2>&1 || { { echo "bench_generate: $arg failed, log $log:"; grep -E " error |rror:" "$log" |
      head -5; } >&2; exit 1; }
    python3 - "$log" "$arg" "$r" <<'PY'
import json, re, sys
text = open(sys.argv[1]).read()
m = re.search(r"(\d+) new tokens \((\d+) prompt tokens\) in ([0-9.]+) s \(([0-9.]+) new tokens/s\)", text)
if not m:
    sys.exit(f"bench_generate: no throughput line of aerie generate in {sys.argv[1]}")
print(json.dumps({"bin": sys.argv[2], "repeat": int(sys.argv[3]), "new_tokens": int(m.group(1)),
                  "seconds": float(m.group(3)), "new_tokens_per_s": float(m.group(4))}))
PY
    b=$((b + 1))
  done
done | tee "$W/results.jsonl"
