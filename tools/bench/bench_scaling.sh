#!/usr/bin/env bash
# Multi-GPU runs of issue 6 for a target SHAPE (default Llama-3.3-70B: H 8192, 80 layers, 64 / 8 heads of
# 128, MLP 28672, vocabulary 128256; random bf16 weights), one JSON line per result on stdout, each with
# the exact command(s) it ran (progress and the commands also go to stderr; logs stay in WORK):
#   extract  `aerie extract --random-weights SEED --dtype bf16 --tp TP` under `mpirun -np NP` over SAMPLES
#            prepared samples of SEQ random tokens: tokens/s and hidden-state bytes written per second
#            (the shard files' size / the job's own time), both from the job's "extract: wrote" line (the
#            time after the model is made: forward, device-to-host copies, HDF5 writes), the wall time of
#            the whole command, the peak GPU memory. With NP_B/TP_B set, a second extraction (its own
#            line) and a comparison of the two shard sets (line "extract_compare": max abs difference and
#            relative L2 of aux/final hidden states, ok = relative L2 <= CMP_TOL for both).
#            --random-weights SEED gives every tp size the same model (src/model/weight_source.cc
#            random_weights: each rank draws the full tensors and keeps its shard, since 404cd5a), so
#            WEIGHTS=random runs of different tp compare; WEIGHTS=file instead writes a random checkpoint
#            (tools/bench/make_target_head.py --full: model.safetensors, bf16) that extract loads and slices
#            (the checkpoint loader's tp path; the file is as large as the model).
#   train    `aerie train` on the shards of run a with dp = each of DPS ranks, the same global batch BATCH
#            and STEPS steps: the mean step time (metrics.jsonl with --log-every 1: seconds per step, the
#            first WARM steps left out), per dp a line, then a "train_scaling" line with
#              speedup(dp) = t_ref / t_dp, efficiency(dp) = (dp_ref * t_ref) / (dp * t_dp)
#            (dp_ref, t_ref: the first of DPS, normally 1: efficiency = t1 / (dp * t_dp); the same global batch,
#            so ideal is t_dp = t1 / dp, efficiency 1), and the per-step losses of every dp against dp_ref
#            (equal when the max relative difference is <= LOSS_RTOL). The target's embed_tokens/lm_head
#            come from a random model.safetensors (tools/bench/make_target_head.py; 4.2 GB for 70B).
#   preempt  `aerie train` on PRE_NP_A ranks (checkpoints every PRE_CKPT_EVERY steps) gets SIG$PRE_SIGNAL on
#            its ranks (as Slurm signals a job step's tasks) once a checkpoint is complete; it must stop
#            after the current step with a checkpoint (exit status 3); the same command on PRE_NP_B ranks
#            must resume from that step and finish. The losses of the resumed run are compared with an
#            uninterrupted run of the same options (the train phase's, when STEPS = PRE_STEPS; else one is
#            run when PRE_REF=1).
#
# Usage: tools/bench/bench_scaling.sh [dry] [BUILD_DIR]   (BUILD_DIR default build: BUILD_DIR/aerie)
#   dry (or PRINT_ONLY=1): print the commands, run nothing and create nothing: the commands name the work
#   folder WORK (default /tmp/aerie-bench-scaling.DRY-RUN) and files in it that do not exist.
# Environment (defaults in brackets):
#   shape     HIDDEN [8192] LAYERS [80] HEADS [64] KV_HEADS [8] MLP [28672] VOCAB [128256] HEAD_DIM [128]
#   data      SEQ [2048] SAMPLES [16] SAMPLES_PER_SHARD [4] TOKENIZER [BUILD_DIR/models/stories260K; ids are
#             random below min(512, VOCAB), validated by its 512-token vocabulary]
#   extract   DEVICE [cuda] DTYPE [bf16] NP [2] TP [2] NP_B, TP_B [unset: no second run] WEIGHTS [random|file]
#             SEED [0] AUX_LAYERS [unset: aerie's default 2,N/2,N-3; e.g. 0,1,2 for LAYERS 2]
#             CMP_TOL [1e-2, relative L2; tp 2 vs tp 1 in bf16 measured 1.7e-3 aux / 2.7e-3 final]
#   train     DPS ["1 2"] BATCH [4] STEPS [4] TTT [7] DRAFT_VOCAB [32000] LR [1e-4] WARM [1] LOSS_RTOL [1e-3]
#   preempt   PRE_NP_A [2] PRE_NP_B [1] PRE_STEPS [STEPS] PRE_CKPT_EVERY [2] PRE_SIGNAL [TERM] PRE_REF [1]
#             PRE_WAIT [900: seconds to wait for the first checkpoint] PRE_KEEP [0: keep every checkpoint;
#             N > 0: --keep-checkpoints N (N = 1 after a resume works since 45206ed)]
#   PHASES ["extract train preempt"], WORK [a new /tmp/aerie-bench-scaling.XXXXXX], CLEAN [1: delete the
#   checkpoints of finished runs (17 GB each for a 70B-shaped draft), keep logs and metrics],
#   AERIE [BUILD_DIR/aerie], BENCH_VERBOSE [0: 1 echoes the job logs to stderr].
# Exit status: 0 when every phase ran and its checks held, 1 when a check failed, 2 on a usage error.
# Aux layers: aerie's default 2,N/2,N-3 needs LAYERS >= 3 and ascends from N = 6 on; set AUX_LAYERS for
# fewer layers (e.g. 0,1,2 for LAYERS 2: extract, train and the draft checkpoints then work, since 126b169).
# shellcheck disable=SC2317  # the phase_* functions are called as "phase_$p"
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
BENCH_TAG=bench_scaling
# shellcheck source=tools/bench/common.sh
source "$HERE/common.sh"
bench_mpi_env

PRINT_ONLY=${PRINT_ONLY:-0}
if [ "${1:-}" = dry ]; then PRINT_ONLY=1; shift; fi
BUILD=${1:-build}
HIDDEN=${HIDDEN:-8192}; LAYERS=${LAYERS:-80}; HEADS=${HEADS:-64}; KV_HEADS=${KV_HEADS:-8}
MLP=${MLP:-28672}; VOCAB=${VOCAB:-128256}; HEAD_DIM=${HEAD_DIM:-128}
SEQ=${SEQ:-2048}; SAMPLES=${SAMPLES:-16}; SAMPLES_PER_SHARD=${SAMPLES_PER_SHARD:-4}
DEVICE=${DEVICE:-cuda}; DTYPE=${DTYPE:-bf16}; NP=${NP:-2}; TP=${TP:-2}; NP_B=${NP_B:-}; TP_B=${TP_B:-}
WEIGHTS=${WEIGHTS:-random}; SEED=${SEED:-0}; AUX_LAYERS=${AUX_LAYERS:-}; CMP_TOL=${CMP_TOL:-1e-2}
DPS=${DPS:-"1 2"}; BATCH=${BATCH:-4}; STEPS=${STEPS:-4}; TTT=${TTT:-7}; DRAFT_VOCAB=${DRAFT_VOCAB:-32000}
LR=${LR:-1e-4}; WARM=${WARM:-1}; LOSS_RTOL=${LOSS_RTOL:-1e-3}
PRE_NP_A=${PRE_NP_A:-2}; PRE_NP_B=${PRE_NP_B:-1}; PRE_STEPS=${PRE_STEPS:-$STEPS}; PRE_CKPT_EVERY=${PRE_CKPT_EVERY:-2}; PRE_KEEP=${PRE_KEEP:-0}
PRE_SIGNAL=${PRE_SIGNAL:-TERM}; PRE_REF=${PRE_REF:-1}; PRE_WAIT=${PRE_WAIT:-900}
PHASES=${PHASES:-"extract train preempt"}
CLEAN=${CLEAN:-1}
AERIE=${AERIE:-$BUILD/aerie}
TOKENIZER=${TOKENIZER:-$BUILD/models/stories260K}
if [ "$PRINT_ONLY" = 1 ]; then WORK=${WORK:-/tmp/aerie-bench-scaling.DRY-RUN}; else WORK=${WORK:-$(mktemp -d /tmp/aerie-bench-scaling.XXXXXX)}; fi
MODEL=$WORK/model; PREPARED=$WORK/prepared.h5; VOCAB_FILE=$WORK/draft_vocab.safetensors; SHARDS=$WORK/shards_a
MAX_ID=$(( VOCAB < 512 ? VOCAB : 512 ))

case "$WEIGHTS" in random|file) ;; *) echo "$BENCH_TAG: WEIGHTS=$WEIGHTS is not random or file" >&2; exit 2;; esac
for p in $PHASES; do
  case "$p" in extract|train|preempt) ;; *) echo "$BENCH_TAG: unknown phase '$p' (extract, train, preempt)" >&2; exit 2;; esac
done
if [ "$PRINT_ONLY" != 1 ]; then
  [ -x "$AERIE" ] || { echo "$BENCH_TAG: no $AERIE (build aerie first, or set AERIE)" >&2; exit 2; }
  [ -f "$TOKENIZER/tokenizer.json" ] || { echo "$BENCH_TAG: no $TOKENIZER/tokenizer.json (set TOKENIZER)" >&2; exit 2; }
  mkdir -p "$WORK"
fi
if [ "$PRINT_ONLY" = 1 ]; then
  echo "$BENCH_TAG: dry run: the commands below name the work folder $WORK, which is NOT created (nor are" \
       "the files in it); a real run uses WORK or a new mktemp folder" >&2
else
  echo "$BENCH_TAG: work folder $WORK" >&2
fi
STATUS=0
fail() { echo "$BENCH_TAG: CHECK FAILED: $*" >&2; STATUS=1; }

# One JSON line from key=value arguments: a value that parses as JSON is kept as such (numbers, true,
# objects, arrays), anything else is a string; "+=JSON_OBJECT" merges that object's keys.
emit() {
  python3 - "$@" <<'EOF'
import json, sys
out = {}
for arg in sys.argv[1:]:
    if arg.startswith("+="):
        out.update(json.loads(arg[2:]))
        continue
    k, _, v = arg.partition("=")
    try:
        out[k] = json.loads(v)
    except ValueError:
        out[k] = v
print(json.dumps(out), flush=True)
EOF
}
cmd_str() { local s; printf -v s '%q ' "${BENCH_CMD[@]}"; echo "${s% }"; }
now() { date +%s.%N; }
elapsed() { python3 -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 3))" "$1" "$2"; }
# Runs BENCH_CMD into LOG (dry: prints it). Returns the command's status.
go() {
  if [ "$PRINT_ONLY" = 1 ]; then echo "+ $(cmd_str)"; return 0; fi
  bench_run "$1"
}
SHAPE=$(emit hidden="$HIDDEN" layers="$LAYERS" heads="$HEADS" kv_heads="$KV_HEADS" mlp="$MLP" vocab="$VOCAB" head_dim="$HEAD_DIM")

# The target folder (config.json, plus model.safetensors when WEIGHTS=file) and the prepared samples.
INPUTS_DONE=0
inputs() {
  [ "$INPUTS_DONE" = 1 ] && return 0
  INPUTS_DONE=1
  if [ "$PRINT_ONLY" = 1 ]; then
    echo "+ config.json of the shape in $MODEL; $SAMPLES random samples of $SEQ ids < $MAX_ID -> $WORK/samples.jsonl"
  else
    bench_write_llama_config "$MODEL" "$HIDDEN" "$LAYERS" "$HEADS" "$KV_HEADS" "$MLP" "$VOCAB" "$HEAD_DIM"
    bench_random_samples "$WORK/samples.jsonl" "$SAMPLES" "$SEQ" "$MAX_ID"
  fi
  BENCH_CMD=("$AERIE" prepare --input "$WORK/samples.jsonl" --format tokenized --tokenizer "$TOKENIZER"
             --output "$PREPARED" --max-length "$SEQ")
  [ "$PRINT_ONLY" = 1 ] || rm -f "$PREPARED"
  go "$WORK/prepare.log" || { echo "$BENCH_TAG: aerie prepare failed, see $WORK/prepare.log" >&2; exit 1; }
  if [ "$WEIGHTS" = file ]; then
    BENCH_CMD=(python3 "$HERE/make_target_head.py" "$MODEL" --full --seed "$SEED")
    go "$WORK/make_model.log" || { echo "$BENCH_TAG: make_target_head.py failed" >&2; cat "$WORK/make_model.log" >&2; exit 1; }
  fi
}

# extract_run NAME NP TP: one extraction into $WORK/shards_NAME, one JSON line.
extract_run() {
  local name=$1 np=$2 tp=$3 out=$WORK/shards_$1 log=$WORK/extract_$1.log t0 t1 rc=0
  local wargs=(--random-weights "$SEED")
  if [ "$WEIGHTS" = file ]; then wargs=(); fi
  if [ -n "$AUX_LAYERS" ]; then wargs+=(--aux-layers "$AUX_LAYERS"); fi
  bench_mpi_cmd "$np" "$AERIE" extract --model "$MODEL" "${wargs[@]}" --device "$DEVICE" --dtype "$DTYPE" --tp "$tp" \
    --prepared "$PREPARED" --output "$out" --samples-per-shard "$SAMPLES_PER_SHARD"
  rm -rf "$out"
  t0=$(now); go "$log" || rc=$?; t1=$(now)
  if [ "$PRINT_ONLY" = 1 ]; then emit phase=extract run="$name" dry=true command="$(cmd_str)"; return 0; fi
  if [ "$rc" != 0 ]; then
    fail "extract $name exited with $rc (log $log)"; tail -15 "$log" >&2
    emit phase=extract run="$name" ok=false rc="$rc" log="$log" command="$(cmd_str)"; return 1
  fi
  local stats bytes
  stats=$(bench_extract_stats "$log"); bytes=$(python3 "$HERE/bench_util.py" shard-bytes "$out")
  emit phase=extract run="$name" device="$DEVICE" dtype="$DTYPE" weights="$WEIGHTS" np="$np" tp="$tp" dp=$((np / tp)) \
    shape="$SHAPE" seq="$SEQ" "+=$stats" "+=$bytes" \
    hidden_bytes_per_s="$(python3 -c "import json,sys; s=json.loads(sys.argv[1]); b=json.loads(sys.argv[2]); print(b['bytes']/s['seconds'])" "$stats" "$bytes")" \
    wall_s="$(elapsed "$t0" "$t1")" log="$log" command="$(cmd_str)"
}

phase_extract() {
  inputs
  extract_run a "$NP" "$TP" || exit 1  # the other phases train on these shards
  [ -n "$NP_B$TP_B" ] || return 0
  local npb=${NP_B:-$NP} tpb=${TP_B:-$TP}
  extract_run b "$npb" "$tpb" || return 0
  [ "$PRINT_ONLY" = 1 ] && return 0
  # Both WEIGHTS give every tp size the same model: --random-weights SEED (since 404cd5a every rank draws
  # the full tensors and keeps its shard) or one checkpoint file.
  local note="same weights on both runs (--random-weights $SEED)"
  if [ "$WEIGHTS" = file ]; then note="same weights on both runs ($MODEL/model.safetensors)"; fi
  local cmp
  cmp=$(python3 "$HERE/bench_util.py" compare-shards "$WORK/shards_a" "$WORK/shards_b" "$CMP_TOL")
  emit phase=extract_compare a="$(emit np="$NP" tp="$TP")" b="$(emit np="$npb" tp="$tpb")" weights="$WEIGHTS" \
    comparable=true note="$note" "+=$cmp" \
    command="python3 $HERE/bench_util.py compare-shards $WORK/shards_a $WORK/shards_b $CMP_TOL"
  if ! python3 -c "import json,sys; sys.exit(0 if json.loads(sys.argv[1])['ok'] else 1)" "$cmp"; then
    fail "extract: shards of tp $TP and tp $tpb differ beyond relative L2 $CMP_TOL"
  fi
}

# The training inputs: the target head (unless the full random checkpoint is there) and the draft vocabulary.
TRAIN_INPUTS_DONE=0
train_inputs() {
  [ "$TRAIN_INPUTS_DONE" = 1 ] && return 0
  TRAIN_INPUTS_DONE=1
  inputs
  if [ "$PRINT_ONLY" != 1 ] && [ ! -d "$SHARDS" ]; then
    echo "$BENCH_TAG: no $SHARDS: run the extract phase first (same WORK)" >&2; exit 2
  fi
  if [ "$PRINT_ONLY" = 1 ] || [ ! -f "$MODEL/model.safetensors" ]; then
    BENCH_CMD=(python3 "$HERE/make_target_head.py" "$MODEL" --seed "$SEED")
    go "$WORK/make_head.log" || { echo "$BENCH_TAG: make_target_head.py failed" >&2; cat "$WORK/make_head.log" >&2; exit 1; }
  fi
  bench_mpi_cmd 1 "$AERIE" vocab --prepared "$PREPARED" --model "$MODEL" --output "$VOCAB_FILE" \
    --draft-vocab-size "$DRAFT_VOCAB" --force
  go "$WORK/vocab.log" || { echo "$BENCH_TAG: aerie vocab failed, see $WORK/vocab.log" >&2; exit 1; }
}

# train_cmd NP RUN_DIR STEPS [EXTRA...]: BENCH_CMD of one training run.
train_cmd() {
  local np=$1 run=$2 steps=$3; shift 3
  bench_mpi_cmd "$np" "$AERIE" train --device "$DEVICE" --model "$MODEL" --shards "$SHARDS" --vocab "$VOCAB_FILE" \
    --output "$run" --steps "$steps" --batch-size "$BATCH" --ttt-steps "$TTT" --lr "$LR" --seed "$SEED" \
    --eval-fraction 0 --log-every 1 "$@"
}

phase_train() {
  train_inputs
  local dp run log t0 t1 rc runs=()
  for dp in $DPS; do
    [ $((BATCH % dp)) = 0 ] || echo "$BENCH_TAG: warning: BATCH $BATCH is not a multiple of dp $dp" >&2
    run=$WORK/train_dp$dp; log=$WORK/train_dp$dp.log; rc=0
    rm -rf "$run"
    train_cmd "$dp" "$run" "$STEPS"
    t0=$(now); go "$log" || rc=$?; t1=$(now)
    if [ "$PRINT_ONLY" = 1 ]; then emit phase=train dp="$dp" dry=true command="$(cmd_str)"; continue; fi
    if [ "$rc" != 0 ]; then
      fail "train dp $dp exited with $rc (log $log)"; tail -15 "$log" >&2
      emit phase=train dp="$dp" ok=false rc="$rc" log="$log" command="$(cmd_str)"; continue
    fi
    python3 "$HERE/bench_util.py" train-metrics "$run" "$WARM" > "$run.json"
    if [ "$CLEAN" = 1 ]; then rm -rf "$run/checkpoints"; fi
    emit phase=train device="$DEVICE" dp="$dp" global_batch="$BATCH" seq="$SEQ" ttt_steps="$TTT" shape="$SHAPE" \
      "+=$(cat "$run.json")" wall_s="$(elapsed "$t0" "$t1")" log="$log" command="$(cmd_str)"
    runs+=("$dp" "$run.json")
  done
  [ "$PRINT_ONLY" != 1 ] && [ ${#runs[@]} -ge 4 ] || return 0
  local sc
  sc=$(python3 "$HERE/bench_util.py" scaling "$LOSS_RTOL" "${runs[@]}")
  emit phase=train_scaling global_batch="$BATCH" "+=$sc" \
    definition="same global batch at every dp; t_dp = mean step time after the first $WARM step(s); speedup = t_ref/t_dp; efficiency = (dp_ref*t_ref)/(dp*t_dp), 1 when t_dp = t_ref*dp_ref/dp"
  python3 -c "import json,sys; sys.exit(0 if json.loads(sys.argv[1])['losses_equal'] else 1)" "$sc" \
    || fail "train: losses differ across dp beyond $LOSS_RTOL"
}

phase_preempt() {
  train_inputs
  local run=$WORK/preempt log_a=$WORK/preempt_a.log log_b=$WORK/preempt_b.log pid rc_a=0 rc_b=0 cmd_a cmd_b
  local pargs=(--checkpoint-every "$PRE_CKPT_EVERY")
  if [ "$PRE_KEEP" -gt 0 ]; then pargs+=(--keep-checkpoints "$PRE_KEEP"); fi
  rm -rf "$run"
  train_cmd "$PRE_NP_A" "$run" "$PRE_STEPS" "${pargs[@]}"
  cmd_a=$(cmd_str)
  train_cmd "$PRE_NP_B" "$run" "$PRE_STEPS" "${pargs[@]}"
  cmd_b=$(cmd_str)
  if [ "$PRINT_ONLY" = 1 ]; then
    echo "+ $cmd_a &   # then: kill -$PRE_SIGNAL <its ranks> once $run/checkpoints/step-*/DONE exists"
    echo "+ $cmd_b"
    emit phase=preempt dry=true command_stopped="$cmd_a" command_resumed="$cmd_b"
    return 0
  fi
  # A: in the background; signal its ranks (mpirun's children) once a checkpoint is complete.
  train_cmd "$PRE_NP_A" "$run" "$PRE_STEPS" "${pargs[@]}"
  echo "$BENCH_TAG: $cmd_a (stopped by SIG$PRE_SIGNAL after its first checkpoint)" >&2
  "${BENCH_CMD[@]}" > "$log_a" 2>&1 &
  pid=$!
  local waited=0 first="" signalled_at_step=null
  while kill -0 "$pid" 2>/dev/null; do
    first=$({ ls -d "$run"/checkpoints/step-*/DONE 2>/dev/null || true; } | head -1)
    [ -n "$first" ] && break
    sleep 0.05; waited=$((waited + 1))
    [ "$waited" -lt $((PRE_WAIT * 20)) ] || { fail "preempt: no checkpoint after $PRE_WAIT s"; break; }
  done
  if [ -n "$first" ] && kill -0 "$pid" 2>/dev/null; then
    signalled_at_step=$(basename "$(dirname "$first")" | sed 's/step-0*//')
    local ranks; ranks=$(pgrep -P "$pid" || true)
    # shellcheck disable=SC2086
    if [ -n "$ranks" ]; then kill -"$PRE_SIGNAL" $ranks 2>/dev/null || true; fi
  fi
  wait "$pid" || rc_a=$?
  local la lb newest
  la=$(python3 "$HERE/bench_util.py" train-log "$log_a")
  newest=$({ ls -d "$run"/checkpoints/step-*/DONE 2>/dev/null || true; } | sort | tail -1 | xargs -r dirname | xargs -r basename | sed 's/step-0*//')
  # B: the same command on PRE_NP_B ranks resumes.
  train_cmd "$PRE_NP_B" "$run" "$PRE_STEPS" "${pargs[@]}"
  go "$log_b" || rc_b=$?
  lb=$(python3 "$HERE/bench_util.py" train-log "$log_b")
  python3 "$HERE/bench_util.py" train-metrics "$run" 0 > "$run.json" 2>/dev/null || echo '{}' > "$run.json"
  # The uninterrupted reference: a train phase run of the same options, else one run here.
  local ref="" ref_cmd=""
  if [ "$PRE_STEPS" = "$STEPS" ]; then
    for dp in "$PRE_NP_A" "$PRE_NP_B" $DPS; do
      [ -f "$WORK/train_dp$dp.json" ] && { ref=$WORK/train_dp$dp.json; ref_cmd="train phase, dp $dp"; break; }
    done
  fi
  if [ -z "$ref" ] && [ "$PRE_REF" = 1 ]; then
    rm -rf "$WORK/preempt_ref"
    train_cmd "$PRE_NP_A" "$WORK/preempt_ref" "$PRE_STEPS" "${pargs[@]}"
    if go "$WORK/preempt_ref.log"; then
      python3 "$HERE/bench_util.py" train-metrics "$WORK/preempt_ref" 0 > "$WORK/preempt_ref.json"
      ref=$WORK/preempt_ref.json; ref_cmd=$(cmd_str)
      if [ "$CLEAN" = 1 ]; then rm -rf "$WORK/preempt_ref/checkpoints"; fi
    fi
  fi
  local diff='{"common_steps": 0, "max_rel_diff": null}'
  if [ -n "$ref" ]; then diff=$(python3 "$HERE/bench_util.py" loss-diff "$ref" "$run.json"); fi
  local verdict
  verdict=$(python3 - "$la" "$lb" "$rc_a" "$rc_b" "$newest" "$PRE_STEPS" "$diff" "$LOSS_RTOL" "$run.json" <<'EOF'
import json, sys
la, lb = json.loads(sys.argv[1]), json.loads(sys.argv[2])
rc_a, rc_b, newest, total = int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], int(sys.argv[6])
diff, rtol, m = json.loads(sys.argv[7]), float(sys.argv[8]), json.load(open(sys.argv[9]))
newest = int(newest) if newest else None
stopped = la["stopped_after"]
checks = {
    "stopped_by_signal": la["stopped_signal"] is not None and stopped is not None and stopped < total,
    "exit_status_3": rc_a == 3,
    "checkpoint_at_stop": newest is not None and newest == stopped,
    "resumed_at_right_step": lb["resumed_from_step"] is not None and lb["resumed_from_step"] == stopped,
    "finished": rc_b == 0 and lb["done"] and lb.get("final_step") == total,
    "metrics_steps_complete": m.get("steps") == list(range(1, total + 1)),
}
if diff.get("max_rel_diff") is not None:
    checks["losses_match_uninterrupted"] = diff["max_rel_diff"] <= rtol
print(json.dumps({"stopped_after_step": stopped, "signal_number": la["stopped_signal"], "rc_stopped": rc_a,
                  "newest_checkpoint_after_stop": newest, "resumed_from_step": lb["resumed_from_step"],
                  "final_step": lb.get("final_step"), "rc_resumed": rc_b, "total_steps": total,
                  "loss_max_rel_diff_vs_uninterrupted": diff.get("max_rel_diff"), "checks": checks,
                  "ok": all(checks.values())}))
EOF
)
  if [ "$CLEAN" = 1 ]; then rm -rf "$run/checkpoints"; fi
  emit phase=preempt device="$DEVICE" np_a="$PRE_NP_A" np_b="$PRE_NP_B" checkpoint_every="$PRE_CKPT_EVERY" \
    signal="SIG$PRE_SIGNAL to the ranks" signal_sent_after_checkpoint="$signalled_at_step" "+=$verdict" \
    reference="${ref_cmd:-none}" loss_rtol="$LOSS_RTOL" logs="$log_a $log_b" command_stopped="$cmd_a" command_resumed="$cmd_b"
  python3 -c "import json,sys; sys.exit(0 if json.loads(sys.argv[1])['ok'] else 1)" "$verdict" \
    || fail "preempt: $(python3 -c "import json,sys; print({k: v for k, v in json.loads(sys.argv[1])['checks'].items() if not v})" "$verdict")"
}

T_START=$(now)
for p in $PHASES; do "phase_$p"; done
if [ "$PRINT_ONLY" = 1 ]; then
  echo "$BENCH_TAG: dry run: nothing ran, $WORK was not created" >&2
else
  echo "$BENCH_TAG: phases '$PHASES' took $(elapsed "$T_START" "$(now)") s; files in $WORK" >&2
fi
exit "$STATUS"
