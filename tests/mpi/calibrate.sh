#!/usr/bin/env bash
# aerie calibrate and aerie plan --calibration under mpirun -np 2 on the CPU backend: the calibration of a dense
# target (Qwen2's fixture) and of one with two layer kinds (Qwen3-MoE's: a dense layer 0 and MoE layers) holds each
# kind's per-layer times and the other measurements; the plan prints extract's and train's hours and the shards'
# bytes as time_plan.h computes them from that file, with --generate-responses generate and with
# --stream-target-ranks the streaming train; a plan at
# another tp, a streaming split without trainers, a file that is not a calibration and a
# dataset left out are refused by name; --model-tp (one rank of a tp group whose all-reduces are modeled) adds its
# modeled all-reduces to the forward and generate and says so in the file, its summary and the plan. No measured
# timing is asserted (docs/time-plan.md has the checks against real runs).
# usage: calibrate.sh AERIE SOURCE_DIR SCRATCH
set -euo pipefail
aerie="$1" src="$2" out="$3"
rm -rf "$out" && mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OPENBLAS_NUM_THREADS=1
fail() { echo "calibrate.sh: FAIL: $*" >&2; exit 1; }
fast=(--device cpu --tokens 16,48 --train-tokens 16,48 --gen-prompt-tokens 8 --gen-new-tokens 32 --disk-mib 1 --iters 1 --min-time 0.01)
for m in qwen2 qwen3_moe mixtral; do  # mixtral's fixture: 2 layers, below the default aux layers
  mpirun -np 2 "$aerie" calibrate --model "$src/tests/model/fixtures/hf/$m" --output "$out/$m.json" --tp 1 "${fast[@]}" \
    > "$out/$m.log" 2>&1 || { cat "$out/$m.log"; fail "calibrate $m"; }
  grep -q "wrote $out/$m.json" "$out/$m.log" || fail "calibrate $m: no 'wrote' line"
  grep -q "extract's own work beside its forwards and writer" "$out/$m.log" || fail "calibrate $m: no extract line"
  grep -q "extract: done" "$out/$m.log" && fail "calibrate $m: its short extract runs logged their lines"
  ls "$out" | grep -q "^calibrate-" && fail "calibrate $m left its test files in --work: $(ls "$out")"
  grep -q "is past the target's vocabulary" "$out/$m.log" && fail "calibrate $m: warned of the default --draft-vocab-size"
done
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
for m, kinds in [("qwen2", {"dense": 3}), ("qwen3_moe", {"dense": 1, "moe": 2})]:
    c = json.load(open(f"{out}/{m}.json"))
    assert c["format"] == "aerie.calibration" and c["version"] == 1, c
    assert c["world"] == 2 and c["tp"] == 1 and c["device"] == "cpu", c
    got = {l["kind"]: l["count"] for l in c["forward"]["layers"]}
    assert got == kinds, (m, got)
    for l in c["forward"]["layers"]:
        assert l["per_layer"]["tokens"] == [16, 48] and all(s >= 0 for s in l["per_layer"]["seconds"]), l
    assert c["train"]["per_sample"]["tokens"] == [16, 48] and all(s > 0 for s in c["train"]["per_sample"]["seconds"])
    assert c["disk"]["write_bytes_per_s"] > 0 and c["disk"]["writer_per_sample"]["tokens"] == [64, 2048]
    e = c["extract"]  # the short extract runs: what extract's loop costs beside its forwards and writer
    assert e["run_seconds"] >= 0 and e["per_sample_seconds"] >= 0 and e["run_seconds"] + e["per_sample_seconds"] < 10, e
print("calibrate.sh: both calibrations hold their layer kinds")
PY
plan() { mpirun -np 2 "$aerie" plan --model "$src/tests/model/fixtures/hf/qwen3_moe" --gpu-memory 80GiB "$@"; }
plan --tp 1 --calibration "$out/qwen3_moe.json" --samples 1000 --mean-tokens 40 --train-steps 10 --train-batch-size 4 \
  > "$out/plan.log" 2>&1 || { cat "$out/plan.log"; fail "plan --calibration"; }
grep -q "time and disk (calibration $out/qwen3_moe.json: cpu, tp 1; the draft's step at vocabulary [0-9]*, 7 TTT steps, measured in steps of [0-9]*): 1000 samples x 40 tokens, 2 rank(s) (extract in 2 tp group(s), train data parallel over all 2), train 40 samples drawn" \
  "$out/plan.log" || { cat "$out/plan.log"; fail "plan: no time-plan header"; }
[ "$(grep -c '^  extract ' "$out/plan.log")" = 1 ] || fail "plan: extract printed other than once"
# 40 000 tokens of hidden size 64 in bf16, as extract logs them: 40000 x (8 x 64 + 5) bytes, 16 a sample and 64 KiB a
# shard (16 of 64 samples) = 21,744,576 bytes = 20.74 MiB
grep -qE "^  extract .*shards 20\.74 MiB \(bf16\)" "$out/plan.log" || { cat "$out/plan.log"; fail "plan: shard bytes"; }
grep -qE "^  train .*compute-bound" "$out/plan.log" || fail "plan: no train line"
grep -q "the calibration's" "$out/plan.log" && { cat "$out/plan.log"; fail "plan: an extrapolation note within the calibration"; }
# Samples past the calibration's largest length (48 tokens): read along its last segment, and said so.
plan --tp 1 --calibration "$out/qwen3_moe.json" --samples 100 --mean-tokens 100 > "$out/far.log" 2>&1 ||
  { cat "$out/far.log"; fail "plan past the calibration"; }
grep -q "(the samples reach 100 tokens, the calibration's 48: read past it along its last segment; calibrate with --train-tokens up to 100" \
  "$out/far.log" || { cat "$out/far.log"; fail "plan: no extrapolation note"; }
# The streaming train: 1 target rank, 1 trainer; the 2-rank calibration measured the messages and the step alone.
plan --tp 1 --calibration "$out/qwen3_moe.json" --samples 1000 --mean-tokens 40 --train-steps 10 --train-batch-size 4 \
  --stream-target-ranks 1 > "$out/stream.log" 2>&1 || { cat "$out/stream.log"; fail "plan --stream-target-ranks"; }
grep -q "streamed instead (train --prepared --target-ranks 1: 1 target replica(s), 1 trainer rank(s))" "$out/stream.log" &&
  grep -qE "^  train .*(target|draft|messages)-bound\)  no shards" "$out/stream.log" || { cat "$out/stream.log"; fail "plan: no streaming line"; }
python3 - "$out/qwen3_moe.json" <<'PY' || fail "calibration: the streaming fields"
import json, sys
c = json.load(open(sys.argv[1]))
assert c["stream"]["bytes_per_s"] > 0, c["stream"]
assert c["train"]["per_sample_alone"]["tokens"] == [16, 48] and c["train"]["step_seconds"] >= 0, c["train"]
assert 2 <= c["train"]["draft_vocab_size"] <= 32000, c["train"]  # min(32000, V)
assert c["train"]["batch_size"] == 8, c["train"]  # calibrate --train-batch-size's default, train --batch-size's
assert c["host"]["cpu_cores"] >= 1, c  # the fewest cores a rank could run on (mpirun -np 2 binds each to one)
PY
# generate: its line before extract's, counted in the total.
plan --tp 1 --calibration "$out/qwen3_moe.json" --samples 100 --mean-tokens 40 --generate-responses 100 \
  --generate-prompt-tokens 20 --generate-new-tokens 20 > "$out/gen.log" 2>&1 || { cat "$out/gen.log"; fail "plan --generate-responses"; }
grep -qE "^  generate .*compute-bound" "$out/gen.log" && grep -q "(generate + extract + train;" "$out/gen.log" &&
  grep -q "(generate and extract in 2 tp group(s)" "$out/gen.log" ||
  { cat "$out/gen.log"; fail "plan: no generate line"; }
python3 -c "import json,sys; g=json.load(open(sys.argv[1]))['generate']; assert g['seconds'] > 0 and g['batch'] == 16, g" \
  "$out/qwen3_moe.json" || fail "calibration: no generate measurement"
# --tp-overlap: the forward measured as two micro-batches at tp 2, recorded, and named in the plan's header.
mpirun -np 2 "$aerie" calibrate --model "$src/tests/model/fixtures/hf/qwen3_moe" --output "$out/overlap.json" --tp 2 \
  --tp-overlap "${fast[@]}" > "$out/overlap.log" 2>&1 || { cat "$out/overlap.log"; fail "calibrate --tp-overlap"; }
python3 -c "import json,sys; assert json.load(open(sys.argv[1]))['forward']['tp_overlap'] is True" "$out/overlap.json" ||
  fail "calibrate --tp-overlap: forward.tp_overlap is not true"
grep -q "layer kinds; --tp-overlap: two micro-batches of T/2" "$out/overlap.log" || { cat "$out/overlap.log"; fail "calibrate: no overlap in its summary"; }
plan --tp 2 --calibration "$out/overlap.json" --samples 100 --mean-tokens 40 > "$out/overlap_plan.log" 2>&1 ||
  { cat "$out/overlap_plan.log"; fail "plan of the overlap calibration"; }
grep -q "cpu, tp 2 with --tp-overlap;" "$out/overlap_plan.log" || { cat "$out/overlap_plan.log"; fail "plan: the overlap not named"; }
# On the CPU extract --tp-overlap batches samples up to --batch-tokens (2048) as a GPU does: the plan reads those forwards.
grep -q "(the packed forwards reach 2048 tokens" "$out/overlap_plan.log" || { cat "$out/overlap_plan.log"; fail "plan: CPU overlap forwards"; }
# 3 ranks, a target replica of tp 2 and one trainer: train runs it, so the plan plans it (the streamed train alone).
plan --tp 2 --calibration "$out/overlap.json" --samples 100 --mean-tokens 40 --world 3 --stream-target-ranks 2 \
  > "$out/stream3.log" 2>&1 || { cat "$out/stream3.log"; fail "plan of a streamed train on 3 ranks at tp 2"; }
grep -q "3 rank(s) (not tp groups of 2: the streamed train alone)" "$out/stream3.log" &&
  grep -qE "^  streamed \(train --prepared --target-ranks 2" "$out/stream3.log" && ! grep -q "^  extract " "$out/stream3.log" ||
  { cat "$out/stream3.log"; fail "plan: the streamed train alone"; }
# A layout that does not fit gets no time plan (a new user read one as the plan of a run that cannot start).
mpirun -np 2 "$aerie" plan --model "$src/tests/model/fixtures/hf/qwen3_moe" --gpu-memory 1GiB --reserve 2GiB --tp 1 \
  --calibration "$out/qwen3_moe.json" --samples 100 --mean-tokens 40 > "$out/nofit.log" 2>&1 && fail "1 GiB less a 2 GiB reserve fits"
grep -q "nothing fits: --reserve 2.00 GiB (CUDA, NCCL and cuBLAS's own memory) alone is the GPU's 1.00 GiB or more" \
  "$out/nofit.log" || { cat "$out/nofit.log"; fail "plan: the reserve past the GPU's memory not named"; }
grep -q "time and disk: not planned, as this layout does not fit (above)" "$out/nofit.log" &&
  ! grep -q "^  extract " "$out/nofit.log" || { cat "$out/nofit.log"; fail "plan: a time plan for a layout that does not fit"; }
err() { grep -q -e "$1" "$out/err.log" || { cat "$out/err.log"; fail "$2"; }; }
plan --tp 1 --calibration "$out/qwen3_moe.json" --samples 10 --mean-tokens 40 --generate-new-tokens 20 > "$out/err.log" 2>&1 &&
  fail "generate tokens without responses accepted"
err "give --generate-responses too" "generate options"
plan --tp 1 --calibration "$out/qwen3_moe.json" --samples 10 --mean-tokens 40 --stream-target-ranks 2 > "$out/err.log" 2>&1 &&
  fail "a streaming split without trainers accepted"
err "must be a multiple of tp 1 and leave trainer ranks among the 2" "streaming split"
plan --calibration "$out/qwen3_moe.json" --samples 10 --mean-tokens 40 --tp 2 > "$out/err.log" 2>&1 && fail "tp 2 accepted"
err "measured the forward at tp 1, the plan is for tp 2: plan with --tp 1, or calibrate with --tp 2" "tp mismatch"
grep -q "^aerie plan: qwen" "$out/err.log" && { cat "$out/err.log"; fail "the memory plan printed before a refused calibration"; }
# No --tp: the calibration's tp 1 on 2 ranks (not the world size, which its forward was not measured at).
plan --calibration "$out/qwen3_moe.json" --samples 10 --mean-tokens 40 > "$out/notp.log" 2>&1 ||
  { cat "$out/notp.log"; fail "plan without --tp"; }
grep -q "note: tp 1: the calibration's (no --tp given)" "$out/notp.log" || { cat "$out/notp.log"; fail "plan: the calibration's tp"; }
mpirun -np 2 "$aerie" plan --model "$src/tests/model/fixtures/hf/qwen2" --gpu-memory 80GiB --tp 1 \
  --calibration "$out/qwen3_moe.json" --samples 10 --mean-tokens 40 > "$out/err.log" 2>&1 && fail "another target's calibration accepted"
err "measured .*qwen3_moe/config.json (hidden 64, 1 dense and 2 MoE layers), not this target (hidden 64, 3 dense and 0 MoE layers)" "another target"
plan --tp 1 --calibration "$out/qwen3_moe.json" --samples 10 --mean-tokens inf > "$out/err.log" 2>&1 && fail "inf tokens accepted"
err "--mean-tokens inf is not 1 to 10^7" "mean tokens inf"
echo '{"format": "aerie.prepared"}' > "$out/other.json"
plan --tp 1 --calibration "$out/other.json" --samples 10 --mean-tokens 40 > "$out/err.log" 2>&1 && fail "a non-calibration accepted"
err "$out/other.json: not an aerie calibration" "not a calibration"
plan --tp 1 --calibration "$out/qwen3_moe.json" > "$out/err.log" 2>&1 && fail "no dataset accepted"
err "needs the dataset: --prepared FILE, or --samples and --mean-tokens" "no dataset"
plan --tp 1 --calibration "$out/qwen3_moe.json" --samples 10 --mean-tokens 1e6 > "$out/err.log" 2>&1 && fail "1e6 tokens accepted"
err "aerie plan: --mean-tokens 1e+06 is past the model's max_position_embeddings" "--mean-tokens past the context"
plan --tp 1 --calibration "" --samples 10 --mean-tokens 40 > "$out/err.log" 2>&1 && fail "an empty --calibration accepted"
err "aerie plan: --calibration is empty" "empty --calibration"
mpirun -np 1 "$aerie" calibrate --model "$src/tests/model/fixtures/hf/qwen3_moe" --output "$out/inf.json" --tp 1 \
  "${fast[@]:0:${#fast[@]}-2}" --min-time inf \
  > "$out/err.log" 2>&1 && fail "--min-time inf accepted"
err "aerie calibrate: --min-time must be a number of seconds in \[0, 60\]" "--min-time inf"
[ -e "$out/inf.json" ] && fail "a refused calibrate wrote its output"
# --model-tp: one rank plays rank 0 of a tp group of 2 whose all-reduces are modeled (10 ms each here, so that the
# forward's layers, two all-reduces each, cost at least 20 ms whatever this machine's speed); the file says tp 2 of
# world 1, modeled; the plan at --world 2 says so; the options refused out of place.
mpirun -np 1 "$aerie" calibrate --model "$src/tests/model/fixtures/hf/qwen3_moe" --output "$out/modeled.json" \
  --model-tp 2 --model-tp-bus-gbps 40 --model-tp-latency-us 10000 --draft-vocab-size 99999 "${fast[@]}" \
  > "$out/modeled.log" 2>&1 || { cat "$out/modeled.log"; fail "calibrate --model-tp"; }
grep -q "calibrate: --draft-vocab-size 99999 is past the target's vocabulary" "$out/modeled.log" ||
  { cat "$out/modeled.log"; fail "calibrate: a given --draft-vocab-size past the vocabulary not warned of"; }
grep -q "tp all-reduce: modeled, not measured (--model-tp 2: one rank of the group ran here): 40.00 GB/s bus bandwidth, 10000.0 us each" \
  "$out/modeled.log" || { cat "$out/modeled.log"; fail "calibrate --model-tp: no modeled line"; }
python3 - "$out/modeled.json" <<'PY' || fail "calibrate --model-tp: the file"
import json, sys
c = json.load(open(sys.argv[1]))
assert c["tp"] == 2 and c["world"] == 1, c
a = c["allreduce"]
assert a["modeled"] is True and a["bus_bytes_per_s"] == 40e9 and abs(a["latency_s"] - 0.01) < 1e-12, a
for l in c["forward"]["layers"]:
    assert all(s >= 0.019 for s in l["per_layer"]["seconds"]), l  # two modeled all-reduces of 10 ms a layer, less noise
g = c["generate"]  # each decoding step of 3 layers pays 6 modeled all-reduces
assert g["seconds"] >= g["new_tokens"] * 3 * 2 * 0.01 * 0.9, g
PY
plan --calibration "$out/modeled.json" --world 2 --samples 100 --mean-tokens 40 > "$out/modeled_plan.log" 2>&1 ||
  { cat "$out/modeled_plan.log"; fail "plan of a --model-tp calibration"; }
grep -q "(the calibration ran one rank of each tp group of 2 on cpu and modeled the group's all-reduces at 40.0 GB/s" \
  "$out/modeled_plan.log" && grep -q "^  extract " "$out/modeled_plan.log" ||
  { cat "$out/modeled_plan.log"; fail "plan: the modeled tp not said"; }
# No --world: the modeled group's 2 ranks (plan runs on 1); a plan with --expert-parallel of this calibration without it
# says so; a plan at another tp names --model-tp.
mpirun -np 1 "$aerie" plan --model "$src/tests/model/fixtures/hf/qwen3_moe" --gpu-memory 80GiB --calibration "$out/modeled.json" \
  --samples 100 --mean-tokens 40 --expert-parallel > "$out/modeled_plan1.log" 2>&1 || { cat "$out/modeled_plan1.log"; fail "plan -np 1"; }
grep -q "2 rank(s) (extract in 1 tp group(s)" "$out/modeled_plan1.log" &&
  grep -q "(the calibration's forward ran without --expert-parallel, this plan is for a run with it" "$out/modeled_plan1.log" ||
  { cat "$out/modeled_plan1.log"; fail "plan of a modeled calibration: world or expert-parallel note"; }
plan --calibration "$out/modeled.json" --tp 1 --samples 100 --mean-tokens 40 > "$out/err.log" 2>&1 && fail "tp 1 of a tp-2 model accepted"
err "modeled the forward at tp 2, the plan is for tp 1: plan with --tp 2, or calibrate with --model-tp 1" "modeled tp mismatch"
mpirun -np 1 "$aerie" calibrate --model "$src/tests/model/fixtures/hf/qwen3_moe" --output "$out/m2.json" --model-tp 3 \
  --model-tp-bus-gbps 40 --model-tp-latency-us 30 "${fast[@]}" > "$out/err.log" 2>&1 && fail "--model-tp 3 of 4 heads accepted"
err "aerie calibrate --model-tp 3: tp 3 does not divide num_attention_heads" "--model-tp the heads do not divide"
mpirun -np 1 "$aerie" calibrate --model "$src/tests/model/fixtures/hf/qwen3_moe" --output "$out/m2.json" --model-tp 2 \
  --model-tp-bus-gbps 40e9 --model-tp-latency-us 30 "${fast[@]}" > "$out/err.log" 2>&1 && fail "40e9 GB/s accepted"
err "aerie calibrate: --model-tp-bus-gbps 4e+10 is not a bus bandwidth in GB/s" "a unit slip"
mpirun -np 1 "$aerie" calibrate --model "$src/tests/model/fixtures/hf/qwen3_moe" --output "$out/m2.json" --model-tp 2 \
  "${fast[@]}" > "$out/err.log" 2>&1 && fail "--model-tp without the link accepted"
err "aerie calibrate: --model-tp needs --model-tp-bus-gbps (> 0, GB/s) and --model-tp-latency-us" "--model-tp alone"
mpirun -np 1 "$aerie" calibrate --model "$src/tests/model/fixtures/hf/qwen3_moe" --output "$out/m2.json" \
  --model-tp-bus-gbps 40 "${fast[@]}" > "$out/err.log" 2>&1 && fail "--model-tp-bus-gbps without --model-tp accepted"
err "go with --model-tp N" "link without --model-tp"
mpirun -np 2 "$aerie" calibrate --model "$src/tests/model/fixtures/hf/qwen3_moe" --output "$out/m2.json" --tp 2 \
  --model-tp 4 --model-tp-bus-gbps 40 --model-tp-latency-us 20 "${fast[@]}" > "$out/err.log" 2>&1 && fail "--model-tp at --tp 2 accepted"
err "it takes --tp 1 (or no --tp), not --tp 2" "--model-tp with --tp 2"
[ -e "$out/m2.json" ] && fail "a refused calibrate --model-tp wrote its output"
# A latency given in seconds (a unit slip, as the bandwidth's above) is refused.
mpirun -np 1 "$aerie" calibrate --model "$src/tests/model/fixtures/hf/qwen3_moe" --output "$out/m2.json" --model-tp 2 \
  --model-tp-bus-gbps 40 --model-tp-latency-us 0.00003 "${fast[@]}" > "$out/err.log" 2>&1 && fail "latency 0.00003 us accepted"
err "aerie calibrate: --model-tp-latency-us 3e-05 is not a latency in microseconds" "a latency unit slip"
# A folder as --calibration or --prepared is named as one; a calibration whose draft vocabulary is past this
# target's vocabulary is another model's.
plan --calibration "$out" --samples 10 --mean-tokens 40 > "$out/err.log" 2>&1 && fail "a folder as --calibration accepted"
err "aerie plan: --calibration $out is a folder, not the calibration.json of aerie calibrate" "--calibration folder"
plan --calibration "$out/qwen3_moe.json" --prepared "$out" > "$out/err.log" 2>&1 && fail "a folder as --prepared accepted"
err "aerie plan: --prepared $out is a folder" "--prepared folder"
python3 - "$out/qwen3_moe.json" "$out/other_vocab.json" <<'PY' || fail "other_vocab.json"
import json, sys
c = json.load(open(sys.argv[1])); c["train"]["draft_vocab_size"] = 10**7; json.dump(c, open(sys.argv[2], "w"))
PY
plan --tp 1 --calibration "$out/other_vocab.json" --samples 10 --mean-tokens 40 > "$out/err.log" 2>&1 && fail "other vocabulary accepted"
err "measured the draft's step at a draft vocabulary of 10000000, past this target's vocabulary" "another model's vocabulary"
# The calibration records what of the target its times depend on; a plan of a target that differs there is refused.
python3 - "$out/qwen3_moe.json" "$out/other_target.json" <<'PY' || fail "other_target.json"
import json, sys
c = json.load(open(sys.argv[1]))
assert c["target"]["fingerprint"].startswith("vocab "), c["target"]
c["target"]["fingerprint"] = c["target"]["fingerprint"].replace("vocab ", "vocab 9", 1); json.dump(c, open(sys.argv[2], "w"))
PY
plan --tp 1 --calibration "$out/other_target.json" --samples 10 --mean-tokens 40 > "$out/err.log" 2>&1 && fail "another target accepted"
err "other_target.json measured a target of vocab 9[0-9]*, .*; this one is of vocab [0-9]*, .*: calibrate this model" "another target's fingerprint"
# The tp-2 calibration read by a plan of one rank: the calibration's tp group is the world (no --world needed).
mpirun -np 1 "$aerie" plan --model "$src/tests/model/fixtures/hf/qwen3_moe" --gpu-memory 80GiB --tp 2 \
  --calibration "$out/overlap.json" --samples 100 --mean-tokens 40 > "$out/tp2_plan1.log" 2>&1 ||
  { cat "$out/tp2_plan1.log"; fail "plan -np 1 of a tp-2 calibration"; }
grep -q "2 rank(s) (extract in 1 tp group(s)" "$out/tp2_plan1.log" || { cat "$out/tp2_plan1.log"; fail "tp-2 plan: world"; }
# A colocated streamed train counts its devices: --world 4 --stream-target-ranks 2 --stream-colocated is 2 devices, on
# which generate, extract and the offline train run.
plan --tp 1 --calibration "$out/qwen3_moe.json" --samples 100 --mean-tokens 40 --world 4 --stream-target-ranks 2 \
  --stream-colocated --gpu-hour-cost 1 > "$out/coloc.log" 2>&1 || { cat "$out/coloc.log"; fail "colocated plan"; }
grep -q "4 rank(s) (extract in 2 tp group(s), train data parallel over all 2; 2 devices, the streamed train's ranks two a device)" \
  "$out/coloc.log" && grep -q "^  extract .*(2 ranks at --gpu-hour-cost 1)" "$out/coloc.log" ||
  { cat "$out/coloc.log"; fail "colocated plan: devices"; }
echo "calibrate.sh: ok"
