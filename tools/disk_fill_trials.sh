#!/usr/bin/env bash
# Disk-fill trials: prepare, extract, train and generate on 2 ranks write their output into a small tmpfs
# while a background dd fills it at a random moment of the job. Each trial must end within LIMIT seconds
# (default 60; the job runs under `timeout 90`), and a failed job must name a file under the tmpfs in its
# error line. After each trial the fill is removed and the same job is rerun: it must finish, which shows
# that nothing finished before the fill was lost or left corrupt (extract and generate skip the chunks they
# had, train resumes from its last checkpoint).
#
# usage: tools/disk_fill_trials.sh AERIE MODEL_DIR STORIES_TXT WORK_DIR [N] [TABLE]
#   AERIE: the aerie binary; MODEL_DIR: the converted stories260K (tools/convert_llama2c.py); STORIES_TXT:
#   TinyStories text; N: trials per job (default 10); TABLE: where the Markdown table goes (default
#   WORK_DIR/table.md). Needs to mount a tmpfs (root): otherwise it says so and exits 77 (skipped).
# Exit status: 0 when every trial passed, 1 otherwise (the table says which), 77 when skipped.
set -uo pipefail
aerie=$1 model=$2 text=$3 work=$4 n=${5:-10} table=${6:-$4/table.md}
limit=${DISK_FILL_LIMIT:-60}
size=${DISK_FILL_SIZE:-24m}
[ -f "$model/config.json" ] || { echo "disk_fill_trials: no converted model at $model: skipped"; exit 77; }
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1} OMPI_MCA_rmaps_base_oversubscribe=1
rm -rf "$work"
mkdir -p "$work/in" "$work/logs"
mnt="$work/df"
mkdir -p "$mnt"
if ! mount -t tmpfs -o "size=$size" tmpfs "$mnt" 2>/dev/null; then
  echo "disk_fill_trials: cannot mount a tmpfs at $mnt (not root?): skipped"
  exit 77
fi
filler=""
# Stops the filler: its subshell first (so that no dd starts after), then a dd already writing (reparented when
# the subshell died), and waits for the last writer of the fill to exit (its space is freed only then: a rerun that
# started while an orphaned dd still held the deleted fill found the disk full).
stop_filler() {
  [ -n "$filler" ] || return 0
  kill "$filler" 2>/dev/null
  pkill -f "of=$mnt/fill" 2>/dev/null
  wait "$filler" 2>/dev/null
  while pgrep -f "of=$mnt/fill" >/dev/null; do sleep 0.01; done
  filler=""
}
cleanup() {
  stop_filler
  umount "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true
}
trap cleanup EXIT

in="$work/in"
np2() { timeout -s KILL 90 mpirun --oversubscribe -np 2 "$aerie" "$@"; }
# The inputs, outside the tmpfs: a prepared file of 320 samples, its shards and draft vocabulary, and 64
# conversations to regenerate.
np2 prepare --input "$text" --tokenizer "$model" --max-length 256 --max-samples 320 --output "$in/p.h5" \
  >"$work/logs/inputs.log" 2>&1 || { echo "disk_fill_trials: preparing the inputs failed"; tail "$work/logs/inputs.log"; exit 1; }
np2 extract --model "$model" --prepared "$in/p.h5" --aux-layers 2,3,4 --samples-per-shard 16 --output "$in/shards" \
  >>"$work/logs/inputs.log" 2>&1 || { echo "disk_fill_trials: extracting the inputs failed"; tail "$work/logs/inputs.log"; exit 1; }
np2 vocab --model "$model" --prepared "$in/p.h5" --draft-vocab-size 256 --output "$in/vocab.safetensors" \
  >>"$work/logs/inputs.log" 2>&1 || { echo "disk_fill_trials: the draft vocabulary failed"; tail "$work/logs/inputs.log"; exit 1; }
# prepare's input: the text 6 times (about 2.2 M tokens, an 11 MiB file), so that the job runs about a second.
for _ in 1 2 3 4 5 6; do cat "$text"; echo; done >"$in/stories6.txt"
starts=("Once upon a time, there was a little girl." "Tom had a red ball." "The sun was hot." "Lily saw a big dog.")
for i in $(seq 0 63); do
  echo "{\"id\": $i, \"conversations\": [{\"from\": \"human\", \"value\": \"${starts[$((i % 4))]}\"}]}"
done >"$in/convs.jsonl"

# The job J writing into the tmpfs (OUT: its output there).
job_args() {
  case $1 in
    prepare) echo prepare --input "$in/stories6.txt" --tokenizer "$model" --max-length 256 --output "$mnt/p.h5" --no-space-check ;;
    extract) echo extract --model "$model" --prepared "$in/p.h5" --aux-layers 2,3,4 --samples-per-shard 16 \
               --output "$mnt/shards" --no-space-check ;;
    train) echo train --model "$model" --shards "$in/shards" --steps 60 --batch-size 4 --lr 3e-3 --checkpoint-every 10 \
             --log-every 10 --vocab "$in/vocab.safetensors" --output "$mnt/run" ;;
    generate) echo generate --model "$model" --input "$in/convs.jsonl" --output "$mnt/regen.jsonl" --temperature 0.8 \
                --max-new-tokens 200 --conversations-per-chunk 4 --batch-size 4 ;;
  esac
}

# Waits until the job has created its first file in the tmpfs (its lock: the job has started), prints the time.
started() { while [ -z "$(ls -A "$mnt" 2>/dev/null)" ]; do sleep 0.005; done; date +%s.%N; }

# A clean run of each job (no fill): the time from its first file to its end bounds the fill's moment.
declare -A dur
for j in prepare extract train generate; do
  rm -rf "${mnt:?}"/*
  started >"$work/start" &
  # shellcheck disable=SC2046
  np2 $(job_args $j) >"$work/logs/$j.clean.log" 2>&1 || { echo "disk_fill_trials: $j failed without a fill"; tail "$work/logs/$j.clean.log"; exit 1; }
  wait
  dur[$j]=$(echo "$(date +%s.%N) - $(cat "$work/start")" | bc)
  echo "disk_fill_trials: $j runs ${dur[$j]} s after its lock is taken, without a fill (used $(du -sh "$mnt" | cut -f1) of $size)"
done

echo "| job | trial | fill at (s after the lock) | exit | seconds | error names a file under the tmpfs | rerun after freeing space |" >"$table"
echo "| --- | --- | --- | --- | --- | --- | --- |" >>"$table"
failures=0
for j in prepare extract train generate; do
  for t in $(seq 1 "$n"); do
    rm -rf "${mnt:?}"/*
    log="$work/logs/$j.$t.log"
    # The fill starts at a random moment of the job: within the first 90% of the clean run after its lock.
    at=$(python3 -c "import random; print(round(random.uniform(0.0, 0.9 * ${dur[$j]}), 2))")
    (started >/dev/null; sleep "$at"; dd if=/dev/zero of="$mnt/fill" bs=1M >/dev/null 2>&1) &
    filler=$!
    t0=$(date +%s.%N)
    rc=0
    # shellcheck disable=SC2046
    np2 $(job_args $j) >"$log" 2>&1 || rc=$?
    secs=$(printf '%.1f' "$(echo "$(date +%s.%N) - $t0" | bc)")
    stop_filler
    names="-"
    verdict=ok
    if [ "$rc" -eq 137 ] || [ "$rc" -eq 124 ]; then verdict="HUNG"; fi
    if (( $(echo "$secs > $limit" | bc) )); then verdict="SLOW"; fi
    if [ "$rc" -ne 0 ]; then
      # The error line (aerie's "failed:" or an error record) must name a path under the tmpfs.
      if grep -E "(failed|error|ERROR)" "$log" | grep -q "$mnt/"; then names=yes; else names=no; verdict="UNNAMED"; fi
    fi
    rm -f "$mnt/fill"
    # Free space again: the rerun must finish (what was complete before the fill is kept and valid).
    rerun=ok
    # shellcheck disable=SC2046
    np2 $(job_args $j) >"$log.rerun" 2>&1 || { rerun="FAILED (exit $?)"; verdict="RERUN"; }
    if [ "$rc" -ne 0 ]; then
      case $j in
        extract|generate) kept=$(grep -Eo "[0-9]+ already done" "$log.rerun" | head -1 | cut -d' ' -f1) ;;
        train) kept=$(grep -Eo "resum[a-z]* from [^ ]*step[- ][0-9]+" "$log.rerun" | grep -Eo "[0-9]+$" | head -1 | sed 's/^0*//') ;;
        *) kept="" ;;
      esac
      [ -n "$kept" ] && rerun="$rerun (kept ${kept}$([ $j = train ] && echo " steps" || echo " chunks"))"
    fi
    echo "| $j | $t | $at | $rc | $secs | $names | $rerun |" >>"$table"
    echo "disk_fill_trials: $j trial $t: fill at $at s, exit $rc after $secs s, names the file: $names, rerun: $rerun -> $verdict"
    if [ "$verdict" != ok ]; then failures=$((failures + 1)); echo "  log: $log"; tail -5 "$log"; fi
  done
done
cat "$table"
[ "$failures" -eq 0 ] || { echo "disk_fill_trials: $failures trial(s) failed"; exit 1; }
echo "disk_fill_trials: PASS ($n trials per job)"
