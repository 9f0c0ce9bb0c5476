# Shared by the demo comparisons (draft_variants.sh, fp8_shards.sh, w8a8_demo.sh): source it after setting
# `out` (the output folder, created) and `root` (the checkout). It sets aerie (AERIE_BIN or build/aerie),
# seeds (SEEDS, default "0 1 2"), d (OUT/demo: the demo's prepared data, target, vocabulary, shards; made by
# tools/demo unless its shards exist) and cfg (configs/runs/demo), and defines run and demo_train_eval.
# shellcheck shell=bash disable=SC2034,SC2154  # seeds, d, cfg: for the sourcing script; out, root: from it
seeds="${SEEDS:-0 1 2}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS=1
aerie="${AERIE_BIN:-$root/build/aerie}"
[ -f "$out/demo/shards/shard-00000.h5" ] || AERIE_BIN="$aerie" "$root/tools/demo" "$out/demo" > "$out/demo.log" 2>&1
d="$out/demo" cfg="$root/configs/runs/demo"

# run JOB ARGS...: aerie JOB on 2 ranks, its output appended to OUT/runs.log.
run() { mpirun -np 2 "$aerie" "$@" >> "$out/runs.log" 2>&1; }

# demo_train_eval RUN_DIR SHARDS SEED [TRAIN_OPTIONS...]: train --seed SEED on SHARDS with the demo's settings
# (and the options), export, eval against the demo's target (its settings: held-out prompts, real speculative
# decoding, greedy) into RUN_DIR/eval.json; nothing when that exists.
demo_train_eval() {
  local r=$1 shards=$2 s=$3
  shift 3
  [ -f "$r/eval.json" ] && return 0
  run train --config "$cfg/train.ini" --model "$d/target" --shards "$shards" --vocab "$d/draft_vocab.safetensors" \
      --output "$r/train" --seed "$s" "$@"
  run export --checkpoint "$r/train" --model "$d/target" --output "$r/export"
  run eval --config "$cfg/eval.ini" --model "$d/target" --draft "$r/export" --prompts "$d/eval_prompts.txt" \
      --shards "$shards" --data-split "$r/train/data_split.json" --output "$r/eval.json"
}

# demo_result EVAL_JSON KEY VALUE SEED: one JSON line {KEY: VALUE, seed, acceptance_length, tau_sim, lossless}.
demo_result() {
  python3 -c "import json,sys; e=json.load(open(sys.argv[1])); print(json.dumps({sys.argv[2]: sys.argv[3], 'seed': int(sys.argv[4]), 'acceptance_length': round(e['acceptance_length'], 4), 'tau_sim': round(e['tau_sim'], 4), 'lossless': e['lossless']}))" \
      "$@"
}
