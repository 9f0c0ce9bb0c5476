#!/usr/bin/env bash
# Checkpoint choice with the aerie binary on stories260K (issue 13, item 2; train/checkpoint_eval.h):
#  - eval --run on 2 ranks gives the checkpoint table a row for every checkpoint of a run (10, 20, 30) and
#    prints it; a rerun evaluates nothing; --every 20 selects 20 and the newest (30); --steps a missing step,
#    other settings (on 2 ranks: once, without MPI_ABORT), --every without --run are refused;
#  - export --best exports the row of the highest acceptance length (a table edited so that step 10 is the
#    best, and one where all tie: the later step, 30), says why, and records the step in config.json
#    (aerie_checkpoint) and the model.safetensors metadata; a plain export records its step too; --best
#    --format speculators exports the same step and records it as the default format does;
#  - export --best refuses a missing table, a step folder, a table of another target and a best checkpoint
#    that is gone, naming the file.
# usage: checkpoint_eval.sh AERIE MODEL_DIR STORIES_TXT WORK_DIR   (exit 77: no converted model)
set -euo pipefail
aerie=$1 model=$2 text=$3 work=$4
source "$(dirname "$0")/aerie_script_lib.sh"  # run, refused, fail; the empty work folder

run prepare 1 prepare --input "$text" --tokenizer "$model" --output "$work/prepared.h5" --max-length 64 --max-samples 48 \
  || fail prepare
run extract 2 extract --model "$model" --prepared "$work/prepared.h5" --output "$work/shards" --samples-per-shard 16 \
  || fail extract
run vocab 1 vocab --prepared "$work/prepared.h5" --model "$model" --output "$work/vocab.safetensors" --draft-vocab-size 200 \
  || fail vocab
r="$work/run"
run train 2 train --model "$model" --shards "$work/shards" --vocab "$work/vocab.safetensors" --output "$r" --steps 30 \
  --batch-size 4 --lr 3e-3 --checkpoint-every 10 --log-every 10 --eval-fraction 0.1 || fail train

eval_args=(eval --model "$model" --prompts "$text" --num-prompts 4 --num-draft-tokens 3 --ttt-steps 2
           --shards "$work/shards" --data-split "$r/data_split.json")
table="$r/checkpoint_eval.json"
steps_of() {  # the steps of a table, as "10 20 30"
  python3 -c 'import json,sys; print(*[c["step"] for c in json.load(open(sys.argv[1]))["checkpoints"]])' "$1"
}

# --- eval --run ---------------------------------------------------------------------------------------
run eval_run 2 "${eval_args[@]}" --max-new-tokens 16 --run "$r" || fail "eval --run"
[ "$(steps_of "$table")" = "10 20 30" ] || fail "table steps: $(steps_of "$table")"
grep -q "3 to evaluate" "$last" || fail "eval --run did not evaluate 3 checkpoints"
grep -Eq "^ +20 +[0-9.]+ +[0-9.]+ +yes" "$last" || fail "no table row of step 20 printed"
grep -q "^best: step " "$last" || fail "no best line"
python3 - "$table" <<'EOF' || fail "table content"
import json, sys
t = json.load(open(sys.argv[1]))
assert t["format"] == "aerie.checkpoint_eval" and t["format_version"] == 1 and t["aerie_version"], t.keys()
assert t["settings"]["num_prompts"] == 4 and t["settings"]["dtype"] == "f32", t["settings"]
for c in t["checkpoints"]:
    assert c["acceptance_length"] >= 1 and c["tau_sim"] >= 1 and c["lossless"], c
    assert c["checkpoint"].endswith("step-%08d" % c["step"]), c["checkpoint"]
EOF
cp "$table" "$work/table_first.json"
run eval_rerun 2 "${eval_args[@]}" --max-new-tokens 16 --run "$r" || fail "eval --run rerun"
grep -q "3 already in $table, 0 to evaluate" "$last" || fail "the rerun evaluated again"
cmp -s "$table" "$work/table_first.json" || fail "the rerun changed the table"
run eval_every 2 "${eval_args[@]}" --max-new-tokens 16 --run "$r" --every 20 --output "$work/every.json" || fail "eval --run --every"
[ "$(steps_of "$work/every.json")" = "20 30" ] || fail "--every 20 selected $(steps_of "$work/every.json")"
refused eval_missing_step "no complete checkpoint of step 15 \(the run has steps 10, 20, 30\)" 1 \
  "${eval_args[@]}" --run "$r" --steps 10,15 --output "$work/steps.json"
refused eval_other_settings "$table was made with other eval settings \(.*max_new_tokens: 16 -> 8" 2 \
  "${eval_args[@]}" --run "$r" --max-new-tokens 8
# ... on 2 ranks: the message once and a clean exit, no MPI_ABORT banner
! grep -q "MPI_ABORT" "$last" || fail "eval_other_settings: the refusal aborted the job (MPI_ABORT)"
[ "$(grep -c "was made with other eval settings" "$last")" = 1 ] || fail "eval_other_settings: the refusal not logged once"
cmp -s "$table" "$work/table_first.json" || fail "a refused rerun changed the table"
# A W8A8 target (--fp8-gemm) verifies differently: its rows do not join a table of the plain target's.
refused eval_fp8_gemm "$table was made with other eval settings \(.*fp8_gemm" 1 \
  "${eval_args[@]}" --max-new-tokens 16 --run "$r" --fp8-gemm
cmp -s "$table" "$work/table_first.json" || fail "a refused --fp8-gemm rerun changed the table"
refused eval_bad_steps "aerie eval: --steps 10,x: 'x' is not a positive step number" 1 "${eval_args[@]}" --run "$r" \
  --steps 10,x
refused eval_every_alone "aerie eval: --every and --steps need --run" 1 "${eval_args[@]}" --draft "$r" --every 10
refused eval_both "aerie eval: --draft and --run exclude each other" 1 "${eval_args[@]}" --draft "$r" --run "$r"
# Decoding-mode options that would act on nothing or cannot hold: usage errors before the target loads.
refused eval_tree_depth_alone "aerie eval: --tree-depth 3 needs --tree-topk > 1" 1 "${eval_args[@]}" --draft "$r" \
  --tree-depth 3
refused eval_tree_too_big "aerie eval: --num-draft-tokens 3 \(the tree's nodes\) exceeds 2, what --tree-topk 2 --tree-depth 1" 1 \
  "${eval_args[@]}" --draft "$r" --tree-topk 2 --tree-depth 1
refused eval_tree_sampled "aerie eval: --tree-topk > 1 verifies greedily" 1 "${eval_args[@]}" --draft "$r" \
  --tree-topk 2 --temperature 0.5
refused eval_top_p_greedy "aerie eval: --top-p and --sample-seed act only with --temperature > 0" 1 \
  "${eval_args[@]}" --draft "$r" --top-p 0.9
refused eval_tree_topk_k "eval: --tree-topk 100000 exceeds the draft vocabulary" 1 \
  "${eval_args[@]}" --draft "$r" --tree-topk 100000 --tree-depth 1

# --- export --best ----------------------------------------------------------------------------------------
exported() {  # DIR -> "config-step selected_by metadata-step metadata-selected_by"
  python3 - "$1" <<'EOF'
import json, struct, sys
c = json.load(open(sys.argv[1] + "/config.json"))["aerie_checkpoint"]
data = open(sys.argv[1] + "/model.safetensors", "rb").read()
m = json.loads(data[8:8 + struct.unpack("<Q", data[:8])[0]])["__metadata__"]
print(c["step"], c["selected_by"], m["checkpoint_step"], m["checkpoint_selected_by"])
EOF
}
best=$(python3 -c '
import json, sys
rows = json.load(open(sys.argv[1]))["checkpoints"]
print(max(rows, key=lambda c: (c["acceptance_length"], c["step"]))["step"])' "$table")
run export_best 1 export --checkpoint "$r" --best --model "$model" --output "$work/export_best" || fail "export --best"
grep -q "export --best: step $best of $r: acceptance length .*the highest of the 3 checkpoints in $table" "$last" \
  || fail "export --best did not say it picked step $best"
[ "$(exported "$work/export_best")" = "$best best_acceptance_length $best best_acceptance_length" ] \
  || fail "export --best recorded $(exported "$work/export_best"), expected step $best"
run export_plain 1 export --checkpoint "$r" --model "$model" --output "$work/export_plain" || fail "export"
[ "$(exported "$work/export_plain")" = "30 newest 30 newest" ] || fail "plain export recorded $(exported "$work/export_plain")"

edit() {  # edit TABLE OUT PYTHON: OUT = TABLE with the statement applied to t
  python3 -c "
import json, sys
t = json.load(open(sys.argv[1]))
$3
json.dump(t, open(sys.argv[2], 'w'), indent=2)" "$1" "$2"
}
edit "$table" "$work/first_best.json" 't["checkpoints"][0]["acceptance_length"] = 9.0'
run export_first 1 export --checkpoint "$r" --best --eval-table "$work/first_best.json" --model "$model" \
  --output "$work/export_first" || fail "export --best (step 10 the best)"
[ "$(exported "$work/export_first")" = "10 best_acceptance_length 10 best_acceptance_length" ] \
  || fail "export --best of a table where step 10 is the best recorded $(exported "$work/export_first")"
run export_first_spec 1 export --checkpoint "$r" --best --eval-table "$work/first_best.json" --model "$model" \
  --output "$work/export_first_spec" --format speculators || fail "export --best --format speculators"
grep -q "export --best: step 10 of $r: acceptance length 9" "$last" || fail "export --best --format speculators: no step 10"
[ "$(exported "$work/export_first_spec")" = "10 best_acceptance_length 10 best_acceptance_length" ] \
  || fail "export --best --format speculators recorded $(exported "$work/export_first_spec")"
python3 - "$work/export_first" "$work/export_first_spec" <<'EOF' || fail "the speculators export's record is not the default's"
import json, struct, sys
def meta(d):
    data = open(d + "/model.safetensors", "rb").read()
    return json.loads(data[8:8 + struct.unpack("<Q", data[:8])[0]])["__metadata__"]
e, s = (json.load(open(d + "/config.json")) for d in sys.argv[1:])
assert s["speculators_model_type"] == "eagle3" and "speculators_model_type" not in e, "not a speculators export"
assert s["aerie_checkpoint"] == e["aerie_checkpoint"], (s["aerie_checkpoint"], e["aerie_checkpoint"])
assert s["aerie_checkpoint"]["checkpoint"].endswith("step-00000010"), s["aerie_checkpoint"]
assert meta(sys.argv[2]) == meta(sys.argv[1]), (meta(sys.argv[2]), meta(sys.argv[1]))
EOF
edit "$table" "$work/tie.json" 'for c in t["checkpoints"]: c["acceptance_length"] = 2.0'
run export_tie 1 export --checkpoint "$r" --best --eval-table "$work/tie.json" --model "$model" \
  --output "$work/export_tie" || fail "export --best (a tie)"
grep -q "step 30 of .*tied with step(s) \[10,20\], the later step is taken" "$last" || fail "the tie was not explained"
[ "$(exported "$work/export_tie")" = "30 best_acceptance_length 30 best_acceptance_length" ] || fail "tie: not step 30"

refused export_no_table "export --best: no checkpoint table $work/none.json" 1 \
  export --checkpoint "$r" --best --eval-table "$work/none.json" --model "$model" --output "$work/e1"
refused export_step_folder "is one checkpoint; --best chooses among the checkpoints of a run" 1 \
  export --checkpoint "$r/checkpoints/step-00000020" --best --model "$model" --output "$work/e2"
edit "$table" "$work/other_target.json" 't["settings"]["target_config_sha256"] = "0" * 64'
refused export_other_target "export --best: $work/other_target.json was made with the target .*which is not --model" 1 \
  export --checkpoint "$r" --best --eval-table "$work/other_target.json" --model "$model" --output "$work/e3"
mv "$r/checkpoints/step-00000010" "$work/step10_away"
refused export_gone "the best checkpoint of $work/first_best.json, step 10 .*is no longer in $r.*the best still there is step [23]0" 1 \
  export --checkpoint "$r" --best --eval-table "$work/first_best.json" --model "$model" --output "$work/e4"
# Another run's table (its fingerprints are not this run's checkpoints'): no step of it is offered instead.
edit "$work/first_best.json" "$work/foreign.json" 'for c in t["checkpoints"]: c["fingerprint"] = "f" * 64'
refused export_gone_foreign "is no longer in $r.*no checkpoint the table evaluated is left in it \(another run's table\?\)" 1 \
  export --checkpoint "$r" --best --eval-table "$work/foreign.json" --model "$model" --output "$work/e4"
mv "$work/step10_away" "$r/checkpoints/step-00000010"
refused export_table_alone "aerie export: --eval-table needs --best" 1 \
  export --checkpoint "$r" --eval-table "$table" --model "$model" --output "$work/e5"
# The table as a symbolic link into another folder (its target not there yet): eval --run writes the link's
# target and keeps the link (it used to replace the link by a regular file).
mkdir -p "$work/tables"
mv "$table" "$work/old_table.json"
ln -s ../tables/table.json "$table"
run eval_run_link 1 "${eval_args[@]}" --max-new-tokens 16 --run "$r" --steps 10 || fail "eval --run through a link"
[ -L "$table" ] || fail "eval --run replaced the symbolic link to its table"
[ "$(steps_of "$work/tables/table.json")" = "10" ] || fail "the link's target is not the new table"

# eval --write-prompts (tools/engine_eval's input): the prompts of both replicas gathered in --prompts order,
# the same file on 1 and 2 ranks; refused with --run.
w_args=(eval --model "$model" --prompts "$text" --num-prompts 5 --num-draft-tokens 3 --max-new-tokens 12 --device cpu
        --dtype f32 --draft "$r")
run write_prompts_np2 2 "${w_args[@]}" --output "$work/w2.json" --write-prompts "$work/p2.jsonl" || fail "--write-prompts"
grep -q "the 5 prompts' ids, stop ids and greedy answers -> $work/p2.jsonl" "$last" || fail "no --write-prompts line"
run write_prompts_np1 1 "${w_args[@]}" --output "$work/w1.json" --write-prompts "$work/p1.jsonl" || fail "--write-prompts"
cmp "$work/p1.jsonl" "$work/p2.jsonl" || fail "--write-prompts differs between 1 and 2 ranks"
python3 - "$work/p2.jsonl" "$work/w2.json" <<'EOF' || fail "--write-prompts content"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ev = json.load(open(sys.argv[2]))
assert [r["index"] for r in rows] == [0, 1, 2, 3, 4], [r["index"] for r in rows]
for r in rows:
    assert r["prompt_ids"] and r["prompt_ids"][0] == 1, r  # BOS of stories260K
    assert 1 <= len(r["greedy_ids"]) <= 12 and r["stop_ids"], r
    assert r["category"] is None, r
assert sum(len(r["greedy_ids"]) for r in rows) == ev["greedy_tokens"], (ev["greedy_tokens"], rows)
EOF
# Never over another file of the job, or a file of another kind; a symbolic link is written through.
refused write_prompts_same "eval: --write-prompts $work/w1.json is also --output" 1 \
  "${w_args[@]}" --output "$work/w1.json" --write-prompts "$work/w1.json"
refused write_prompts_foreign "eval: --write-prompts $work/w2.json exists and is not a prompt-ids file of aerie eval" 1 \
  "${w_args[@]}" --output "$work/w3.json" --write-prompts "$work/w2.json"
grep -q '"acceptance_length"' "$work/w2.json" || fail "a refused --write-prompts changed $work/w2.json"
ln -s p1.jsonl "$work/plink.jsonl"
run write_prompts_link 1 "${w_args[@]}" --output "$work/w4.json" --write-prompts "$work/plink.jsonl" \
  || fail "--write-prompts through a link"
[ -L "$work/plink.jsonl" ] || fail "--write-prompts replaced its symbolic link"
refused write_prompts_run "aerie eval: --write-prompts goes with --draft" 1 \
  "${eval_args[@]}" --run "$r" --write-prompts "$work/p3.jsonl"

# eval --follow (the acceptance along another engine's answers): following the target's own greedy answers is the
# plain run, on 1 and 2 ranks; an answer that parts at its 3rd token is followed and named; bad records refused.
f_args=(eval --model "$model" --num-draft-tokens 3 --max-new-tokens 12 --device cpu --dtype f32 --draft "$r")
run follow_np2 2 "${f_args[@]}" --follow "$work/p1.jsonl" --output "$work/f2.json" || fail "--follow on 2 ranks"
grep -q "following $work/p1.jsonl (this target's own argmaxes agree throughout in 5 of 5 prompts)" "$last" \
  || fail "no --follow line"
run follow_np1 1 "${f_args[@]}" --follow "$work/p1.jsonl" --output "$work/f1.json" || fail "--follow on 1 rank"
python3 - "$work/p1.jsonl" "$work/parted.jsonl" "$work/bad.jsonl" <<'EOF2' || fail "--follow files"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
r = next(r for r in rows if len(r["greedy_ids"]) >= 4)
t = (r["greedy_ids"][2] + 7) % 512
while t in r["stop_ids"]:  # a stop id there would end the answer
    t = (t + 1) % 512
r["greedy_ids"][2] = t
with open(sys.argv[2], "w") as f:
    f.write("".join(json.dumps(x) + "\n" for x in rows))
rows[1]["greedy_ids"] = [5, 99999]
with open(sys.argv[3], "w") as f:
    f.write("".join(json.dumps(x) + "\n" for x in rows))
rows[1]["greedy_ids"] = [5, 6]
rows[2]["index"] = rows[0]["index"]
with open(sys.argv[3] + ".dup", "w") as f:
    f.write("".join(json.dumps(x) + "\n" for x in rows))
EOF2
run follow_parted 1 "${f_args[@]}" --follow "$work/parted.jsonl" --output "$work/f3.json" || fail "--follow parted"
python3 - "$work/w1.json" "$work/f1.json" "$work/f2.json" "$work/f3.json" <<'EOF2' || fail "--follow eval.json"
import json, sys
w, f1, f2, f3 = (json.load(open(p)) for p in sys.argv[1:])
for f in (f1, f2):
    assert f["verify_passes"] == w["verify_passes"] and f["acceptance_length"] == w["acceptance_length"], (f, w)
    assert f["own_greedy_agreement"] == 5 and "own_first_difference" not in f, f
    assert "lossless" not in f and "speedup" not in f and f["follow"].endswith("p1.jsonl"), f
assert f3["own_greedy_agreement"] == 4 and f3["own_first_difference"] == {"median": 2, "min": 2, "max": 2}, f3
assert f3["tokens_generated"] == w["tokens_generated"], (f3["tokens_generated"], w["tokens_generated"])
EOF2
refused follow_bad "eval: --follow $work/bad.jsonl:2: \"greedy_ids\" holds token id 99999, outside the target's" 1 \
  "${f_args[@]}" --follow "$work/bad.jsonl" --output "$work/f4.json"
refused follow_dup "eval: --follow $work/bad.jsonl.dup:3: index 0 again \\(first on line 1\\)" 1 \
  "${f_args[@]}" --follow "$work/bad.jsonl.dup" --output "$work/f4.json"
refused follow_and_prompts "aerie eval: --prompts and --follow exclude each other" 1 "${f_args[@]}" \
  --follow "$work/p1.jsonl" --prompts "$text"
refused follow_sampled "aerie eval: --follow measures greedy chains" 1 "${f_args[@]}" --follow "$work/p1.jsonl" \
  --temperature 0.5
echo "checkpoint_eval: ok"
