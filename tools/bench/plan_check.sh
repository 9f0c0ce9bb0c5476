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
#   MPIRUN_ARGS    mpirun options of every job (default "--bind-to none" on cuda: mpirun binds each of -np 1 or 2
#                  ranks to one core, where a GPU rank's shard reader and writer threads take turns with its kernel
#                  launches; empty on cpu)
#   CAL_ARGS       more calibrate arguments (e.g. --tokens 512,2048 --train-tokens 128,512,2048); one of the script's
#                  own (--gen-batch-size, --gen-prompt-tokens, --gen-new-tokens, --draft-vocab-size,
#                  --train-batch-size) given here
#                  replaces it
# A stage is done when it succeeded with the same command line (OUT/STAGE.done holds it); a rerun skips done
# stages and runs the rest, and every stage after one that ran, from scratch (its output removed first: a job's time
# is a whole run's, not a resumed one's). Delete OUT/STAGE.done to time a stage again.
set -euo pipefail
usage() { echo "usage: tools/bench/plan_check.sh MODEL OUT   (environment: see the header)" >&2; exit 2; }
[ $# -eq 2 ] || usage
root="$(cd "$(dirname "$0")/../.." && pwd)"
model="$1" out="$2"
[ -f "$model/config.json" ] || { echo "plan_check: $model/config.json: no such file (MODEL is a model folder)" >&2; exit 2; }
aerie="${AERIE_BIN:-$root/build/aerie}"; case "$aerie" in /*) ;; *) aerie="$PWD/$aerie" ;; esac
[ -x "$aerie" ] || { echo "plan_check: $aerie is not an executable (AERIE_BIN)" >&2; exit 2; }
data="${AERIE_DATA:-$root/../shared/data}"
device="${DEVICE:-cuda}" np="${NP:-1}" tp="${TP:-1}" steps="${TRAIN_STEPS:-200}" batch="${BATCH:-16}"
input="${INPUT:-$data/sharegpt-fastchat/dummy_conversation.json}" format="${FORMAT:-auto}"
template="${TEMPLATE:-}" gen_tokens="${GEN_TOKENS:-128}"
gen_batch="${GEN_BATCH:-$([ "$device" = cuda ] && echo 64 || echo 16)}"
case "$device" in cuda|cpu) ;; *) echo "plan_check: DEVICE '$device' is not cuda or cpu" >&2; exit 2 ;; esac
int() { [[ "$2" =~ ^[0-9]+$ ]] && [ "$2" -ge "$3" ] || { echo "plan_check: $1 '$2' is not an integer >= $3" >&2; exit 2; }; }
int NP "$np" 1; int TP "$tp" 1; int GEN_TOKENS "$gen_tokens" 2; int TRAIN_STEPS "$steps" 1; int BATCH "$batch" 1
[ $((np % tp)) -eq 0 ] || { echo "plan_check: TP $tp does not divide NP $np" >&2; exit 2; }
mkdir -p "$out"; out="$(cd "$out" && pwd)"; model="$(cd "$model" && pwd)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
tmpl=(); [ -n "$template" ] && tmpl=(--template "$template")
log() { echo "plan_check: $(date +%T) $*"; }
ran=0  # a stage ran: every later one runs again
# stage NAME OUTPUT CMD...: skipped when OUT/NAME.done holds this command line and OUTPUT exists (and no earlier
# stage ran); else OUTPUT (and generate's .parts) removed, the command run, its output into OUT/NAME.log, its wall
# seconds into OUT/NAME.wall, and OUT/NAME.done written once it succeeded. A failure exits with the job's status.
stage() {
  local name=$1 output=$2; shift 2
  local line; line="$(printf '%q ' "$@")"
  if [ "$ran" = 0 ] && [ -e "$output" ] && [ "$(cat "$out/$name.done" 2>/dev/null)" = "$line" ]; then
    log "$name: done before, skipped"; return 0
  fi
  ran=1
  rm -rf "$out/$name.done" "$out/$name.wall" "$output" "$output.parts"
  log "$name"
  local t0 rc=0; t0=$(date +%s.%N)
  "$@" > "$out/$name.log" 2>&1 || rc=$?
  if [ "$rc" != 0 ]; then
    tail -20 "$out/$name.log" >&2; echo "plan_check: $name failed with status $rc ($out/$name.log)" >&2; exit "$rc"
  fi
  python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$t0" "$(date +%s.%N)" > "$out/$name.wall"
  printf '%s' "$line" > "$out/$name.done"
}
read -r -a mpirun_args <<< "${MPIRUN_ARGS-$([ "$device" = cuda ] && echo --bind-to none)}"
job=(mpirun "${mpirun_args[@]}" -np "$np" "$aerie")

stage generate "$out/regen.jsonl" "${job[@]}" generate --model "$model" --device "$device" --input "$input" \
  --format "$format" "${tmpl[@]}" --tp "$tp" --max-conversations "${CONVERSATIONS:-200}" --max-new-tokens "$gen_tokens" \
  --batch-size "$gen_batch" --output "$out/regen.jsonl"
# generate's own line: "N responses, A new tokens (P prompt tokens) in S s"
read -r responses gen_prompt gen_new < <(python3 - "$out/generate.log" <<'PY'
import re, sys
m = re.search(r"(\d+) responses, (\d+) new tokens \((\d+) prompt tokens\) in ([0-9.e+-]+) s", open(sys.argv[1]).read())
if not m or int(m.group(1)) == 0:
    sys.exit("plan_check: generate answered nothing (" + sys.argv[1] + ")")
n = int(m.group(1))
print(n, round(int(m.group(3)) / n, 2), round(int(m.group(2)) / n, 2))
PY
)
stage prepare "$out/prepared.h5" "${job[@]}" prepare --input "$out/regen.jsonl" --tokenizer "$model" "${tmpl[@]}" \
  --max-length "${MAX_LENGTH:-2048}" --output "$out/prepared.h5"
# The calibration decodes at generate's batch and at the dataset's mean lengths (docs/time-plan.md, generate), and
# steps the draft over train's batch, each unless CAL_ARGS sets it.
cal=(--gen-batch-size "$gen_batch" --gen-prompt-tokens "$(python3 -c "print(max(1, round($gen_prompt)))")"
     --gen-new-tokens "$(python3 -c "print(max(2, round($gen_new)))")" --draft-vocab-size "${DRAFT_VOCAB:-8192}"
     --train-batch-size "$((batch < 2 ? 2 : batch))")
# The draft's step measured at the dataset's mean sample (prompt + answer) too where that is below calibrate's smallest
# default length (a GPU's short steps are launch-bound: the curve read below its first point is the least sure).
mean_len=$(python3 -c "print(max(2, round($gen_prompt + $gen_new)))")
train_tokens=$([ "$device" = cuda ] && echo 512,2048,4096 || echo 128,512)
[ "$mean_len" -lt "${train_tokens%%,*}" ] && cal+=(--train-tokens "$mean_len,$train_tokens")
read -r -a extra <<< "${CAL_ARGS:-}"
for ((i = 0; i < ${#cal[@]}; i += 2)); do
  for a in "${extra[@]}"; do [ "$a" = "${cal[i]}" ] && cal[i]="" && cal[i + 1]=""; done
done
read -r -a cal <<< "${cal[*]}"
stage calibrate "$out/calibration.json" "${job[@]}" calibrate --model "$model" --device "$device" --tp "$tp" \
  --output "$out/calibration.json" --work "$out" "${cal[@]}" "${extra[@]}"
stream=(); [ "$np" -gt "$tp" ] && stream=(--stream-target-ranks "$tp")
before=$ran ran=1  # the plan always runs (it reads every earlier stage), and reruns nothing after it
stage plan "$out/.plan" "${job[@]}" plan --model "$model" --tp "$tp" --calibration "$out/calibration.json" \
  --prepared "$out/prepared.h5" --max-length "${MAX_LENGTH:-2048}" --train-steps "$steps" --train-batch-size "$batch" \
  --generate-responses "$responses" --generate-prompt-tokens "$gen_prompt" --generate-new-tokens "$gen_new" "${stream[@]}"
ran=$before
stage extract "$out/shards" "${job[@]}" extract --model "$model" --device "$device" --tp "$tp" \
  --prepared "$out/prepared.h5" --output "$out/shards"
stage vocab "$out/vocab.safetensors" "${job[@]}" vocab --model "$model" --prepared "$out/prepared.h5" \
  --output "$out/vocab.safetensors" --draft-vocab-size "${DRAFT_VOCAB:-8192}"
train=(train --model "$model" --device "$device" --vocab "$out/vocab.safetensors" --steps "$steps" --batch-size "$batch"
       --checkpoint-every "$steps")
stage train "$out/train" "${job[@]}" "${train[@]}" --shards "$out/shards" --output "$out/train"
if [ "$np" -gt "$tp" ]; then
  stage train_stream "$out/train_stream" "${job[@]}" "${train[@]}" --prepared "$out/prepared.h5" --target-ranks "$tp" \
    --tp "$tp" --output "$out/train_stream"
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
    diff = f"{100 * (predicted[job] / own - 1):+.0f}%" if own > 0 else "- (too short to time)"
    rows.append(f"| {job} | {predicted[job]:.2f} s | {own:.2f} s | {diff} | {wall} s |")
header = [l for l in plan.splitlines() if l.startswith("time and disk")]
summary = "\n".join([f"# plan_check: {device}, mpirun -np {np_}", "", *(header[:1]), "", *rows, ""])
open(os.path.join(out, "summary.md"), "w").write(summary)
print(summary)
PY
