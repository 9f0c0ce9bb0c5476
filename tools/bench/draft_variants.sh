#!/usr/bin/env bash
# The EAGLE-3.1 draft options against the plain EAGLE-3 draft (issue 15, item 5) on the demo (stories260K,
# CPU, 2 ranks), all on the same data:
#   1. tools/demo OUT/demo: prepared data, target, draft vocabulary, shards (and the demo's own draft);
#   2. per variant (VARIANTS, default: plain, norm_before_residual, norm_output, both, norm_before_fc, all:
#      the three options at once; also fc_norm and norm_before_residual_fc_norm: the per-chunk norms alone
#      and with norm_before_residual; default_beta2, default_lm_head_random, default_loss_all: the
#      norm_before_residual layer with one of SpecForge's recipe choices, default_specforge_recipe with all
#      three; default: today's defaults, the same as default_beta2; every other variant keeps AdamW's beta2
#      at 0.95, the default when its table was made) and seed (SEEDS,
#      default "0 1 2"): train --seed S with the variant's options (the demo's settings otherwise), export,
#      eval (the demo's settings: held-out prompts, real speculative decoding, greedy) -> one JSON line
#      {variant, seed, acceptance_length, tau_sim, lossless}; then one line per variant with the means.
#   With today's recipe (beta2 0.999): plain_beta2 (the plain layer), norm_output_beta2,
#   norm_before_fc_beta2 and fc_norm_beta2 (each option alone on the plain layer), window128 and
#   default_window128 (--draft-sliding-window 128, a little above the mean training sample of 93 tokens, on
#   the plain and the default layer), window256 and default_window256 (256: the power of two above the 90th
#   percentile of the training samples, 137 tokens), default_window_auto (--draft-sliding-window auto, which
#   picks that 256 from the shards), default_wd (--weight-decay 0.1: the demo's lr 3e-3 over 1000 cosine steps
#   shrinks an untrained weight by exp(-0.1 x 1.5) = 0.86).
# LONG_PROMPTS=1: each draft is also evaluated on 32 prompts of 5 consecutive held-out TinyStories
#   paragraphs (the 160 before the demo's 64 evaluation paragraphs, which prepare's 3000 samples never reach),
#   cut to 400 tokens (--max-prompt-tokens; the training samples: 93 tokens on average), same eval settings
#   otherwise -> RUN/eval_long.json and acceptance_length_long / lossless_long in the lines.
# usage: tools/bench/draft_variants.sh [OUT_DIR]    (default runs/draft-variants; AERIE_BIN as for tools/demo)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${1:-runs/draft-variants}"
mkdir -p "$out"; out="$(cd "$out" && pwd)"
variants="${VARIANTS:-plain norm_before_residual norm_output both norm_before_fc all}"
# shellcheck source=tools/bench/demo_lib.sh
source "$root/tools/bench/demo_lib.sh"  # aerie, seeds, d, cfg, run, demo_train_eval, demo_result
options() {
  # norm_before_residual is train's default since 2026-12-02: the variants without it turn it off. AdamW's
  # beta2 is 0.999 since 2026-12-03: the variants of the tables made before keep 0.95.
  local b95="--adam-beta2 0.95"
  case "$1" in
    plain) echo "--draft-norm-before-residual=false $b95" ;;
    norm_before_residual) echo "--draft-norm-before-residual $b95" ;;
    norm_output) echo "--draft-norm-before-residual=false --draft-norm-output $b95" ;;
    both) echo "--draft-norm-before-residual --draft-norm-output $b95" ;;
    norm_before_fc) echo "--draft-norm-before-residual=false --draft-norm-before-fc $b95" ;;
    all) echo "--draft-norm-before-residual --draft-norm-output --draft-norm-before-fc $b95" ;;
    fc_norm) echo "--draft-norm-before-residual=false --draft-fc-norm $b95" ;;
    norm_before_residual_fc_norm) echo "--draft-norm-before-residual --draft-fc-norm $b95" ;;
    # norm_before_residual with one of SpecForge's recipe choices (issue 15 item 4), or all three;
    # default_beta2 is today's default (the same as default)
    default_beta2) echo "--adam-beta2 0.999" ;;
    default) echo "" ;;
    default_lm_head_random) echo "--lm-head-init random $b95" ;;
    default_loss_all) echo "--loss-normalization all $b95" ;;
    default_specforge_recipe) echo "--adam-beta2 0.999 --lm-head-init random --loss-normalization all" ;;
    # the sliding window (issue 15 item 3) with today's recipe (beta2 0.999)
    plain_beta2) echo "--draft-norm-before-residual=false" ;;
    norm_output_beta2) echo "--draft-norm-before-residual=false --draft-norm-output" ;;
    norm_before_fc_beta2) echo "--draft-norm-before-residual=false --draft-norm-before-fc" ;;
    fc_norm_beta2) echo "--draft-norm-before-residual=false --draft-fc-norm" ;;
    window128) echo "--draft-norm-before-residual=false --draft-sliding-window 128" ;;
    default_window128) echo "--draft-sliding-window 128" ;;
    window256) echo "--draft-norm-before-residual=false --draft-sliding-window 256" ;;
    default_window256) echo "--draft-sliding-window 256" ;;
    default_window_auto) echo "--draft-sliding-window auto" ;;
    default_wd) echo "--weight-decay 0.1" ;;
    *) echo "draft_variants: unknown variant '$1'" >&2; exit 2 ;;
  esac
}
long="${LONG_PROMPTS:-0}"
if [ "$long" = 1 ] && [ ! -s "$d/eval_prompts_long.jsonl" ]; then
  data="${AERIE_DATA:-$root/../shared/data}"
  python3 - "$data/tinystories/tinystories_val.txt" "$d/eval_prompts_long.jsonl" <<'PY'
import json, sys
paras = [p.strip() for p in open(sys.argv[1], encoding="utf-8").read().split("\n\n") if p.strip()]
held = paras[-64 - 160:-64]  # tools/demo's eval prompts are the last 64
# JSONL, one user turn each: a plain-text prompts file gives eval each paragraph's first sentence only.
with open(sys.argv[2], "w", encoding="utf-8") as f:
    for i in range(0, 160, 5):
        f.write(json.dumps({"conversations": [{"from": "human", "value": " ".join(held[i:i + 5])}]}) + "\n")
PY
fi
lines="$out/results.jsonl"
: > "$lines"
for v in $variants; do
  opts=$(options "$v")
  for s in $seeds; do
    r="$out/$v-seed$s"
    # shellcheck disable=SC2086  # the options are words
    demo_train_eval "$r" "$d/shards" "$s" $opts
    if [ "$long" = 1 ]; then
      [ -f "$r/eval_long.json" ] || run eval --config "$cfg/eval.ini" --model "$d/target" --draft "$r/export" \
          --prompts "$d/eval_prompts_long.jsonl" --max-prompt-tokens 400 --output "$r/eval_long.json"
      python3 -c "import json,sys; a=json.loads(sys.argv[1]); e=json.load(open(sys.argv[2])); a['acceptance_length_long']=round(e['acceptance_length'], 4); a['lossless_long']=e['lossless']; print(json.dumps(a))" \
          "$(demo_result "$r/eval.json" variant "$v" "$s")" "$r/eval_long.json" | tee -a "$lines"
    else
      demo_result "$r/eval.json" variant "$v" "$s" | tee -a "$lines"
    fi
  done
done
python3 - "$lines" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for v in dict.fromkeys(r["variant"] for r in rows):
    rs = [r for r in rows if r["variant"] == v]
    al = [r["acceptance_length"] for r in rs]
    ts = [r["tau_sim"] for r in rs]
    m = {"variant": v, "seeds": len(rs), "acceptance_length_mean": round(sum(al) / len(al), 4),
         "acceptance_length_min": min(al), "acceptance_length_max": max(al),
         "tau_sim_mean": round(sum(ts) / len(ts), 4), "all_lossless": all(r["lossless"] for r in rs)}
    if all("acceptance_length_long" in r for r in rs):
        lg = [r["acceptance_length_long"] for r in rs]
        m["acceptance_length_long_mean"] = round(sum(lg) / len(lg), 4)
        m["all_lossless_long"] = all(r["lossless_long"] for r in rs)
    print(json.dumps(m))
PY
