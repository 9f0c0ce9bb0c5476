# The stages that tools/bench/serve_*.sh share (sourced, not run): the benchmark prompts, `aerie eval` of each
# draft and K with the prompt ids written for the engine, the engine's runs through tools/engine_eval on the same
# ids, aerie eval along the engine's own answers (--follow), and the summary table. The caller sets: root out data aerie engine ks per_bench max_new dtype parallel
# eval_np model template draft_list title, and want() (which stages run). Every stage skips what exists.

# MT-Bench's 80 first turns and PER_BENCH of each other EAGLE evaluation set, by benchmark -> $out/bench.jsonl
serve_prompts() {
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
  [ "${NUM_PROMPTS:-0}" -gt 0 ] && [ "$NUM_PROMPTS" -lt "$nprompts" ] && nprompts=$NUM_PROMPTS  # eval's --num-prompts
  drafts=(); for d in $draft_list; do [ -f "$out/export_${d}_eagle3/config.json" ] && drafts+=("$d"); done
  return 0
}

# aerie eval: each draft and K, PARALLEL at a time, each on EVAL_NP ranks; the prompt ids and greedy answers
# written for the engine (--write-prompts).
serve_aerie_eval() {
  local jobs_run=0 d k
  for d in "${drafts[@]}"; do for k in $ks; do
    [ -f "$out/eval_${d}_k$k.json" ] && continue
    mpirun -np "$eval_np" "$aerie" eval --model "$model" --draft "$out/export_${d}_eagle3" --prompts "$bench" \
      --num-prompts "${NUM_PROMPTS:-0}" --chat-template "$template" --num-draft-tokens "$k" --max-new-tokens "$max_new" \
      --dtype "$dtype" --device "${device:-cuda}" --output "$out/eval_${d}_k$k.json" --write-prompts "$out/prompts_${d}_k$k.jsonl" \
      > "$out/eval_${d}_k$k.log" 2>&1 &
    jobs_run=$((jobs_run + 1)); [ $((jobs_run % parallel)) -eq 0 ] && wait
  done; done
  wait
}

# The engine on the same prompt ids, K and lengths: the plain engine once (the first run writes --plain-cache,
# the others reuse it), then the drafts PARALLEL at a time, started 20 s apart (vLLM measures the GPU's free
# memory while it starts).
serve_engine() {
  local edtype=bfloat16 runs=() i=0 d fmt k r o
  [ "$dtype" = f32 ] && edtype=float32
  for d in "${drafts[@]}"; do for fmt in ${FORMATS:-eagle3 speculators}; do for k in $ks; do
    [ -f "$out/${engine}_${d}_${fmt}_k$k.json" ] || [ ! -f "$out/export_${d}_$fmt/config.json" ] || runs+=("$d $fmt $k")
  done; done; done
  for r in "${runs[@]}"; do
    read -r d fmt k <<< "$r"
    o="$out/${engine}_${d}_${fmt}_k$k.json"
    python3 "$root/tools/engine_eval" --engine "$engine" --model "$model" --draft "$out/export_${d}_$fmt" \
      --prompt-ids "$out/prompts_${d}_k$k.jsonl" --num-draft-tokens "$k" --max-new-tokens "$max_new" \
      --dtype "$edtype" --aerie-eval "$out/eval_${d}_k$k.json" --gpu-memory-utilization "${GPU_FRACTION:-0.12}" \
      ${MAX_MODEL_LEN:+--max-model-len "$MAX_MODEL_LEN"} ${ATTENTION_BACKEND:+--attention-backend "$ATTENTION_BACKEND"} \
      --plain-cache "$out/${engine}_plain.json" --write-answers "$out/answers_${engine}_${d}_${fmt}_k$k.jsonl" \
      --output "$o" > "${o%.json}.log" 2>&1 &
    i=$((i + 1))
    if [ "$i" -eq 1 ] || [ $((i % parallel)) -eq 0 ]; then wait; else sleep 20; fi
  done
  wait
}

# aerie eval along the engine's own answers (--follow): where the two targets part, the draft's acceptance on the
# text the engine verified, EVAL_NP ranks each, PARALLEL at a time -> $out/follow_ENGINE_DRAFT_FORMAT_kK.json.
serve_follow() {
  local jobs_run=0 a name d k
  for a in "$out"/answers_"${engine}"_*_k*.jsonl; do
    [ -f "$a" ] || continue
    name=$(basename "$a" .jsonl); name=${name#answers_"${engine}"_}
    d=${name%_*}; d=${d%_*}; k=${name##*_k}
    [ -f "$out/follow_${engine}_$name.json" ] && continue
    mpirun -np "$eval_np" "$aerie" eval --model "$model" --draft "$out/export_${d}_eagle3" --follow "$a" \
      --num-prompts 0 --num-draft-tokens "$k" --max-new-tokens "$max_new" --dtype "$dtype" --device "${device:-cuda}" \
      --output "$out/follow_${engine}_$name.json" > "$out/follow_${engine}_$name.log" 2>&1 &
    jobs_run=$((jobs_run + 1)); [ $((jobs_run % parallel)) -eq 0 ] && wait
  done
  wait
}

# $out/summary.md: per draft, format and K, aerie's and the engine's acceptance length, over all prompts and by
# benchmark, and the engine's lossless count.
serve_summary() {
  python3 - "$out" "$engine" "$nprompts" "$title" <<'PY'
import glob, json, os, sys
out, engine, n, title = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
lines = [f"# aerie eval vs {engine} on {title} ({n} prompts)", "",
         "| draft | format | K | benchmark | prompts | aerie | engine | diff | engine lossless | engine plain = aerie greedy "
         "| aerie along the engine's answers | diff |",
         "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
for path in sorted(glob.glob(os.path.join(out, engine + "_*_k*.json"))):
    name = os.path.basename(path)[len(engine) + 1:-5]
    d, fmt, k = name.rsplit("_", 2)
    e = json.load(open(path))
    a = e.get("aerie", {})
    fp = os.path.join(out, f"follow_{engine}_{name}.json")
    fo = json.load(open(fp)) if os.path.isfile(fp) else {}
    rows = [("all", e.get("num_prompts"), a.get("acceptance_length"), e.get("acceptance_length"),
             fo.get("acceptance_length"))]
    for c, v in sorted((e.get("per_category") or {}).items()):
        rows.append((c, v.get("num_prompts"), (a.get("per_category") or {}).get(c, {}).get("acceptance_length"),
                     v.get("acceptance_length"), (fo.get("per_category") or {}).get(c, {}).get("acceptance_length")))
    for c, np_, al, el, fl in rows:
        diff = f"{(el / al - 1) * 100:+.2f}%" if al and el else "-"
        fdiff = f"{(el / fl - 1) * 100:+.2f}%" if fl and el else "-"
        f = lambda x: f"{x:.4f}" if isinstance(x, (int, float)) else "-"
        part = e.get("aerie_greedy_first_difference")
        same = f"{e.get('matches_aerie_greedy', '?')} / {e.get('num_prompts')}" + (
            f" (others part at token {part['median']} in the median)" if part else "") if c == "all" else ""
        v = e if c == "all" else (e.get("per_category") or {}).get(c, {})  # this row's own lossless figures
        at = v.get("lossless_first_difference")
        lossless = f"{v.get('lossless')} ({v.get('lossless_mismatches', '?')} differ" + (
            f", first at token {at['median']} in the median" if at else "") + ")"
        lines.append(f"| {d} | {fmt} | {k[1:]} | {c} | {np_} | {f(al)} | {f(el)} | {diff} | "
                     f"{lossless} | {same} | {f(fl)} | {fdiff} |")
open(os.path.join(out, "summary.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
}
