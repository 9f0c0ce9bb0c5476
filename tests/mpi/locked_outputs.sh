#!/usr/bin/env bash
# Every job that writes an output locks it, and writes it through a temporary file of its own (issue 46:
# two concurrent vocab jobs shared OUTPUT.tmp and one reporting success left the other's file; two evals into
# one eval.json both exited 0, the last writer winning):
#  1. vocab and eval into an output whose lock a live process holds are refused, naming the holder and the
#     lock file, before any work (no output written, no MPI_Abort);
#  2. vocab and generate leave another writer's OUTPUT.tmp alone: they write a temporary file named by their
#     host and pid and rename it over OUTPUT.
# usage: locked_outputs.sh AERIE MODEL_DIR STORIES_TXT WORK_DIR   (exit 77: no converted model)
set -euo pipefail
aerie=$1 model=$2 text=$3 work=$4
source "$(dirname "$0")/aerie_script_lib.sh"  # run, refused, fail; the empty work folder
host=$(hostname)

run prepare 1 prepare --input "$text" --tokenizer "$model" --output "$work/prepared.h5" --max-length 64 \
  --max-samples 16 || fail prepare
mkdir -p "$work/fake_export"
: >"$work/fake_export/config.json"
: >"$work/fake_export/model.safetensors"
printf 'Once upon a time there was a cat. What did the cat do next?\n' >"$work/prompts.txt"

# 1. a held lock: a record naming a live job (this host, pid 4321) and a process holding its flock
held() {  # JOB OUT LOG ARGS...: JOB into OUT, whose lock is held, is refused naming the holder and the lock
  local job=$1 out=$2 log=$3; shift 3
  echo "{\"format\": \"aerie.output_lock\", \"job\": \"$job\", \"host\": \"$host\", \"pid\": 4321, \"slurm_job_id\": \"99\", \"started\": \"2025-01-01 00:00:00 UTC\"}" \
    >"$out.lock"
  flock "$out.lock" sleep 60 &
  local holder=$!
  trap 'kill $(pgrep -P '"$holder"') '"$holder"' 2>/dev/null || true' EXIT  # also when the check fails
  for _ in $(seq 100); do flock -n "$out.lock" true 2>/dev/null || break; sleep 0.05; done
  local rc=0
  refused "$log" "$job: --output $out is in use by another job: aerie $job on host $host, pid 4321, Slurm job 99.* holds the lock $out.lock" \
    "$@" || rc=$?
  kill $(pgrep -P "$holder") "$holder" 2>/dev/null || true
  wait "$holder" 2>/dev/null || true
  trap - EXIT
  [ "$rc" -eq 0 ] || exit "$rc"
  grep -q MPI_ABORT "$last" && fail "$log: the refusal went through MPI_Abort"
  [ ! -e "$out" ] || fail "$log: $out was written"
  rm -f "$out.lock"
}
held vocab "$work/vocab.safetensors" vocab_held 2 vocab --prepared "$work/prepared.h5" --model "$model" \
  --draft-vocab-size 64 --output "$work/vocab.safetensors"
held eval "$work/ev.json" eval_held 2 eval --model "$model" --draft "$work/fake_export" --prompts "$work/prompts.txt" \
  --output "$work/ev.json"
echo "1. vocab and eval refuse an output whose lock another job holds, naming it"

# 2. another writer's OUTPUT.tmp is not this job's temporary file
echo "another writer" >"$work/vocab.safetensors.tmp"
run vocab 2 vocab --prepared "$work/prepared.h5" --model "$model" --draft-vocab-size 64 \
  --output "$work/vocab.safetensors" || fail "vocab"
[ "$(cat "$work/vocab.safetensors.tmp" 2>/dev/null)" = "another writer" ] || fail "vocab wrote into vocab.safetensors.tmp"
python3 -c "import json,struct,sys; b=open(sys.argv[1],'rb').read(); json.loads(b[8:8+struct.unpack('<Q',b[:8])[0]])['d2t']" \
  "$work/vocab.safetensors" || fail "vocab.safetensors is not the draft vocabulary"
printf '%s\n' '{"conversations": [{"from": "human", "value": "Tom had a red ball."}]}' \
  '{"conversations": [{"from": "human", "value": "The sun was hot."}]}' >"$work/convs.jsonl"
echo "another writer" >"$work/regen.jsonl.tmp"
run generate 2 generate --model "$model" --input "$work/convs.jsonl" --output "$work/regen.jsonl" --max-new-tokens 8 \
  || fail "generate"
[ "$(cat "$work/regen.jsonl.tmp" 2>/dev/null)" = "another writer" ] || fail "generate wrote into regen.jsonl.tmp"
[ "$(wc -l <"$work/regen.jsonl")" -eq 2 ] || fail "regen.jsonl does not hold the 2 conversations"
leftover=$(ls "$work" | grep -E "\.$host\.[0-9]+\.tmp$" || true)
[ -z "$leftover" ] || fail "temporary files left: $leftover"
echo "2. vocab and generate write through temporary files of their own"
echo PASS
