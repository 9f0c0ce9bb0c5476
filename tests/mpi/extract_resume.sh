#!/usr/bin/env bash
# Kill/rerun test of `aerie extract`: a run killed with SIGKILL at a random moment after its first shard
# appeared, then rerun, must leave shard files byte-identical (cmp) to those of an uninterrupted run, and
# no .tmp files. The prepared input comes from test_data's ExtractFixture.WritePrepared.
# usage: extract_resume.sh AERIE TEST_DATA MODEL_DIR WORK_DIR [NP=2] [TP=1]
# Exits 77 (CTest: skipped) when the converted model is missing.
set -euo pipefail
aerie=$1 test_data=$2 model=$3 work=$4 np=${5:-2} tp=${6:-1}
[ -f "$model/config.json" ] || { echo "no converted model at $model: skipped"; exit 77; }
export OPENBLAS_NUM_THREADS=1
rm -rf "$work"
mkdir -p "$work"
AERIE_EXTRACT_PREPARED="$work/prepared.h5" "$test_data" --gtest_filter=ExtractFixture.WritePrepared >/dev/null

cmd=(mpirun --oversubscribe -np "$np" "$aerie" extract --model "$model" --prepared "$work/prepared.h5"
     --tp "$tp" --samples-per-shard 3 --aux-layers 1,2,4 --output)
extract() { "${cmd[@]}" "$1"; }
shards() { (cd "$1" && ls | grep -E '^shard-[0-9]+\.h5$' || true); }

extract "$work/ref" >"$work/ref.log" 2>&1 || { cat "$work/ref.log"; echo "FAIL: reference run"; exit 1; }
n_ref=$(shards "$work/ref" | wc -l)

# The run to kill: SIGKILL its ranks (by pid, children of this mpirun) and mpirun itself, at a random
# moment 0-0.45 s after its first shard appeared.
"${cmd[@]}" "$work/run" >"$work/killed.log" 2>&1 &
pid=$!  # mpirun itself (not a subshell), so its children are the ranks
for _ in $(seq 600); do
  [ -n "$(shards "$work/run" 2>/dev/null)" ] && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
sleep "$(printf '0.%02d' $((RANDOM % 46)))"
ranks=$(pgrep -P "$pid" || true)
[ -n "$ranks" ] && kill -KILL $ranks 2>/dev/null || true
kill -KILL "$pid" 2>/dev/null || true
wait "$pid" 2>/dev/null || true
n_killed=$(shards "$work/run" | wc -l)
n_tmp=$(cd "$work/run" && ls | grep -c '\.tmp$' || true)
echo "killed run left $n_killed of $n_ref shards and $n_tmp .tmp file(s)"

extract "$work/run" >"$work/rerun.log" 2>&1 || { cat "$work/rerun.log"; echo "FAIL: rerun"; exit 1; }
grep -q "$n_killed already done" "$work/rerun.log" || { cat "$work/rerun.log"; echo "FAIL: rerun did not skip $n_killed shards"; exit 1; }

[ "$(shards "$work/ref")" = "$(shards "$work/run")" ] || { echo "FAIL: shard lists differ"; exit 1; }
if ls "$work/run" | grep -q '\.tmp$'; then echo "FAIL: .tmp files left"; exit 1; fi
for f in $(shards "$work/ref"); do
  cmp "$work/ref/$f" "$work/run/$f" || { echo "FAIL: $f differs after kill + rerun"; exit 1; }
done
echo "OK: $n_ref shards byte-identical after a kill after $n_killed shards and a rerun (np=$np tp=$tp)"
