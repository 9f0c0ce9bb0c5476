#!/usr/bin/env bash
# A write that fails under a collective job: prepare on 2 ranks whose write fails on one rank
# (a full disk) used to hang forever, one rank in H5Fclose's barrier, the other in the next write's
# MPI_Allreduce. Each run here must end within its timeout with a non-zero status and an error naming the file:
#  1. AERIE_TEST_FAIL_H5_WRITE=R (io/h5.h's test hook) fails the collective writes of rank 0, then of rank 1:
#     "prepare: cannot write OUTPUT.tmp ...", no .tmp or lock left;
#  2. where this process may mount a tmpfs (root): a 300 KiB file system too small for the file is refused
#     before the file is created, naming the output and the space; with --no-space-check the real write
#     failure (ENOSPC) ends the job the same way as in 1.
# usage: write_failure.sh AERIE MODEL_DIR STORIES_TXT WORK_DIR   (exit 77: no converted model)
set -euo pipefail
aerie=$1 model=$2 text=$3 work=$4
source "$(dirname "$0")/aerie_script_lib.sh"  # fail; the empty work folder
limit=50  # seconds a run may take (each takes about 2 s when nothing hangs)

# ends LOG PATTERN [ENV=VALUE] -- ARGS...: prepare on 2 ranks must end within $limit s, fail, and log PATTERN.
ends() {
  local log=$1 pattern=$2; shift 2
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  last="$work/$log.log"
  local rc=0
  env "${envs[@]}" timeout -s KILL "$limit" mpirun --oversubscribe -np 2 "$aerie" prepare --input "$text" \
    --tokenizer "$model" --max-length 512 --max-samples 800 "$@" >"$last" 2>&1 || rc=$?
  [ "$rc" -ne 137 ] && [ "$rc" -ne 124 ] || fail "$log: still running after $limit s (hung in a collective?)"
  [ "$rc" -ne 0 ] || fail "$log: exit 0, expected a failure"
  grep -Eq -- "$pattern" "$last" || fail "$log: failed, but without: $pattern"
}

# 1. the test hook, on either rank
for r in 0 1; do
  ends "hook_rank$r" "prepare: cannot write $work/p.h5.tmp .*HDF5: cannot write $work/p.h5.tmp:/input_ids" \
    "AERIE_TEST_FAIL_H5_WRITE=$r" -- --output "$work/p.h5"
  [ ! -e "$work/p.h5.tmp" ] || fail "hook_rank$r: the partial $work/p.h5.tmp is left"
  [ ! -e "$work/p.h5.lock" ] || fail "hook_rank$r: the lock $work/p.h5.lock is left"
  [ ! -e "$work/p.h5" ] || fail "hook_rank$r: $work/p.h5 was written"
done
echo "1. a write failing on rank 0 or rank 1 ends the job naming the file"

# 2. a real full file system
mnt="$work/small"
mkdir -p "$mnt"
if mount -t tmpfs -o size=300k tmpfs "$mnt" 2>/dev/null; then
  trap 'umount "$mnt" 2>/dev/null || true' EXIT
  ends small_refused "prepare: --output $mnt/p.h5 needs about 0.4. MiB .* but $mnt has 0.2. MiB free" -- \
    --output "$mnt/p.h5"
  [ -z "$(ls -A "$mnt")" ] || fail "small_refused: $mnt holds $(ls "$mnt")"
  ends small_full "prepare: cannot write $mnt/p.h5.tmp .*HDF5: cannot write" -- --output "$mnt/p.h5" \
    --no-space-check
  [ -z "$(ls -A "$mnt")" ] || fail "small_full: $mnt holds $(ls "$mnt")"
  echo "2. a file system too small: refused before writing; with --no-space-check the write failure ends the job"
else
  echo "2. skipped: cannot mount a tmpfs here (not root?)"
fi
echo PASS
