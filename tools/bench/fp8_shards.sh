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
# shellcheck source=tools/bench/demo_lib.sh
source "$root/tools/bench/demo_lib.sh"  # aerie, seeds, d, cfg, run, demo_train_eval, demo_result
[ -f "$out/shards_fp8/shard-00000.h5" ] || run extract --config "$cfg/extract.ini" --model "$d/target" \
    --prepared "$d/prepared.h5" --output "$out/shards_fp8" --storage fp8
for storage in bf16 fp8; do
  shards="$d/shards"; [ "$storage" = fp8 ] && shards="$out/shards_fp8"
  for s in $seeds; do
    demo_train_eval "$out/$storage-seed$s" "$shards" "$s"
    demo_result "$out/$storage-seed$s/eval.json" storage "$storage" "$s"
  done
done
echo "{\"shard_bytes_bf16\": $(du -sb "$d/shards" | cut -f1), \"shard_bytes_fp8\": $(du -sb "$out/shards_fp8" | cut -f1)}"
