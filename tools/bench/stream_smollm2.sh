#!/usr/bin/env bash
# Streaming training against offline extract + train, and fp8 against bf16 shards, on SmolLM2-135M-Instruct
# on one GPU (issue 14; the numbers in docs/performance.md, "Streaming training" and "fp8 shards"):
#   1. the SmolLM2 pipeline's data (tools/smollm2_pipeline, size full): the target regenerates the answers
#      of N ShareGPT prompts (generate), prepare (template smollm2), vocab (K = 8192);
#   2. timed: offline extract + train (1 rank) against streaming train (2 ranks on the same GPU: rank 0
#      runs the target, rank 1 trains; --prepared, no shards), both STEPS steps of configs/runs/smollm2;
#   3. export + eval (MT-Bench first turns, chain of 5, target f32) of both drafts;
#   4. per seed in SEEDS: train on bf16 and on fp8 shards (extract --storage fp8), export, eval.
# One line per timed stage ("TIME stage seconds") and per eval, in OUT/times.txt and on stdout.
# usage: tools/bench/stream_smollm2.sh OUT_DIR
# Environment: AERIE_BIN (default build/aerie), SMOLLM2_MODEL (a converted model folder; default
#   tools/get_smollm2), PROMPTS (a JSONL of prompt-only ShareGPT records; default: made as
#   tools/smollm2_pipeline makes them), CONVERSATIONS (400), STEPS (400), EVAL_PROMPTS (20), SEEDS ("1 2"),
#   AERIE_DATA (../shared/data beside the checkout).
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
W="${1:?usage: stream_smollm2.sh OUT_DIR}"; mkdir -p "$W"; W="$(cd "$W" && pwd)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
A="${AERIE_BIN:-$root/build/aerie}"; C="$root/configs/runs/smollm2"; D="${AERIE_DATA:-$root/../shared/data}"
M="${SMOLLM2_MODEL:-$("$root/tools/get_smollm2" | tail -1)}"
N="${CONVERSATIONS:-400}"; steps="${STEPS:-400}"; ne="${EVAL_PROMPTS:-20}"
T0=$(date +%s.%N)
el() { python3 -c "import time; print(f'{time.time() - $T0:.1f}')"; }
tm() {  # NAME COMMAND...: runs it with its output in W/NAME.log, prints its wall time
  local name=$1; shift; local t; t=$(date +%s.%N); "$@" >"$W/$name.log" 2>&1; local rc=$?
  echo "TIME $name $(python3 -c "import time; print(f'{time.time() - $t:.2f}')") s rc $rc (at $(el) s)" | tee -a "$W/times.txt"
  [ $rc = 0 ] || { tail -20 "$W/$name.log"; exit 1; }
}
prompts="${PROMPTS:-$W/train_prompts.jsonl}"
if [ ! -f "$prompts" ]; then  # the pipeline's own prompt selection (its python block)
  ( out="$W" data="$D" conversations="$N" max_prompt_chars=6000
    eval "$(sed -n '/^prompts="\$out\/train_prompts.jsonl"/,/^PY$/p' "$root/tools/smollm2_pipeline"; echo fi)" )
fi
tm generate mpirun -np 1 "$A" generate --config "$C/generate.ini" --model "$M" --input "$prompts" \
  --output "$W/regen.jsonl" --max-conversations "$N" --device cuda
tm prepare mpirun -np 1 "$A" prepare --config "$C/prepare.ini" --tokenizer "$M" --input "$W/regen.jsonl" --output "$W/prepared.h5"
tm vocab mpirun -np 1 "$A" vocab --config "$C/vocab.ini" --prepared "$W/prepared.h5" --model "$M" --output "$W/vocab.safetensors"
TR=(--config "$C/train.ini" --vocab "$W/vocab.safetensors" --steps "$steps" --device cuda)
EV=(--model "$M" --prompts "$D/mt-bench/question.jsonl" --num-prompts "$ne" --chat-template smollm2 --max-new-tokens 256
    --num-draft-tokens 5 --ttt-steps 7 --dtype f32 --device cuda --shards "$W/shards" --data-split "$W/off/data_split.json")
tm extract mpirun -np 1 "$A" extract --config "$C/extract.ini" --model "$M" --prepared "$W/prepared.h5" --output "$W/shards" --device cuda
tm train_offline mpirun -np 1 "$A" train --model "$M" --shards "$W/shards" --output "$W/off" "${TR[@]}"
tm train_stream mpirun -np 2 "$A" train --target-model "$M" --prepared "$W/prepared.h5" --target-ranks 1 --output "$W/str" "${TR[@]}"
grep -h "done at step\|received\|done, [0-9]* steps" "$W/train_offline.log" "$W/train_stream.log"
summary() {  # NAME EVAL_JSON
  python3 -c "import json,sys; e=json.load(open(sys.argv[2])); print(sys.argv[1], 'acceptance', round(e['acceptance_length'],4), 'tau_sim', round(e['tau_sim'],4), 'lossless', e['lossless'])" "$1" "$2" | tee -a "$W/times.txt"
}
for r in off str; do
  tm "export_$r" mpirun -np 1 "$A" export --checkpoint "$W/$r" --model "$M" --output "$W/export_$r"
  tm "eval_$r" mpirun -np 1 "$A" eval "${EV[@]}" --draft "$W/export_$r" --output "$W/eval_$r.json"
  summary "$r" "$W/eval_$r.json"
done
tm extract_fp8 mpirun -np 1 "$A" extract --config "$C/extract.ini" --model "$M" --prepared "$W/prepared.h5" \
  --output "$W/shards_fp8" --storage fp8 --device cuda
echo "shard bytes: bf16 $(du -sb "$W/shards" | cut -f1), fp8 $(du -sb "$W/shards_fp8" | cut -f1)" | tee -a "$W/times.txt"
for s in 0 ${SEEDS:-1 2}; do for st in bf16 fp8; do
  [ "$s" = 0 ] && [ "$st" = bf16 ] && continue  # seed 0 bf16 is the offline run above
  sh="$W/shards"; [ "$st" = fp8 ] && sh="$W/shards_fp8"
  r="$W/${st}_s$s"
  tm "train_${st}_s$s" mpirun -np 1 "$A" train --model "$M" --shards "$sh" --output "$r" "${TR[@]}" --seed "$s"
  tm "export_${st}_s$s" mpirun -np 1 "$A" export --checkpoint "$r" --model "$M" --output "$r.export"
  tm "eval_${st}_s$s" mpirun -np 1 "$A" eval "${EV[@]}" --draft "$r.export" --output "$r.eval.json"
  summary "$st seed $s" "$r.eval.json"
done; done
echo "TOTAL $(el) s"
