#!/usr/bin/env bash
# fp8 against bf16 hidden-state shards (issue 14, item 1) on the demo (stories260K, CPU, 2 ranks):
#   1. tools/demo OUT/demo: prepared data, target, draft vocabulary, bf16 shards, and the seed-0 draft;
#   2. extract --storage fp8 of the same prepared file into OUT/shards_fp8;
#   3. per storage and seed (SEEDS, default "0 1 2"): train --seed S (the demo's settings), export, eval
#      (the demo's settings) -> one JSON line {storage, seed, acceptance_length, tau_sim, lossless}, and the
#      shard folders' bytes.
# usage: tools/bench/fp8_shards.sh [OUT_DIR]       (default runs/fp8-shards; AERIE_BIN as for tools/demo)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${1:-runs/fp8-shards}"
mkdir -p "$out"; out="$(cd "$out" && pwd)"
seeds="${SEEDS:-0 1 2}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS=1
aerie="${AERIE_BIN:-$root/build/aerie}"
AERIE_BIN="$aerie" "$root/tools/demo" "$out/demo" > "$out/demo.log" 2>&1
d="$out/demo" cfg="$root/configs/runs/demo"
run() { mpirun -np 2 "$aerie" "$@" >> "$out/runs.log" 2>&1; }
[ -f "$out/shards_fp8/shard-00000.h5" ] || run extract --config "$cfg/extract.ini" --model "$d/target" \
    --prepared "$d/prepared.h5" --output "$out/shards_fp8" --storage fp8
for storage in bf16 fp8; do
  shards="$d/shards"; [ "$storage" = fp8 ] && shards="$out/shards_fp8"
  for s in $seeds; do
    r="$out/$storage-seed$s"
    if [ ! -f "$r/eval.json" ]; then
      run train --config "$cfg/train.ini" --model "$d/target" --shards "$shards" --vocab "$d/draft_vocab.safetensors" \
          --output "$r/train" --seed "$s"
      run export --checkpoint "$r/train" --model "$d/target" --output "$r/export"
      run eval --config "$cfg/eval.ini" --model "$d/target" --draft "$r/export" --prompts "$d/eval_prompts.txt" \
          --shards "$shards" --data-split "$r/train/data_split.json" --output "$r/eval.json"
    fi
    python3 -c "import json,sys; e=json.load(open(sys.argv[1])); print(json.dumps({'storage': sys.argv[2], 'seed': int(sys.argv[3]), 'acceptance_length': round(e['acceptance_length'], 4), 'tau_sim': round(e['tau_sim'], 4), 'lossless': e['lossless']}))" \
        "$r/eval.json" "$storage" "$s"
  done
done
echo "{\"shard_bytes_bf16\": $(du -sb "$d/shards" | cut -f1), \"shard_bytes_fp8\": $(du -sb "$out/shards_fp8" | cut -f1)}"
