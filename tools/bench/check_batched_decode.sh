#!/usr/bin/env bash
# The batched decoding attention of generate's steps (docs/performance.md, "Regenerating answers") on a GPU,
# in one go: its CUDA tests (kernel, cache appends, GQA and MLA models, the batch decoder) with
# AERIE_NO_SKIP=1, then generate's throughput with and without it (tools/bench/bench_generate.sh, the
# per-sequence path, AERIE_BATCHED_DECODE=0, first). It passed on an H100 on 2026-12-05 (docs/performance.md),
# after which the batched path became CUDA's default for GQA targets (MLA: opt-in; model/blocks.cc batched_decoding); rerun it after
# changing kernels/cuda/attention_decode.cu or the decoding steps.
# usage: tools/bench/check_batched_decode.sh BUILD_DIR OUT_DIR      (BUILD_DIR: test_kernels, test_model, aerie)
# Environment: AERIE_TEST_MODEL / AERIE_DATA as for the tests; MODEL, N, BATCH, MAX_NEW, REPEAT for the bench.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
B="${1:?usage: check_batched_decode.sh BUILD_DIR OUT_DIR}"; W="${2:?usage: check_batched_decode.sh BUILD_DIR OUT_DIR}"
mkdir -p "$W" || exit 2
export AERIE_NO_SKIP=1
rc=0
"$B/test_kernels" --gtest_filter='AttentionDecodeBatch*:ScatterRows*' >"$W/kernels.txt" 2>&1 || rc=1
grep -E "^\[  (PASSED|FAILED) " "$W/kernels.txt"
"$B/test_model" --gtest_filter='*BatchedDecoding*' >"$W/model.txt" 2>&1 || rc=1
grep -E "^\[  (PASSED|FAILED) " "$W/model.txt"
[ $rc = 0 ] || { echo "check_batched_decode: tests FAILED (logs in $W): do not use the batched path on CUDA (AERIE_BATCHED_DECODE=0) until fixed" >&2; exit 1; }
DEVICE=cuda "$root/tools/bench/bench_generate.sh" "$W/bench" "AERIE_BATCHED_DECODE=0@$B/aerie" "AERIE_BATCHED_DECODE=1@$B/aerie" || exit 1
echo "check_batched_decode: tests passed; throughput above (the second binary of each repeat is the batched path)"
