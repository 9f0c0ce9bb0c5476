#!/usr/bin/env bash
# The CUDA suites, and with BENCH=1 the benchmarks, on one GPU twice in one call: as the GPU is (an H100 / H200:
# the wgmma kernels, 227 KiB of shared memory per block) and as the GPUs our users own plan
# (AERIE_CUDA_EMULATE=sm_120, core/gpu_limits.h: no wgmma, so the mma.sync kernels, and the tile configurations
# that fit 99 KiB per block, as on an RTX PRO 6000; sm_100 for a B200's mma.sync path). AERIE_NO_SKIP=1: a test
# that cannot run on the GPU fails instead of skipping (the multi-rank ones need two GPUs and still skip).
#
# The suites read their fixtures from the source tree they were built from (AERIE_SOURCE_DIR, compiled in): on
# the GPU machine the checkout is copied afresh at every device call, so run this within one call (a run left
# going in the background across calls lost test_model's fixtures while the next call's copy arrived).
#
# The tests that read the converted stories260K (the build's models/stories260K, compiled in, or $AERIE_TEST_MODEL,
# which BUILD_DIR/models/stories260K sets when present) fail under AERIE_NO_SKIP=1 without it: stage the build's
# models/ folder (1.1 MB) with the binaries. Tests of the suites read ../shared/data too (TinyStories prompts, the
# tokenizers, the Kimi/DeepSeek configs): set AERIE_DATA to a staged copy of the whole folder (tar | xz -6: 9.8 MB),
# not a subset (a subset fails the eval tests under AERIE_NO_SKIP=1 for want of tinystories_val.txt).
#
# usage: tools/bench/gpu_paths.sh [BUILD_DIR] [OUT_DIR]       (BUILD_DIR default build; OUT_DIR default /tmp/gpu-paths)
# Environment:
#   PATHS     the settings, "native" or an AERIE_CUDA_EMULATE value, each optionally followed by "+KERNEL" for
#             AERIE_ATTENTION_FORWARD_KERNEL and _BACKWARD_KERNEL (e.g. "sm_120+mma64", as bench_attention.sh takes
#             them; its files go to OUT_DIR/sm_120-mma64) and by "+NAME=VALUE" parts, each an environment setting
#             (e.g. "sm_120+AERIE_GROUPED_GEMM_KERNEL=rsm": its files go to
#             OUT_DIR/sm_120-AERIE_GROUPED_GEMM_KERNEL-rsm) (default "native sm_120")
#   SUITES    the test binaries and their gtest arguments, one per line (default: test_kernels, test_model,
#             test_train, test_core's DeviceSync.* and GpuLimitsCuda.* (it prints the limits the kernels planned
#             for: the setting's effect), test_data's *Cuda*)
#   TOGETHER  1 (default): each setting's suites run side by side on the GPU; 0: one after another; 2: every
#             setting's suites at once (each setting writes its tests' files under OUT_DIR/<setting>/scratch,
#             AERIE_TEST_SCRATCH, so that two runs of one test do not share a folder)
#   BENCH     1: then tools/bench/bench_deepseek.sh (SKIP_HF=1) and bench_train.sh (SKIP_HF=1 SKIP_SPECFORGE=1)
#             under each setting (default 0)
# Writes OUT_DIR/<setting>/<suite>.txt, the benchmarks' JSON lines in OUT_DIR/<setting>/bench_*.txt, and
# OUT_DIR/summary.txt: per setting and suite the exit status, tests passed / failed and seconds. Exit status 1
# when any suite failed.
set -uo pipefail
case "${1:-}" in -h | --help)
  sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 0 ;;
esac
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="$(cd "${1:-build}" && pwd)" || exit 2
out="$(mkdir -p "${2:-/tmp/gpu-paths}" && cd "${2:-/tmp/gpu-paths}" && pwd)" || exit 2
case "${TOGETHER:-1}" in 0 | 1 | 2) ;; *) echo "gpu_paths: TOGETHER must be 0, 1 or 2, got '$TOGETHER'" >&2; exit 2 ;; esac
paths="${PATHS:-native sm_120}"
default_suites="test_kernels
test_model
test_train
test_core --gtest_filter=DeviceSync.*:GpuLimitsCuda.*
test_data --gtest_filter=*Cuda*"
suites="${SUITES:-$default_suites}"
export AERIE_NO_SKIP=1
# A staged build folder with the converted model beside the binaries (BUILD_DIR/models/stories260K): the tests read it.
if [ -z "${AERIE_TEST_MODEL:-}" ] && [ -f "$build/models/stories260K/config.json" ]; then
  export AERIE_TEST_MODEL="$build/models/stories260K"
fi
: > "$out/summary.txt"

# A setting's environment (into the array `envs`: env's arguments) and its folder name under OUT_DIR.
setting_env() {
  local setting=${1%%+*} rest= kernel= part parts=()
  [ "$setting" = "$1" ] || rest=${1#*+}
  local unset=() sets=()  # env takes its -u options before the assignments
  if [ "$setting" = native ]; then unset+=(-u AERIE_CUDA_EMULATE); else sets+=(AERIE_CUDA_EMULATE="$setting"); fi
  IFS=+ read -ra parts <<< "$rest"
  for part in "${parts[@]}"; do
    case $part in
      [[:upper:]]*=*) sets+=("$part") ;;
      *=*) echo "gpu_paths: PATHS part '$part' is not NAME=VALUE with an upper-case NAME" >&2; exit 2 ;;
      ?*) kernel=$part ;;
    esac
  done
  if [ -n "$kernel" ]; then sets+=(AERIE_ATTENTION_FORWARD_KERNEL="$kernel" AERIE_ATTENTION_BACKWARD_KERNEL="$kernel")
  else unset+=(-u AERIE_ATTENTION_FORWARD_KERNEL -u AERIE_ATTENTION_BACKWARD_KERNEL); fi  # none inherited
  envs=("${unset[@]}" "${sets[@]}")
}
dir_of() { local d=${1//+/-}; echo "${d//=/-}"; }  # "+" and "=" are not in names the device tool brings back
for p in $paths; do setting_env "$p"; done  # a malformed setting is refused before anything runs

# One suite under one setting: its output, then a summary line.
run_suite() {
  local setting=$1 line=$2 name s rc counts envs dir
  read -r name _ <<< "$line"
  [ -x "$build/$name" ] || { echo "$setting $name missing ($build/$name)" >> "$out/summary.txt"; return 1; }
  s=$(date +%s)
  setting_env "$setting"
  dir="$out/$(dir_of "$setting")"
  (cd "$build" && set -f && env "${envs[@]}" AERIE_TEST_SCRATCH="$dir/scratch" ./$line) > "$dir/$name.txt" 2>&1
  rc=$?
  counts=$(grep -aoE "^\[  PASSED  \] [0-9]+|^\[  FAILED  \] [0-9]+ test" "$dir/$name.txt" |
           grep -oE "[0-9]+" | paste -sd/ -)
  echo "$setting $name rc=$rc passed/failed=${counts:-?} $(( $(date +%s) - s )) s" >> "$out/summary.txt"
}

status=0
together=${TOGETHER:-1}
if [ "$together" = 2 ]; then  # every setting's suites at once, then the benchmarks below one setting at a time
  for setting in $paths; do
    mkdir -p "$out/$(dir_of "$setting")"
    echo "gpu_paths: $(date +%T) $setting: the CUDA suites"
    while IFS= read -r line; do [ -n "$line" ] && run_suite "$setting" "$line" & done <<< "$suites"
  done
  wait
fi
for setting in $paths; do
  dir="$out/$(dir_of "$setting")"
  mkdir -p "$dir"
  if [ "$together" != 2 ]; then
    echo "gpu_paths: $(date +%T) $setting: the CUDA suites"
    while IFS= read -r line; do
      [ -n "$line" ] || continue
      if [ "$together" = 1 ]; then run_suite "$setting" "$line" & else run_suite "$setting" "$line"; fi
    done <<< "$suites"
    wait
  fi
  if [ "${BENCH:-0}" = 1 ]; then
    setting_env "$setting"
    echo "gpu_paths: $(date +%T) $setting: the benchmarks"
    env "${envs[@]}" SKIP_HF=1 "$root/tools/bench/bench_deepseek.sh" "$build" > "$dir/bench_deepseek.txt" 2>&1
    env "${envs[@]}" SKIP_HF=1 SKIP_SPECFORGE=1 "$root/tools/bench/bench_train.sh" "$build" > "$dir/bench_train.txt" 2>&1
  fi
done
grep -q "rc=[1-9]\|missing" "$out/summary.txt" && status=1
for setting in $paths; do
  for f in "$out/$(dir_of "$setting")"/test_*.txt; do
    [ -f "$f" ] && grep -a "^\[  FAILED  \] [A-Za-z]" "$f" | sed "s|^|$setting $(basename "$f" .txt): |"
  done
done >> "$out/summary.txt"
cat "$out/summary.txt"
exit $status
