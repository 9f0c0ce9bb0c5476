#!/usr/bin/env bash
# Provenance with the aerie binary on stories260K (issue 17, cases 3, 4 and 6; io/fingerprint.h):
#  3. an extract rerun into a folder of another model of the same shape (stories260K with every weight
#     x 1.01) is refused naming the difference, and so is one with another prepared file; train refuses
#     shards of another target than --model and a folder that mixes two targets; a resumed train refuses
#     another --model (with that model's own shards) and other --shards (of another prepared file);
#  4. train refuses a shard folder with a shard missing in the middle, unless --allow-missing-shards;
#  6. export refuses a target of another layer count (the same width).
# usage: provenance.sh AERIE MODEL_DIR STORIES_TXT WORK_DIR   (exit 77: no converted model)
# PARTS="3b 4" runs only those parts (default: all of 3a 3b 3c 4 6).
set -euo pipefail
aerie=$1 model=$2 text=$3 work=$4
source "$(dirname "$0")/aerie_script_lib.sh"  # run, refused, fail; the empty work folder
parts=" ${PARTS:-3a 3b 3c 4 6} "
part() { [[ "$parts" == *" $1 "* ]]; }

# Model B: stories260K with every F32 weight x 1.01 (another model of the same shape and config.json).
cp -r "$model" "$work/model_b"
python3 - "$model/model.safetensors" "$work/model_b/model.safetensors" <<'EOF'
import array, json, struct, sys
src, dst = sys.argv[1], sys.argv[2]
data = open(src, "rb").read()
n = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + n])
body = bytearray(data[8 + n:])
for name, t in header.items():
    if name == "__metadata__" or t["dtype"] != "F32":
        continue
    a, b = t["data_offsets"]
    v = array.array("f", bytes(body[a:b]))
    body[a:b] = array.array("f", (x * 1.01 for x in v)).tobytes()
open(dst, "wb").write(data[:8 + n] + bytes(body))
EOF
cmp -s "$model/model.safetensors" "$work/model_b/model.safetensors" && fail "model_b equals the model"

run prepare 1 prepare --input "$text" --tokenizer "$model" --output "$work/prepared.h5" --max-length 64 --max-samples 48 \
  || fail prepare
run prepare2 1 prepare --input "$text" --tokenizer "$model" --output "$work/prepared2.h5" --max-length 48 --max-samples 48 \
  || fail prepare2
run vocab 1 vocab --prepared "$work/prepared.h5" --model "$model" --output "$work/vocab.safetensors" --draft-vocab-size 200 \
  || fail vocab
x() { echo extract --prepared "$work/$1" --samples-per-shard 8 --aux-layers 1,2,4 --model "$2" --output "$work/$3"; }
# shellcheck disable=SC2046
run extract_a 2 $(x prepared.h5 "$model" shards_a) || fail "extract A"
# shellcheck disable=SC2046
run extract_b 2 $(x prepared.h5 "$work/model_b" shards_b) || fail "extract B"
# shellcheck disable=SC2046
run extract_a2 2 $(x prepared2.h5 "$model" shards_a2) || fail "extract A of prepared2.h5"
n=$(ls "$work/shards_a" | grep -c '^shard-.*\.h5$')
[ "$n" -eq 6 ] || fail "expected 6 shards, got $n"
! grep -q "encodes a probe text differently" "$work/extract_a.log" || fail "extract warned about its own tokenizer"
# A prepared file of another tokenizer of the same vocabulary (the ids of every non-special token reversed):
# the id range check passes, the tokenizer probe does not (data/prepare.h tokenizer_probe).
mkdir -p "$work/tok_swap"
python3 - "$model/tokenizer.json" "$work/tok_swap/tokenizer.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
v = t["model"]["vocab"]
ids = sorted(i for i in v.values() if i >= 3)
back = dict(zip(ids, reversed(ids)))
t["model"]["vocab"] = {k: back.get(i, i) for k, i in v.items()}
json.dump(t, open(sys.argv[2], "w"))
PY
cp "$model/tokenizer_config.json" "$work/tok_swap/" 2>/dev/null || true
run prepare_swap 1 prepare --input "$text" --tokenizer "$work/tok_swap" --output "$work/prepared_swap.h5" \
  --max-length 64 --max-samples 8 || fail "prepare with the swapped tokenizer"
# shellcheck disable=SC2046
run extract_swap 1 $(x prepared_swap.h5 "$model" shards_swap) || fail "extract of the swapped prepared file"
grep -Eq "extract: --prepared .*prepared_swap.h5 was tokenized with .*tok_swap, which encodes a probe text differently from --model" \
  "$work/extract_swap.log" || fail "extract did not warn about the other tokenizer"
echo "2. extract warns about a prepared file of another tokenizer of the same vocabulary"
t() { echo train --shards "$work/$1" --model "$2" --vocab "$work/vocab.safetensors" --output "$work/$3" --steps 8 \
  --batch-size 4 --checkpoint-every 4 --log-every 4; }
# shellcheck disable=SC2046
run train_a 2 $(t shards_a "$model" run) || fail "train A"

# --- 3. an extract rerun into a folder of other provenance
if part 3a; then
cp -r "$work/shards_a" "$work/rerun"
rm "$work/rerun"/shard-0000[345].h5
# shellcheck disable=SC2046
refused extract_rerun_b "extract: .*/rerun/shard-00000.h5 exists but is not chunk 0 of this run: it was extracted from another target: the weights differ \(the same config.json: another checkpoint of the same shape\)" \
  2 $(x prepared.h5 "$work/model_b" rerun)
# shellcheck disable=SC2046
refused extract_rerun_prepared "exists but is not chunk 0 of this run: .*(another prepared file|another --samples-per-shard or --prepared)" \
  2 $(x prepared2.h5 "$model" rerun)
[ "$(ls "$work/rerun" | grep -c '^shard-.*\.h5$')" -eq 3 ] || fail "a refused rerun wrote shards"
# shellcheck disable=SC2046
run extract_rerun_a 2 $(x prepared.h5 "$model" rerun) || fail "the rerun with the same model"
grep -q "3 already done" "$last" || fail "the rerun did not skip the 3 shards"
echo "3a. extract reruns with another model or prepared file refused; the same model completes the folder"

fi
# --- 3. train over shards of another target, and over a mixed folder
if part 3b; then
# shellcheck disable=SC2046
refused train_other_model "train: the shards in .*/shards_a were extracted from another target than --model .*/model_b: the weights differ" \
  2 $(t shards_a "$work/model_b" run_x)
cp -r "$work/shards_a" "$work/mixed"
cp "$work/shards_b/shard-00002.h5" "$work/mixed/"
# shellcheck disable=SC2046
refused train_mixed "train: --shards .*/mixed mixes the shards of two targets: .*shard-0000[0-9].h5 and .*shard-0000[0-9].h5: the weights differ" \
  2 $(t mixed "$model" run_x)
[ ! -d "$work/run_x/checkpoints" ] || fail "a refused train wrote checkpoints"
echo "3b. train refuses shards of another target and a mixed folder"

fi
# --- 3. resumed train with another --model or other --shards
if part 3c; then
rm -rf "$work/run/checkpoints/step-00000008"  # resume from step 4
# shellcheck disable=SC2046
refused resume_model "resume: --model .*/model_b is not the target .*/run/checkpoints/step-00000004 was trained with \(.*\): the weights differ" \
  2 $(t shards_b "$work/model_b" run)
# shellcheck disable=SC2046
refused resume_shards "resume: --shards .*/shards_a2 are not the shards .*step-00000004 was trained on \(.*/shards_a\): they were extracted from another prepared file" \
  2 $(t shards_a2 "$model" run)
# shellcheck disable=SC2046
run resume_ok 2 $(t shards_a "$model" run) || fail "the resume with the same inputs"
grep -q "resuming from $work/run/checkpoints/step-00000004" "$last" || fail "did not resume"
echo "3c. a resumed train refuses another --model and other --shards"

fi
# --- 4. a shard missing in the middle
if part 4; then
cp -r "$work/shards_a" "$work/holey"
rm "$work/holey/shard-00002.h5"
# shellcheck disable=SC2046
refused train_missing "train: --shards .*/holey holds 5 of 6 shards of its extraction: chunk\(s\) 2 missing" \
  2 $(t holey "$model" run_h)
grep -q -- "--allow-missing-shards" "$last" || fail "no --allow-missing-shards advice"
# shellcheck disable=SC2046
run train_missing_allowed 2 $(t holey "$model" run_h) --allow-missing-shards || fail "--allow-missing-shards"
grep -q "chunk(s) 2 missing .*training on the rest" "$last" || fail "no warning with --allow-missing-shards"
echo "4. train refuses a folder with a missing shard unless --allow-missing-shards"

fi
# --- 6. export with a target of another layer count
if part 6; then
mkdir -p "$work/deeper"
python3 -c "import json,sys; c=json.load(open(sys.argv[1])); c['num_hidden_layers']+=2; json.dump(c, open(sys.argv[2],'w'))" \
  "$model/config.json" "$work/deeper/config.json"
refused export_deeper "export: the target has 7 layers, the draft was trained on hidden states of a target of 5 layers" \
  1 export --checkpoint "$work/run" --model "$work/deeper" --output "$work/export_x"
[ ! -e "$work/export_x" ] || fail "a refused export wrote files"
run export_ok 1 export --checkpoint "$work/run" --model "$model" --output "$work/export" || fail "export"
echo "6. export refuses a target of another layer count"
# eval of a checkpoint against another target of the same shape: it runs, with a warning naming both.
run eval_other_target 1 eval --model "$work/model_b" --draft "$work/run" --prompts "$text" --num-prompts 2 \
  --max-new-tokens 8 --num-draft-tokens 2 --ttt-steps 1 --output "$work/eval_b.json" || fail "eval with model_b"
grep -Eq "eval: --model .*/model_b is not the target .*/run was trained with \(.*\): the weights differ" "$last" \
  || fail "eval did not warn about another target"
run eval_same_target 1 eval --model "$model" --draft "$work/run" --prompts "$text" --num-prompts 2 \
  --max-new-tokens 8 --num-draft-tokens 2 --ttt-steps 1 --output "$work/eval_a.json" || fail "eval with the model"
! grep -q "is not the target" "$last" || fail "eval warned about its own target"
# An export records its checkpoint's target: the same warning for the export.
run eval_export_other 1 eval --model "$work/model_b" --draft "$work/export" --prompts "$text" --num-prompts 2 \
  --max-new-tokens 8 --num-draft-tokens 2 --ttt-steps 1 --output "$work/eval_eb.json" || fail "eval of the export"
grep -Eq "eval: --model .*/model_b is not the target .*/export was trained with" "$last" \
  || fail "eval did not warn about the export's other target"
echo "6b. eval warns about a checkpoint's or an export's other target"
# Teacher-forced figures on shards of another target: a warning naming both (train refuses such shards).
run eval_other_shards 1 eval --model "$model" --draft "$work/run" --prompts "$text" --num-prompts 2 \
  --max-new-tokens 8 --num-draft-tokens 2 --ttt-steps 1 --shards "$work/shards_b" --output "$work/eval_sb.json" \
  || fail "eval on shards_b"
grep -Eq "eval: the shards of the teacher-forced figures \(.*/shards_b/shard-0000[0-9].h5\) were extracted from another target \(.*/model_b\) than --model .*: the weights differ" "$last" \
  || fail "eval did not warn about the shards' other target"
grep -q "the training samples among them" "$last" || fail "eval did not say that --shards alone scores the training samples"
run eval_own_shards 1 eval --model "$model" --draft "$work/run" --prompts "$text" --num-prompts 2 \
  --max-new-tokens 8 --num-draft-tokens 2 --ttt-steps 1 --shards "$work/shards_a" --output "$work/eval_sa.json" \
  || fail "eval on shards_a"
! grep -q "were extracted from another target" "$last" || fail "eval warned about its own target's shards"
echo "6c. eval warns about teacher-forced shards of another target"
# More prompts asked for than the file holds: a warning with both counts (it evaluated fewer silently).
head -c 2000 "$text" | awk 'BEGIN{RS=""} NR<=2{print; print ""}' >"$work/two_prompts.txt"
run eval_few_prompts 1 eval --model "$model" --draft "$work/run" --prompts "$work/two_prompts.txt" --num-prompts 5 \
  --max-new-tokens 4 --num-draft-tokens 2 --ttt-steps 1 --output "$work/eval_few.json" || fail "eval of two prompts"
grep -q "num-prompts 5 but .*two_prompts.txt holds 2 prompt(s)" "$last" || fail "eval did not warn about too few prompts"
echo "6d. eval warns when the prompt file holds fewer prompts than --num-prompts"
fi
echo PASS
