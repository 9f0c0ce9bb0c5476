#!/usr/bin/env bash
# Moving a run to another number of GPUs.
# extract: a shard folder half done by 2 ranks (tp 1) is finished by 4 ranks with tp 2 and by 1 rank; the
# shards written by the resumed run equal (cmp) those of an uninterrupted run with the same tp (a shard's
# bytes depend on tp, through the fp32 order of the tensor-parallel sums, but not on the number of groups).
# train: a checkpoint written by `aerie train` on 2 data-parallel ranks resumes on 1 and on 4 ranks, and
# the run continues where it stopped.
# How "continues" is checked: run A trains 24 steps on 2 ranks (checkpoints every 4, metrics every step);
# runs B1 and B4 start from a copy of A's folder cut back to its step-12 checkpoint and train steps 13-24 on
# 1 and 4 ranks. For every step 13..24, B's metrics must show
#   - the same number of loss tokens as A ("tokens", an integer): the same global samples in each step,
#     none skipped or repeated (the data position is kept in global samples);
#   - the same loss within |b - a| <= 1e-4 |a| + 1e-5: another dp sums the per-sample gradients in another
#     order (fp32 rounding; trainer.h), which stays far below the step-to-step change of the loss.
# usage: regroup.sh AERIE_BINARY MODEL_DIR STORIES_TXT WORK_DIR   (exit 77: no converted model)
set -euo pipefail
aerie="$1"; model="$2"; text="$3"; work="$4"
[ -f "$model/config.json" ] || { echo "no converted model at $model: skipped"; exit 77; }
rm -rf "$work"; mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS=1
log="$work/log.txt"
fail() { echo "FAIL: $*"; tail -20 "$log"; exit 1; }
run() { local np="$1"; shift; mpirun --oversubscribe -np "$np" "$aerie" "$@" >>"$log" 2>&1 || fail "np $np: aerie $1"; }

run 2 prepare --input "$text" --tokenizer "$model" --output "$work/prepared.h5" --format text --template plain \
  --max-length 160 --overlong truncate --max-samples 96
run 2 extract --model "$model" --prepared "$work/prepared.h5" --output "$work/shards" --samples-per-shard 16
shards() { (cd "$1" && ls | grep -E '^shard-[0-9]+\.h5$'); }
n=$(shards "$work/shards" | wc -l)
[ "$n" -ge 4 ] || fail "expected at least 4 shards, got $n"
run 2 extract --model "$model" --prepared "$work/prepared.h5" --output "$work/shards_tp2" --samples-per-shard 16 --tp 2
for np_tp in "4 2" "1 1"; do
  read -r np tp <<<"$np_tp"
  part="$work/shards_np${np}_tp${tp}"
  mkdir -p "$part"
  for f in $(shards "$work/shards" | head -n $((n / 2))); do cp "$work/shards/$f" "$part/"; done
  run "$np" extract --model "$model" --prepared "$work/prepared.h5" --output "$part" --samples-per-shard 16 --tp "$tp"
  grep "already done" "$log" | tail -1 | grep -q " $((n / 2)) already done" || fail "extract np $np tp $tp did not skip the $((n / 2)) complete shards"
  [ "$(shards "$work/shards")" = "$(shards "$part")" ] || fail "extract np $np tp $tp: shard lists differ"
  ref="$work/shards"; [ "$tp" = 1 ] || ref="$work/shards_tp$tp"
  for f in $(shards "$work/shards" | tail -n +$((n / 2 + 1))); do
    cmp "$ref/$f" "$part/$f" || fail "extract np $np tp $tp: $f differs from the uninterrupted tp $tp run's"
  done
  echo "extract: half of $n shards by 2 ranks (tp 1), finished by $np rank(s) with tp $tp: the rest equal a tp $tp run's"
done
run 1 vocab --prepared "$work/prepared.h5" --model "$model" --output "$work/vocab.safetensors" --draft-vocab-size 256
train() {  # NP OUTPUT
  run "$1" train --model "$model" --shards "$work/shards" --vocab "$work/vocab.safetensors" --output "$2" \
    --steps 24 --batch-size 4 --lr 3e-3 --checkpoint-every 4 --log-every 1 --seed 0
}
train 2 "$work/a"
for np in 1 4; do
  b="$work/b$np"
  cp -r "$work/a" "$b"
  for d in "$b"/checkpoints/step-*; do [ "${d##*step-}" -le 12 ] || rm -rf "$d"; done
  python3 - "$b/metrics.jsonl" <<'PY'
import json, sys
lines = [l for l in open(sys.argv[1]) if l.strip() and json.loads(l)["step"] <= 12]
open(sys.argv[1], "w").writelines(lines)
PY
  train "$np" "$b"
  grep -q "resuming from $b/checkpoints/step-00000012" "$log" || fail "np $np did not resume from step 12"
  python3 - "$work/a/metrics.jsonl" "$b/metrics.jsonl" "$np" <<'PY' || fail "np $np: the run did not continue"
import json, sys
def steps(path):
    return {m["step"]: m for m in map(json.loads, filter(str.strip, open(path)))}  # last entry per step wins
a, b, np = steps(sys.argv[1]), steps(sys.argv[2]), sys.argv[3]
bad = []
for s in range(13, 25):
    if s not in b:
        bad.append(f"step {s} missing"); continue
    if b[s]["tokens"] != a[s]["tokens"]:
        bad.append(f"step {s}: {b[s]['tokens']} tokens, 2 ranks had {a[s]['tokens']}")
    if abs(b[s]["loss"] - a[s]["loss"]) > 1e-4 * abs(a[s]["loss"]) + 1e-5:
        bad.append(f"step {s}: loss {b[s]['loss']:.7f}, 2 ranks had {a[s]['loss']:.7f}")
if bad:
    print("\n".join(bad)); sys.exit(1)
d = max(abs(b[s]["loss"] - a[s]["loss"]) for s in range(13, 25))
print(f"np {np}: steps 13-24 continue the 2-rank run: same tokens per step, max |loss diff| {d:.2e}")
PY
done
echo "PASS: extract finished on 4 ranks (tp 2) and 1 rank, a 2-rank train checkpoint resumed on 1 and 4 ranks"
