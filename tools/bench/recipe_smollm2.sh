#!/usr/bin/env bash
# The training recipe's differences from SpecForge's (issue 15 item 4), measured one at a time on
# SmolLM2-135M-Instruct on one GPU: per variant and seed, train 400 steps of configs/runs/smollm2 on the
# pipeline's shards, export, eval on the first 20 MT-Bench first turns (chain of 5, target f32).
#   base     the plain EAGLE-3 layer with aerie's recipe of the tables (AdamW 0.9/0.95, the default until
#            2026-12-03, lm_head = the target's rows, loss over the trained rows;
#            --draft-norm-before-residual=false, the default until 2026-12-02); every variant but beta2 and
#            default keeps --adam-beta2 0.95, as the tables in docs/design.md were made
#   beta2    --adam-beta2 0.999 (torch's default, SpecForge's; aerie's since 2026-12-03)
#   default  today's defaults (norm_before_residual, AdamW 0.9/0.999)
#   lmrand   --lm-head-init random (nn.Linear's init, SpecForge's)
#   lossall  --loss-normalization all (each TTT step's loss over all rows of the batch, SpecForge's mean)
# and the draft options (issue 15 items 3 and 5) on the same data, each against base:
#   nbr      --draft-norm-before-residual (today's default)   nout    --draft-norm-output
#   both     nbr + nout                                        nbfc    --draft-norm-before-fc
#   win512   --draft-sliding-window 512                        nbrwin  nbr + win512
#   dauto    default + --draft-sliding-window auto (the power of two at or above the training samples'
#            90th percentile length; compare with default on LONG_PROMPTS=1)
# and today's default with one more change each (issue 15 item 4, after the default's row):
#   dfcnorm  default + --draft-fc-norm                         dlmrand default + --lm-head-init random
#   dboth    default + both                                    dnbfc   default + --draft-norm-before-fc
#   dnout    default + --draft-norm-output                    dwd     default + --weight-decay 1 (lr 5e-4 over 400
#            cosine steps sums to 0.1: 0.1 would shrink a weight by 1%, 1 by 10%)
# and SpecForge's own trainer on the same shards (issue 15 item 4; torch and the specforge 0.2.0 wheel must
# import, see tools/bench/specforge_train.py):
#   specforge  tools/bench/specforge_train.py with train.ini's hyperparameters (400 steps of 16, lr 5e-4,
#              warmup 0.015, clipping 0.5, 7 TTT steps), flex_attention, the held-out split of an aerie run
#              of this OUT_DIR (so list an aerie variant before it, e.g. VARIANTS="default specforge"); then
#              the same eval as every other variant; run SpecForge's seeds one after another (concurrent
#              runs on one GPU recompile flex_attention for each new padded length, ten times slower)
# aerie's runs gain nothing from sharing the GPU either (four at once: 251-284 s each for 400 steps against 56 s
# alone, 2026-12-04): give SEEDS and VARIANTS to one invocation.
# LONG_PROMPTS=1 also evaluates each draft on 16 prompts longer than any training sample
# (tools/bench/long_prompts.py: Spec-Bench summarization articles joined five at a time, 3,839 tokens on
# average against training samples of 367 on average, 2,048 at most) into RUN.long.json.
# usage: tools/bench/recipe_smollm2.sh OUT_DIR PREPARED_H5
#   PREPARED_H5: the pipeline's prepared file (tools/smollm2_pipeline or tools/bench/stream_smollm2.sh write it)
# Environment: AERIE_BIN, SMOLLM2_MODEL (default tools/get_smollm2), SEEDS ("0 1"), VARIANTS
#   ("base beta2 lmrand lossall"), EVAL_PROMPTS (20), AERIE_DATA (../shared/data), LONG_PROMPTS (0). One
#   line per run and prompt set.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
W="${1:?usage: recipe_smollm2.sh OUT_DIR PREPARED_H5}"; P="${2:?usage: recipe_smollm2.sh OUT_DIR PREPARED_H5}"
mkdir -p "$W"; W="$(cd "$W" && pwd)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
A="${AERIE_BIN:-$root/build/aerie}"; C="$root/configs/runs/smollm2"; D="${AERIE_DATA:-$root/../shared/data}"
M="${SMOLLM2_MODEL:-$("$root/tools/get_smollm2" | tail -1)}"
[ -f "$W/vocab.safetensors" ] || mpirun -np 1 "$A" vocab --config "$C/vocab.ini" --prepared "$P" --model "$M" \
  --output "$W/vocab.safetensors" >"$W/vocab.log" 2>&1 || exit 1
[ -d "$W/shards" ] || mpirun -np 1 "$A" extract --config "$C/extract.ini" --model "$M" --prepared "$P" \
  --output "$W/shards" --device cuda >"$W/extract.log" 2>&1 || exit 1
b95="--adam-beta2 0.95" plain="--draft-norm-before-residual=false --adam-beta2 0.95"
declare -A opt=([base]="$plain" [beta2]="--draft-norm-before-residual=false --adam-beta2 0.999" [default]=""
  [lmrand]="$plain --lm-head-init random" [lossall]="$plain --loss-normalization all"
  [nbr]="--draft-norm-before-residual $b95" [nout]="$plain --draft-norm-output"
  [both]="--draft-norm-before-residual --draft-norm-output $b95" [nbfc]="$plain --draft-norm-before-fc"
  [win512]="$plain --draft-sliding-window 512" [nbrwin]="--draft-norm-before-residual --draft-sliding-window 512 $b95"
  [dauto]="--draft-sliding-window auto" [dfcnorm]="--draft-fc-norm" [dlmrand]="--lm-head-init random" [dboth]="--draft-fc-norm --lm-head-init random"
  [dnbfc]="--draft-norm-before-fc" [dnout]="--draft-norm-output"
  [dwd]="--weight-decay 1")
long="$W/long_prompts.jsonl"
[ "${LONG_PROMPTS:-0}" = 0 ] || [ -f "$long" ] || python3 "$root/tools/bench/long_prompts.py" \
  "$D/spec-bench/question.jsonl" "$long" || exit 1
for s in ${SEEDS:-0 1}; do for v in ${VARIANTS:-base beta2 lmrand lossall}; do
  r="$W/${v}_s$s" split="$W/${v}_s$s/data_split.json"
  if [ "$v" = specforge ]; then  # SpecForge's trainer writes an export folder itself
    split="$(ls "$W"/*_s*/data_split.json 2>/dev/null | head -1)"
    [ -n "$split" ] || { echo "recipe_smollm2: specforge needs an aerie run's data_split.json in $W (list an aerie variant first)" >&2; continue; }
    python3 "$root/tools/bench/specforge_train.py" --shards "$W/shards" --target "$M" --vocab "$W/vocab.safetensors" \
      --data-split "$split" --output "$r.export" --steps 400 --batch-size 16 --accumulation 1 --lr 5e-4 \
      --warmup-ratio 0.015 --max-grad-norm 0.5 --ttt-steps 7 --seed "$s" --attention flex_attention >"$r.log" 2>&1 \
      || { tail -5 "$r.log"; continue; }
  else
    # shellcheck disable=SC2086
    mpirun -np 1 "$A" train --config "$C/train.ini" --vocab "$W/vocab.safetensors" --steps 400 --device cuda \
      --model "$M" --shards "$W/shards" --output "$r" --seed "$s" ${opt[$v]} >"$r.log" 2>&1 || { tail -5 "$r.log"; continue; }
    mpirun -np 1 "$A" export --checkpoint "$r" --model "$M" --output "$r.export" >/dev/null 2>&1
  fi
  mpirun -np 1 "$A" eval --model "$M" --draft "$r.export" --prompts "$D/mt-bench/question.jsonl" \
    --num-prompts "${EVAL_PROMPTS:-20}" --chat-template smollm2 --max-new-tokens 256 --num-draft-tokens 5 \
    --ttt-steps 7 --dtype f32 --device cuda --shards "$W/shards" --data-split "$split" \
    --output "$r.eval.json" >"$r.evlog" 2>&1 || { tail -5 "$r.evlog"; continue; }
  python3 -c "import json,sys; e=json.load(open(sys.argv[1])); print(sys.argv[2], 'seed', sys.argv[3], 'acceptance', round(e['acceptance_length'],4), 'tau_sim', round(e['tau_sim'],4), 'lossless', e['lossless'])" \
    "$r.eval.json" "$v" "$s"
  [ "${LONG_PROMPTS:-0}" = 0 ] && continue
  mpirun -np 1 "$A" eval --model "$M" --draft "$r.export" --prompts "$long" --num-prompts 16 --chat-template smollm2 \
    --max-new-tokens 256 --num-draft-tokens 5 --dtype f32 --device cuda --output "$r.long.json" >"$r.longlog" 2>&1 \
    || { tail -5 "$r.longlog"; continue; }
  python3 -c "import json,sys; e=json.load(open(sys.argv[1])); print(sys.argv[2], 'seed', sys.argv[3], 'long prompts: acceptance', round(e['acceptance_length'],4), 'lossless', e['lossless'])" \
    "$r.long.json" "$v" "$s"
done; done
