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
#                   engine (the engine runs), summary
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

# --- the prompts: MT-Bench's 80 first turns and PER_BENCH of each other EAGLE evaluation set, by benchmark --
bench="$out/bench.jsonl"
if [ ! -f "$bench" ]; then
  python3 - "$data/eagle-eval-questions" "$bench" "$per_bench" <<'PY'
import json, os, sys
src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(dst + ".tmp", "w", encoding="utf-8") as f:
    for name in ["mt_bench", "gsm8k", "humaneval", "alpaca", "qa", "sum"]:
        rows = [json.loads(l) for l in open(os.path.join(src, name, "question.jsonl"), encoding="utf-8") if l.strip()]
        for r in rows[: (80 if name == "mt_bench" else n)]:
            f.write(json.dumps({"turns": r["turns"][:1], "category": name}, ensure_ascii=False) + "\n")
os.replace(dst + ".tmp", dst)
PY
fi
nprompts=$(wc -l < "$bench")

# --- aerie eval: each draft and K, the prompt ids and greedy answers written for the engine ----------------
drafts=(); for d in $draft_list; do [ -f "$out/export_${d}_eagle3/config.json" ] && drafts+=("$d"); done
if want eval; then
  jobs_run=0
  for d in "${drafts[@]}"; do for k in $ks; do
    [ -f "$out/eval_${d}_k$k.json" ] && continue
    mpirun -np "$eval_np" "$aerie" eval --model "$model" --draft "$out/export_${d}_eagle3" --prompts "$bench" \
      --num-prompts 0 --chat-template smollm2 --num-draft-tokens "$k" --max-new-tokens "$max_new" --dtype "$dtype" \
      --device cuda --output "$out/eval_${d}_k$k.json" --write-prompts "$out/prompts_${d}_k$k.jsonl" \
      > "$out/eval_${d}_k$k.log" 2>&1 &
    jobs_run=$((jobs_run + 1)); [ $((jobs_run % parallel)) -eq 0 ] && wait
  done; done
  wait
fi

# --- the engine: the same prompt ids, K and lengths -----------------------------------------------------------
edtype=bfloat16; [ "$dtype" = f32 ] && edtype=float32
if want engine; then
  # The plain engine once (the first run writes --plain-cache, the others reuse it), then the drafts PARALLEL at a
  # time, started 20 s apart (vLLM measures the GPU's free memory while it starts).
  runs=()
  for d in "${drafts[@]}"; do for fmt in eagle3 speculators; do for k in $ks; do
    [ -f "$out/${engine}_${d}_${fmt}_k$k.json" ] || [ ! -f "$out/export_${d}_$fmt/config.json" ] || runs+=("$d $fmt $k")
  done; done; done
  i=0
  for r in "${runs[@]}"; do
    read -r d fmt k <<< "$r"
    o="$out/${engine}_${d}_${fmt}_k$k.json"
    python3 "$root/tools/engine_eval" --engine "$engine" --model "$model" --draft "$out/export_${d}_$fmt" \
      --prompt-ids "$out/prompts_${d}_k$k.jsonl" --num-draft-tokens "$k" --max-new-tokens "$max_new" \
      --dtype "$edtype" --aerie-eval "$out/eval_${d}_k$k.json" --gpu-memory-utilization "${GPU_FRACTION:-0.12}" \
      --plain-cache "$out/${engine}_plain.json" --output "$o" > "${o%.json}.log" 2>&1 &
    i=$((i + 1))
    if [ "$i" -eq 1 ] || [ $((i % parallel)) -eq 0 ]; then wait; else sleep 20; fi
  done
  wait
fi

# --- summary ----------------------------------------------------------------------------------------------------
python3 - "$out" "$engine" "$nprompts" <<'PY'
import glob, json, os, sys
out, engine, n = sys.argv[1], sys.argv[2], sys.argv[3]
lines = [f"# aerie eval vs {engine} on SmolLM2-135M-Instruct ({n} prompts)", "",
         "| draft | format | K | benchmark | prompts | aerie | engine | diff | engine lossless |",
         "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
for path in sorted(glob.glob(os.path.join(out, engine + "_*_k*.json"))):
    name = os.path.basename(path)[len(engine) + 1:-5]
    d, fmt, k = name.rsplit("_", 2)
    e = json.load(open(path))
    a = e.get("aerie", {})
    rows = [("all", e.get("num_prompts"), a.get("acceptance_length"), e.get("acceptance_length"))]
    for c, v in sorted((e.get("per_category") or {}).items()):
        rows.append((c, v.get("num_prompts"), (a.get("per_category") or {}).get(c, {}).get("acceptance_length"),
                     v.get("acceptance_length")))
    for c, np_, al, el in rows:
        diff = f"{(el / al - 1) * 100:+.2f}%" if al and el else "-"
        f = lambda x: f"{x:.4f}" if isinstance(x, (int, float)) else "-"
        lines.append(f"| {d} | {fmt} | {k[1:]} | {c} | {np_} | {f(al)} | {f(el)} | {diff} | "
                     f"{e.get('lossless')} ({e.get('lossless_mismatches', '?')} differ) |")
open(os.path.join(out, "summary.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
