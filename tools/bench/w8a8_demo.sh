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
# shellcheck source=tools/bench/demo_lib.sh
source "$root/tools/bench/demo_lib.sh"  # aerie, seeds, d, cfg, run, demo_train_eval, demo_result
[ -f "$out/shards_w8a8/shard-00000.h5" ] || run extract --config "$cfg/extract.ini" --model "$d/target" \
    --prepared "$d/prepared.h5" --output "$out/shards_w8a8" --fp8-gemm
if python3 -c "import h5py" 2>/dev/null; then
  python3 "$root/tools/bench/bench_util.py" compare-shards "$d/shards" "$out/shards_w8a8" 1.0
fi
for gemm in default w8a8; do
  shards="$d/shards"; [ "$gemm" = w8a8 ] && shards="$out/shards_w8a8"
  for s in $seeds; do
    demo_train_eval "$out/$gemm-seed$s" "$shards" "$s"
    demo_result "$out/$gemm-seed$s/eval.json" gemm "$gemm" "$s"
  done
done
