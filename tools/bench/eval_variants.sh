#!/usr/bin/env bash
# Acceptance length of one draft under the ways the serving engines decode (issue 13, item 3): greedy
# chains and draft trees at the same budgets of draft tokens per verification pass, and speculative
# sampling at temperatures 0.7 and 1. Runs `aerie eval` on the demo's outputs (tools/demo RUN_DIR first)
# or on any target / export / prompts given by the environment, and prints one JSON line per variant
# (acceptance_length, verify_passes, per-position acceptance, wall seconds of speculative and of plain
# greedy decoding, tokens/s of each, the speed-up, per_category for prompts with a category) and a table.
# Environment: AERIE (BUILD_DIR/aerie), MODEL, DRAFT, PROMPTS (defaults: RUN_DIR's target, export and
#   eval_prompts.txt), NUM_PROMPTS (32), MAX_NEW (96), NP (1: ranks), EXTRA (more eval options, e.g.
#   "--chat-template smollm2 --device cuda"), VARIANTS (an extended regex: only the variants whose name
#   matches, e.g. '^(chain|tree) 5( |$)' for the greedy chain and trees of 5; names hold parentheses,
#   which a regex must escape), KEEP (a folder: each variant's eval.json is kept there).
# Usage: tools/bench/eval_variants.sh [RUN_DIR]   (default runs/demo)
set -euo pipefail
case "${1:-}" in -h | --help)
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 0 ;;
esac
root="$(cd "$(dirname "$0")/../.." && pwd)"
run=${1:-$root/runs/demo}
AERIE=${AERIE:-$root/build/aerie}
MODEL=${MODEL:-$run/target}
DRAFT=${DRAFT:-$run/export}
PROMPTS=${PROMPTS:-$run/eval_prompts.txt}
NUM_PROMPTS=${NUM_PROMPTS:-32}
MAX_NEW=${MAX_NEW:-96}
NP=${NP:-1}
for f in "$AERIE" "$MODEL/config.json" "$DRAFT/config.json" "$PROMPTS"; do
  [ -e "$f" ] || { echo "eval_variants: no $f (run tools/demo $run first, or set MODEL/DRAFT/PROMPTS)" >&2; exit 2; }
done
work=$(mktemp -d /tmp/aerie-eval-variants.XXXXXX)
trap 'rm -rf "$work"' EXIT
# name | options
variants=(
  "chain 5|--num-draft-tokens 5"
  "tree 5 (topk 2, depth 4)|--num-draft-tokens 5 --tree-topk 2 --tree-depth 4"
  "tree 5 (topk 3, depth 3)|--num-draft-tokens 5 --tree-topk 3 --tree-depth 3"
  "chain 8|--num-draft-tokens 8"
  "tree 8 (topk 3, depth 5)|--num-draft-tokens 8 --tree-topk 3 --tree-depth 5"
  "tree 8 (topk 4, depth 4)|--num-draft-tokens 8 --tree-topk 4 --tree-depth 4"
  "chain 16|--num-draft-tokens 16"
  "tree 16 (topk 4, depth 6)|--num-draft-tokens 16 --tree-topk 4 --tree-depth 6"
  "tree 16 (topk 8, depth 5)|--num-draft-tokens 16 --tree-topk 8 --tree-depth 5"
  "sampled chain 5, T 0.7|--num-draft-tokens 5 --temperature 0.7"
  "sampled chain 5, T 1.0|--num-draft-tokens 5 --temperature 1.0"
)
if [ -n "${VARIANTS:-}" ]; then  # keep the matching variants; a bad regex or no match is an error
  chosen=()
  for v in "${variants[@]}"; do
    name=${v%%|*}; rc=0
    [[ "$name" =~ $VARIANTS ]] || rc=$?
    [ "$rc" -le 1 ] || { echo "eval_variants: VARIANTS='$VARIANTS' is not an extended regex" >&2; exit 2; }
    [ "$rc" = 1 ] || chosen+=("$v")
  done
  if [ "${#chosen[@]}" = 0 ]; then
    echo "eval_variants: VARIANTS='$VARIANTS' matches none of:" >&2
    for v in "${variants[@]}"; do echo "  ${v%%|*}" >&2; done
    exit 2
  fi
  variants=("${chosen[@]}")
fi
printf '%-32s %18s %8s %10s %10s %8s\n' variant "acceptance length" passes "spec tok/s" "greedy t/s" speedup >&2
for v in "${variants[@]}"; do
  name=${v%%|*}; opts=${v#*|}
  # shellcheck disable=SC2086
  mpirun -np "$NP" "$AERIE" eval --model "$MODEL" --draft "$DRAFT" --prompts "$PROMPTS" --num-prompts "$NUM_PROMPTS" \
    --max-new-tokens "$MAX_NEW" --ttt-steps 1 $opts ${EXTRA:-} --output "$work/eval.json" >"$work/log" 2>&1 ||
    { cat "$work/log" >&2; exit 1; }
  python3 - "$work/eval.json" "$name" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
line = {"bench": "eval_variants", "variant": sys.argv[2], "acceptance_length": j["acceptance_length"],
        "verify_passes": j["verify_passes"], "tokens_generated": j["tokens_generated"],
        "acceptance_rate_per_position": [round(x, 4) for x in j["acceptance_rate_per_position"]],
        "lossless": j.get("lossless"), "tree": j.get("tree"), "sampling": j.get("sampling"),
        "device": j.get("device"), "dtype": j.get("dtype"), "spec_seconds": j.get("spec_seconds"),
        "greedy_seconds": j.get("greedy_seconds"), "speedup": j.get("speedup")}
spec_tps = j["tokens_generated"] / j["spec_seconds"] if j.get("spec_seconds") else None
greedy_tps = j["greedy_tokens"] / j["greedy_seconds"] if j.get("greedy_seconds") and j.get("greedy_tokens") else None
line["spec_tokens_per_s"], line["greedy_tokens_per_s"] = spec_tps, greedy_tps
if j.get("per_category"):
    line["per_category"] = {k: {f: v.get(f) for f in ("num_prompts", "acceptance_length", "speedup")}
                            for k, v in j["per_category"].items()}
print(json.dumps(line))
fmt = lambda x, p: "-" if x is None else f"{x:.{p}f}"
print(f'{sys.argv[2]:<32} {j["acceptance_length"]:18.3f} {j["verify_passes"]:8d} {fmt(spec_tps, 0):>10} '
      f'{fmt(greedy_tps, 0):>10} {fmt(j.get("speedup"), 3):>8}', file=sys.stderr)
PY
  [ -z "${KEEP:-}" ] || { mkdir -p "$KEEP"; cp "$work/eval.json" "$KEEP/$(echo "$name" | tr -c 'A-Za-z0-9\n' '_').json"; }
done
