#!/usr/bin/env bash
# TensorBoard reads what `aerie train` writes (io/event_file.h, docs/formats.md): a 24-step run on 2 ranks
# (log every 4, checkpoints every 8), then its checkpoints past step 8 removed (as if killed after step 8 with
# more logged) and the same command again: it resumes from step 8, drops the later events from the first
# event file and writes a second one. TensorBoard's EventAccumulator over the run folder must then give every
# train/ tag at steps 4, 8, ..., 24 once and heldout/tau_sim at 8, 16, 24, with the values of metrics.jsonl
# and heldout.jsonl (float32), and both files must carry file_version brain.Event:2.
# usage: tensorboard.sh AERIE MODEL_DIR STORIES_TXT WORK_DIR AERIE_TENSORBOARD(ON|OFF)
# exit 77 (skipped): python3 cannot import tensorboard, aerie was built without protobuf, or no model.
set -euo pipefail
aerie=$1 model=$2 text=$3 work=$4 built=${5:-OFF}
if [ "$built" != ON ]; then
  echo "skipped: aerie was built without protobuf (no TensorBoard event files; apt-get install libprotobuf-dev protobuf-compiler)"
  exit 77
fi
if ! python3 -c "from tensorboard.backend.event_processing import event_accumulator" 2>/dev/null; then
  echo "skipped: python3 ($(command -v python3)) cannot import tensorboard (pip install tensorboard to run this test)"
  exit 77
fi
source "$(dirname "$0")/aerie_script_lib.sh"  # run, refused, fail; the empty work folder

run prepare 1 prepare --input "$text" --tokenizer "$model" --output "$work/prepared.h5" --max-length 64 --max-samples 40 \
  || fail prepare
run extract 2 extract --model "$model" --prepared "$work/prepared.h5" --output "$work/shards" --samples-per-shard 20 \
  || fail extract
run vocab 1 vocab --prepared "$work/prepared.h5" --model "$model" --output "$work/vocab.safetensors" --draft-vocab-size 200 \
  || fail vocab
r="$work/run"
train=(train --model "$model" --shards "$work/shards" --vocab "$work/vocab.safetensors" --output "$r" --steps 24
       --batch-size 4 --lr 3e-3 --checkpoint-every 8 --log-every 4 --eval-fraction 0.2 --heldout-samples 6 --ttt-steps 3)
run train 2 "${train[@]}" || fail train
grep -q "TensorBoard events in $r/events.out.tfevents." "$last" || fail "train did not name its event file"
cp "$r/metrics.jsonl" "$work/metrics_a.jsonl"
cp "$r/heldout.jsonl" "$work/heldout_a.jsonl"
rm -rf "$r"/checkpoints/step-00000016 "$r"/checkpoints/step-00000024
sleep 1  # the second event file's name then has a later second (a name taken in the same one gets ".1")
run resume 2 "${train[@]}" || fail "resumed train"
grep -q "resuming from $r/checkpoints/step-00000008" "$last" || fail "the rerun did not resume from step 8"
grep -q "dropped .* TensorBoard event(s) past step 8" "$last" || fail "the rerun did not drop the later events"
[ "$(ls "$r" | grep -c tfevents)" = 2 ] || fail "expected 2 event files, found: $(ls "$r")"

python3 - "$r" "$work/metrics_a.jsonl" "$work/heldout_a.jsonl" <<'PY' || fail "TensorBoard's reading of the run"
import glob, json, os, struct, sys
from tensorboard.backend.event_processing import event_accumulator as ea
run, metrics_a, heldout_a = sys.argv[1:]
acc = ea.EventAccumulator(run, size_guidance={ea.SCALARS: 0})
acc.Reload()
tags = set(acc.Tags()["scalars"])
want = {"train/loss", "train/tau_sim", "train/lr", "train/grad_norm", "train/tokens_per_s", "heldout/tau_sim"}
want |= {f"train/loss_k/{k}" for k in range(3)} | {f"train/acc_k/{k}" for k in range(3)}
want |= {f"heldout/acc_k/{k}" for k in range(3)}
assert tags == want, f"tags {sorted(tags)} != {sorted(want)}"
f32 = lambda x: struct.unpack("f", struct.pack("f", x))[0]
def check(tag, rows, key, index=None):
    got = [(s.step, s.value) for s in acc.Scalars(tag)]
    exp = [(r["step"], f32(r[key] if index is None else r[key][index])) for r in rows]
    assert [s for s, _ in got] == [s for s, _ in exp], f"{tag}: steps {[s for s, _ in got]} != {[s for s, _ in exp]}"
    return got, exp
m = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))]
h = [json.loads(l) for l in open(os.path.join(run, "heldout.jsonl"))]
assert [r["step"] for r in m] == [4, 8, 12, 16, 20, 24], [r["step"] for r in m]
assert [r["step"] for r in h] == [8, 16, 24], [r["step"] for r in h]
for tag, key, idx in [("train/loss", "loss", None), ("train/tau_sim", "tau_sim", None), ("train/lr", "lr", None),
                      ("train/grad_norm", "grad_norm", None), ("train/loss_k/2", "loss_k", 2),
                      ("train/acc_k/0", "acc_k", 0)]:
    got, exp = check(tag, m, key, idx)
    assert all(g == e for (_, g), (_, e) in zip(got, exp)), f"{tag}: values {got} != {exp}"
for tag, key, idx in [("heldout/tau_sim", "tau_sim", None), ("heldout/acc_k/1", "acc_k", 1)]:
    got, exp = check(tag, h, key, idx)
    assert all(g == e for (_, g), (_, e) in zip(got, exp)), f"{tag}: values {got} != {exp}"
# The resumed run trains as the first did (bitwise resume): its losses equal the first run's.
a = {r["step"]: r for r in map(json.loads, open(metrics_a))}
assert all(a[r["step"]]["loss"] == r["loss"] for r in m), "the resumed losses differ from the first run's"
# Both files begin with file_version brain.Event:2 (TensorBoard's own record reader, CRCs checked).
from tensorboard.backend.event_processing import event_file_loader
files = sorted(glob.glob(os.path.join(run, "events.out.tfevents.*")))
for f in files:
    first = next(iter(event_file_loader.EventFileLoader(f).Load()))
    assert first.file_version == "brain.Event:2", (f, first.file_version)
steps = [[e.step for e in event_file_loader.EventFileLoader(f).Load() if e.HasField("summary")] for f in files]
assert max(steps[0]) == 8 and min(steps[1]) == 12, steps
print("tensorboard: tags", len(tags), "steps", [s.step for s in acc.Scalars("train/loss")], "files", steps)
PY
echo "PASS: TensorBoard reads the run: one curve per tag across the resumed run's two event files"
