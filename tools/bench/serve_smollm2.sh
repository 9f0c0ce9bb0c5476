#!/usr/bin/env bash
# aerie's drafts served by a real engine: SmolLM2-135M-Instruct drafts trained by aerie, the
# default (EAGLE-3.1 norm_before_residual) and a --draft-norm-before-residual=false one, exported in both
# formats, then `aerie eval` and `tools/engine_eval` (vLLM or SGLang) on the same prompt ids, target precision,
# draft tokens and lengths: acceptance length per benchmark, per position, lossless, tokens/s.
#
# usage: tools/bench/serve_smollm2.sh OUT        (a GPU machine with the engine importable)
# Environment:
#   AERIE_BIN       the aerie binary (default build/aerie)
#   SMOLLM2_GGUF / SMOLLM2_MODEL   as tools/smollm2_pipeline takes them (the target)
#   ENGINE          vllm (default) or sglang
#   KS              draft tokens per step to compare (default "3 5")
#   PER_BENCH       prompts of each EAGLE evaluation set besides MT-Bench (default 20; MT-Bench: all 80)
#   MAX_NEW         new tokens per prompt (default 256)
#   DTYPE           the target's dtype in both (default bf16: what the engine serves)
#   PARALLEL        evaluations run at once on the one GPU (default 4; acceptance does not depend on it, tokens/s
#                   does: the first engine run, alone, times the plain engine and one draft)
#   EVAL_NP         ranks of each `aerie eval` (default 1): its prompts split data-parallel, all ranks on the one GPU
#   DRAFTS          the drafts to export, evaluate and serve (default "default nonbr")
#   STEP            all (default), train (pipeline + the second draft + exports), eval (aerie eval),
#                   engine (the engine runs), follow (aerie eval along each engine run's own answers: `eval
#                   --follow`, where the engine's target parts from aerie's), summary
# Every stage skips what exists, so a rerun continues. OUT/summary.md holds the table.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${1:?usage: serve_smollm2.sh OUT}"
mkdir -p "$out"; out="$(cd "$out" && pwd)"
aerie="${AERIE_BIN:-$root/build/aerie}"; case "$aerie" in /*) ;; *) aerie="$PWD/$aerie" ;; esac
engine="${ENGINE:-vllm}" ks="${KS:-3 5}" per_bench="${PER_BENCH:-20}" max_new="${MAX_NEW:-256}"
dtype="${DTYPE:-bf16}" parallel="${PARALLEL:-4}" step="${STEP:-all}" eval_np="${EVAL_NP:-1}"
draft_list="${DRAFTS:-default nonbr}"
data="${AERIE_DATA:-$root/../shared/data}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
p="$out/pipeline"
model="${SMOLLM2_MODEL:-$p/SmolLM2-135M-Instruct}"
want() { [ "$step" = all ] || [ "$step" = "$1" ]; }

# --- the drafts --------------------------------------------------------------------------------------------
if want train; then
  AERIE_BIN="$aerie" AERIE_PIPELINE_SIZE=full SMOLLM2_CONVERSATIONS="${CONVERSATIONS:-300}" \
    SMOLLM2_TRAIN_STEPS="${TRAIN_STEPS:-400}" SMOLLM2_EVAL_PROMPTS=20 "$root/tools/smollm2_pipeline" "$p"
  if [[ " $draft_list " == *" nonbr "* ]] && [ ! -f "$out/export_nonbr_eagle3/config.json" ]; then
    mpirun -np 1 "$aerie" train --config "$root/configs/runs/smollm2/train.ini" --model "$model" --shards "$p/shards" \
      --vocab "$p/draft_vocab.safetensors" --output "$p/train_nonbr" --steps "${TRAIN_STEPS:-400}" \
      --draft-norm-before-residual=false --device cuda
  fi
  for d in $draft_list; do
    run="$p/train"; [ "$d" = nonbr ] && run="$p/train_nonbr"
    for fmt in eagle3 speculators; do
      [ -f "$out/export_${d}_$fmt/config.json" ] && continue
      for_engine="$engine"; [ "$fmt" = speculators ] && for_engine=vllm
      [ "$d" = default ] && [ "$engine" = sglang ] && continue  # SGLang does not run norm_before_residual
      mpirun -np 1 "$aerie" export --checkpoint "$run" --model "$model" --output "$out/export_${d}_$fmt" \
        --format "$fmt" --for "$for_engine"
    done
  done
fi

. "$root/tools/bench/serve_lib.sh"
template=smollm2 title=SmolLM2-135M-Instruct
serve_prompts
if want eval; then serve_aerie_eval; fi
if want engine; then serve_engine; fi
if want follow; then serve_follow; fi
serve_summary
