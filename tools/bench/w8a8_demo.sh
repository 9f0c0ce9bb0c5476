#!/usr/bin/env bash
# W8A8 block-FP8 GEMMs of the target (extract --fp8-gemm) against its own precision, on the demo
# (stories260K, CPU, 2 ranks): does a draft trained on W8A8 hidden states accept as well against the
# unquantized target?
#   1. tools/demo OUT/demo: prepared data, target, draft vocabulary, shards of the target as it is;
#   2. extract --fp8-gemm of the same prepared file into OUT/shards_w8a8, and how far its hidden states are
#      from the demo's (relative L2 per dataset, one JSON line; needs h5py, else skipped);
#   3. per variant and seed (SEEDS, default "0 1 2"): train --seed S (the demo's settings), export, eval
#      against the unquantized target (the demo's settings) -> one JSON line {gemm, seed,
#      acceptance_length, tau_sim, lossless}.
# usage: tools/bench/w8a8_demo.sh [OUT_DIR]       (default runs/w8a8-demo; AERIE_BIN as for tools/demo)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${1:-runs/w8a8-demo}"
mkdir -p "$out"; out="$(cd "$out" && pwd)"
seeds="${SEEDS:-0 1 2}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS=1
aerie="${AERIE_BIN:-$root/build/aerie}"
[ -f "$out/demo/eval_prompts.txt" ] || AERIE_BIN="$aerie" "$root/tools/demo" "$out/demo" > "$out/demo.log" 2>&1
d="$out/demo" cfg="$root/configs/runs/demo"
run() { mpirun -np 2 "$aerie" "$@" >> "$out/runs.log" 2>&1; }
[ -f "$out/shards_w8a8/shard-00000.h5" ] || run extract --config "$cfg/extract.ini" --model "$d/target" \
    --prepared "$d/prepared.h5" --output "$out/shards_w8a8" --fp8-gemm
if python3 -c "import h5py" 2>/dev/null; then
  python3 "$root/tools/bench/bench_util.py" compare-shards "$d/shards" "$out/shards_w8a8" 1.0
fi
for gemm in default w8a8; do
  shards="$d/shards"; [ "$gemm" = w8a8 ] && shards="$out/shards_w8a8"
  for s in $seeds; do
    r="$out/$gemm-seed$s"
    if [ ! -f "$r/eval.json" ]; then
      run train --config "$cfg/train.ini" --model "$d/target" --shards "$shards" --vocab "$d/draft_vocab.safetensors" \
          --output "$r/train" --seed "$s"
      run export --checkpoint "$r/train" --model "$d/target" --output "$r/export"
      run eval --config "$cfg/eval.ini" --model "$d/target" --draft "$r/export" --prompts "$d/eval_prompts.txt" \
          --shards "$shards" --data-split "$r/train/data_split.json" --output "$r/eval.json"
    fi
    python3 -c "import json,sys; e=json.load(open(sys.argv[1])); print(json.dumps({'gemm': sys.argv[2], 'seed': int(sys.argv[3]), 'acceptance_length': round(e['acceptance_length'], 4), 'tau_sim': round(e['tau_sim'], 4), 'lossless': e['lossless']}))" \
        "$r/eval.json" "$gemm" "$s"
  done
done
