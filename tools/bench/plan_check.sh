#!/usr/bin/env bash
# The time plan against the jobs it predicts (docs/time-plan.md, "Checked against real runs"): on one node,
# generate regenerates the answers of a conversation set, then `aerie calibrate` measures the node at the
# lengths generate reported, `aerie plan --calibration --prepared` predicts generate, extract and train (and,
# with NP > TP, the streamed train), and the jobs run; OUT/summary.md puts each prediction beside the time the
# job itself logged (its work, model loading left out, as the plan leaves it out) and the command's wall time.
#
# usage: tools/bench/plan_check.sh MODEL OUT
# Environment:
#   AERIE_BIN      the aerie binary (default build/aerie)        AERIE_DATA   the data folder (../shared/data)
#   DEVICE         cuda (default) or cpu                         NP           ranks of every job (default 1)
#   TP             tensor-parallel ranks of the target (default 1: the ranks data-parallel)
#   INPUT          conversations (default sharegpt-fastchat's dummy_conversation.json), FORMAT (generate
#                  --format, default auto), TEMPLATE (the chat template of generate and prepare; default plain)
#   CONVERSATIONS  conversations generate answers (default 200)  GEN_TOKENS   its --max-new-tokens (128)
#   GEN_BATCH      generate --batch-size and calibrate --gen-batch-size (default 64 on cuda, 16 on cpu)
#   MAX_LENGTH     prepare --max-length (2048)                   DRAFT_VOCAB  vocab --draft-vocab-size (8192)
#   TRAIN_STEPS    train --steps (200)                           BATCH        train --batch-size (16)
#   CAL_ARGS       more calibrate arguments (e.g. --tokens 512,2048 --train-tokens 128,512,2048)
# Every stage skips what exists, except the plan and the summary; delete a stage's output to time it again.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
model="${1:?usage: plan_check.sh MODEL OUT}" out="${2:?usage: plan_check.sh MODEL OUT}"
mkdir -p "$out"; out="$(cd "$out" && pwd)"; model="$(cd "$model" && pwd)"
aerie="${AERIE_BIN:-$root/build/aerie}"; case "$aerie" in /*) ;; *) aerie="$PWD/$aerie" ;; esac
data="${AERIE_DATA:-$root/../shared/data}"
device="${DEVICE:-cuda}" np="${NP:-1}" tp="${TP:-1}" steps="${TRAIN_STEPS:-200}" batch="${BATCH:-16}"
input="${INPUT:-$data/sharegpt-fastchat/dummy_conversation.json}" format="${FORMAT:-auto}"
template="${TEMPLATE:-}"
gen_batch="${GEN_BATCH:-$([ "$device" = cuda ] && echo 64 || echo 16)}"
case "$device" in cuda|cpu) ;; *) echo "plan_check: DEVICE '$device' is not cuda or cpu" >&2; exit 2 ;; esac
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
tmpl=(); [ -n "$template" ] && tmpl=(--template "$template")
log() { echo "plan_check: $(date +%T) $*"; }
# run NAME CMD...: the command's output into OUT/NAME.log, its wall seconds into OUT/NAME.wall
run() {
  local name=$1; shift
  log "$name"
  local t0; t0=$(date +%s.%N)
  "$@" > "$out/$name.log" 2>&1 || { tail -20 "$out/$name.log" >&2; echo "plan_check: $name failed ($out/$name.log)" >&2; exit 1; }
  python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$t0" "$(date +%s.%N)" > "$out/$name.wall"
}
job=(mpirun -np "$np" "$aerie")

[ -f "$out/regen.jsonl" ] || run generate "${job[@]}" generate --model "$model" --device "$device" --input "$input" \
  --format "$format" "${tmpl[@]}" --tp "$tp" --max-conversations "${CONVERSATIONS:-200}" --max-new-tokens "${GEN_TOKENS:-128}" \
  --batch-size "$gen_batch" --output "$out/regen.jsonl"
# generate's own line: "N responses, A new tokens (P prompt tokens) in S s"
read -r responses new_tokens prompt_tokens < <(python3 - "$out/generate.log" <<'PY'
import re, sys
m = re.search(r"(\d+) responses, (\d+) new tokens \((\d+) prompt tokens\) in ([0-9.e+-]+) s", open(sys.argv[1]).read())
if not m: sys.exit("plan_check: no responses line in " + sys.argv[1])
print(m.group(1), m.group(2), m.group(3))
PY
)
gen_prompt=$(python3 -c "print(round($prompt_tokens / $responses, 2))")
gen_new=$(python3 -c "print(round($new_tokens / $responses, 2))")
[ -f "$out/prepared.h5" ] || run prepare "${job[@]}" prepare --input "$out/regen.jsonl" --tokenizer "$model" "${tmpl[@]}" \
  --max-length "${MAX_LENGTH:-2048}" --output "$out/prepared.h5"
# The calibration decodes at generate's batch and at the dataset's mean lengths (docs/time-plan.md, generate).
# shellcheck disable=SC2086
[ -f "$out/calibration.json" ] || run calibrate "${job[@]}" calibrate --model "$model" --device "$device" --tp "$tp" \
  --output "$out/calibration.json" --gen-batch-size "$gen_batch" --gen-prompt-tokens "${gen_prompt%.*}" \
  --gen-new-tokens "${gen_new%.*}" --draft-vocab-size "${DRAFT_VOCAB:-8192}" --work "$out" ${CAL_ARGS:-}
stream=(); [ "$np" -gt "$tp" ] && stream=(--stream-target-ranks "$tp")
run plan "${job[@]}" plan --model "$model" --tp "$tp" --calibration "$out/calibration.json" --prepared "$out/prepared.h5" \
  --train-steps "$steps" --train-batch-size "$batch" --generate-responses "$responses" \
  --generate-prompt-tokens "$gen_prompt" --generate-new-tokens "$gen_new" "${stream[@]}"
[ -d "$out/shards" ] || run extract "${job[@]}" extract --model "$model" --device "$device" --tp "$tp" --prepared "$out/prepared.h5" \
  --output "$out/shards"
[ -f "$out/vocab.safetensors" ] || run vocab "${job[@]}" vocab --model "$model" --prepared "$out/prepared.h5" \
  --output "$out/vocab.safetensors" --draft-vocab-size "${DRAFT_VOCAB:-8192}"
train=(train --model "$model" --device "$device" --vocab "$out/vocab.safetensors" --steps "$steps" --batch-size "$batch"
       --checkpoint-every "$steps")
[ -d "$out/train" ] || run train "${job[@]}" "${train[@]}" --shards "$out/shards" --output "$out/train"
if [ "$np" -gt "$tp" ] && [ ! -d "$out/train_stream" ]; then
  run train_stream "${job[@]}" "${train[@]}" --prepared "$out/prepared.h5" --target-ranks "$tp" --tp "$tp" --output "$out/train_stream"
fi

python3 - "$out" "$np" "$device" <<'PY'
import os, re, sys
out, np_, device = sys.argv[1], sys.argv[2], sys.argv[3]
def text(name):
    p = os.path.join(out, name)
    return open(p).read() if os.path.exists(p) else ""
def seconds(s):  # plan's hours(): "12.3 s", "4.5 min", "1.25 h"
    v, unit = s.split()
    return float(v) * {"s": 1, "min": 60, "h": 3600}[unit]
plan = text("plan.log")
predicted = {}
for line in plan.splitlines():
    m = re.match(r"  (generate|extract|train)\s+([0-9.]+ (?:s|min|h))\s+\((compute|target)", line)
    if m:
        predicted["train_stream" if m.group(3) == "target" else m.group(1)] = seconds(m.group(2))
pats = {"generate": r"responses, \d+ new tokens \(\d+ prompt tokens\) in ([0-9.e+-]+) s",
        "extract": r"tokens in ([0-9.e+-]+) s \(",
        "train": r"done, \d+ steps in ([0-9.e+-]+) s", "train_stream": r"done, \d+ steps in ([0-9.e+-]+) s"}
rows = ["| job | predicted | the job's own time | difference | command wall time |", "| --- | --- | --- | --- | --- |"]
for job in ["generate", "extract", "train", "train_stream"]:
    m = re.search(pats[job], text(job + ".log"))
    if job not in predicted or not m:
        continue
    own = float(m.group(1))
    wall = text(job + ".wall").strip() or "?"
    rows.append(f"| {job} | {predicted[job]:.2f} s | {own:.2f} s | {100 * (predicted[job] / own - 1):+.0f}% | {wall} s |")
header = [l for l in plan.splitlines() if l.startswith("time and disk")]
summary = "\n".join([f"# plan_check: {device}, mpirun -np {np_}", "", *(header[:1]), "", *rows, ""])
open(os.path.join(out, "summary.md"), "w").write(summary)
print(summary)
PY
