#!/usr/bin/env bash
# SpecForge's own trainer against aerie's on the demo's data (issue 15, item 4): the same stories260K shards,
# draft vocabulary, held-out split and hyperparameters (configs/runs/demo/train.ini: 1000 steps of 8 samples,
# lr 3e-3, warmup 0.015, clipping at 0.5, 7 TTT steps), each draft scored by the same `aerie eval` (the demo's
# eval.ini: 32 held-out prompts, real speculative decoding, greedy chains of 5).
#   1. tools/bench/draft_variants.sh OUT makes OUT/demo (prepared data, target, vocabulary, shards, split)
#      and aerie's drafts;
#   2. train: where torch, h5py, safetensors, transformers and specforge import (a GPU machine;
#      `pip install --no-deps specforge==0.2.0`, plus `datasets` if its import is wanted: a stub stands in), tools/bench/specforge_train.py per seed (SEEDS, default "0 1 2 3 4 5", in parallel on one GPU)
#      into OUT/specforge-seedS (an export folder), batch 8 per step (its collator pads to the longest);
#   3. eval: where the aerie binary runs, `aerie eval --draft` of each such folder -> OUT/specforge-seedS/eval.json
#      and one JSON line per seed, then the mean.
# The steps can run on two machines (docs/design.md says how the table there was made): PHASE=train or eval.
# usage: tools/bench/specforge_demo.sh OUT    (AERIE_BIN as for tools/demo; ATTENTION: sdpa, since
#        flex_attention's compiled kernel needs a head dim of 16 or more and stories260K's is 8)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="$(cd "${1:?usage: specforge_demo.sh OUT (the folder of tools/bench/draft_variants.sh)}" && pwd)"
d="$out/demo" cfg="$root/configs/runs/demo"
seeds="${SEEDS:-0 1 2 3 4 5}" phase="${PHASE:-all}"
[ -f "$d/shards/shard-00000.h5" ] || { echo "specforge_demo: no $d/shards: run tools/bench/draft_variants.sh $out first" >&2; exit 2; }
split="$(ls "$out"/*/train/data_split.json "$d/train/data_split.json" 2>/dev/null | head -1)"
if [ "$phase" != eval ]; then
  for s in $seeds; do
    PYTHONPATH="$root/tools/bench:${PYTHONPATH:-}" python3 "$root/tools/bench/specforge_train.py" --shards "$d/shards" \
      --target "$d/target" --vocab "$d/draft_vocab.safetensors" --data-split "$split" --output "$out/specforge-seed$s" \
      --steps 1000 --batch-size 8 --accumulation 1 --lr 3e-3 --warmup-ratio 0.015 --max-grad-norm 0.5 --ttt-steps 7 \
      --seed "$s" --attention "${ATTENTION:-sdpa}" > "$out/specforge-seed$s.log" 2>&1 &
  done
  wait  # every seed's trainer; a failed one shows as a missing model below
  failed=0
  for s in $seeds; do [ -f "$out/specforge-seed$s/model.safetensors" ] || { echo "specforge_demo: seed $s failed: $out/specforge-seed$s.log" >&2; failed=1; }; done
  [ "$failed" = 0 ] || exit 1
fi
[ "$phase" = train ] && exit 0
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OPENBLAS_NUM_THREADS=1
aerie="${AERIE_BIN:-$root/build/aerie}"
lines="$out/specforge.jsonl"; : > "$lines"
for s in $seeds; do
  r="$out/specforge-seed$s"
  [ -f "$r/model.safetensors" ] || { echo "specforge_demo: $r: not trained (see $r.log)" >&2; continue; }
  [ -f "$r/eval.json" ] || mpirun -np 2 "$aerie" eval --config "$cfg/eval.ini" --model "$d/target" --draft "$r" \
      --prompts "$d/eval_prompts.txt" --shards "$d/shards" --data-split "$split" --output "$r/eval.json" >> "$out/specforge-eval.log" 2>&1
  python3 -c "import json,sys; e=json.load(open(sys.argv[1])); print(json.dumps({'trainer': 'specforge', 'seed': int(sys.argv[2]), 'acceptance_length': round(e['acceptance_length'], 4), 'tau_sim': round(e['tau_sim'], 4), 'lossless': e['lossless']}))" \
      "$r/eval.json" "$s" | tee -a "$lines"
done
[ -s "$lines" ] || { echo "specforge_demo: no SpecForge draft evaluated (run PHASE=train first, or copy OUT/specforge-seed* here)" >&2; exit 1; }
python3 - "$lines" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
if rows:
    al = [r["acceptance_length"] for r in rows]
    print(json.dumps({"trainer": "specforge", "seeds": len(rows), "acceptance_length_mean": round(sum(al) / len(al), 4),
                      "acceptance_length_min": min(al), "acceptance_length_max": max(al),
                      "tau_sim_mean": round(sum(r["tau_sim"] for r in rows) / len(rows), 4),
                      "all_lossless": all(r["lossless"] for r in rows)}))
PY
