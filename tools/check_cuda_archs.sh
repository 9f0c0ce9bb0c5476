#!/usr/bin/env bash
# Compiles aerie's CUDA kernels (and, with TARGETS, more) for the GPUs our users own, on a machine with the CUDA
# toolkit and no GPU: each architecture in its own build folder, then lists the code that the kernel library
# holds. What runs on each: sm_120 (RTX PRO 6000 Blackwell, RTX 50xx) and sm_100a (B200 / B300) take
# the mma.sync kernels with the tiles that fit their shared memory (core/gpu_limits.h); the wgmma kernels are
# sm_90a's only, and tcgen05 kernels for sm_100a do not exist yet. Running them needs such a GPU; on an H100
# the same kernel paths run with AERIE_CUDA_EMULATE (tools/bench/gpu_paths.sh).
#
# usage: tools/check_cuda_archs.sh                 (about 10 minutes per architecture on 2 cores)
# Environment: ARCHS ("120 100a"; a value with ';' builds one binary for several), TARGETS (aerie_kernels; "aerie"
#   for the whole program), WORK (/tmp/aerie-archs: build folders WORK/<arch>), JOBS (nproc)
set -uo pipefail
case "${1:-}" in -h | --help)
  sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 0 ;;
esac
root="$(cd "$(dirname "$0")/.." && pwd)"
archs="${ARCHS:-120 100a}" targets="${TARGETS:-aerie_kernels}" work="${WORK:-/tmp/aerie-archs}"
jobs="${JOBS:-$(nproc)}"
command -v nvcc > /dev/null || [ -x /usr/local/cuda/bin/nvcc ] ||
  { echo "check_cuda_archs: no nvcc (the CUDA toolkit) on this machine" >&2; exit 2; }
status=0
mkdir -p "$work"
for arch in $archs; do
  dir="$work/${arch//;/_}"
  s=$(date +%s)
  echo "check_cuda_archs: $(date +%T) AERIE_CUDA_ARCH=$arch -> $dir"
  if cmake -S "$root" -B "$dir" -DAERIE_CUDA=ON "-DAERIE_CUDA_ARCH=$arch" > "$dir.configure.log" 2>&1 &&
     cmake --build "$dir" -j "$jobs" --target $targets > "$dir.build.log" 2>&1; then
    # The PTX that each object of the kernel library embeds names its target (the toolkit may lack cuobjdump).
    code=$(grep -aoE "\.target sm_[0-9]+a?" "$dir/libaerie_kernels.a" | sort | uniq -c | sed 's/\.target //' |
           tr -s ' \n' ' ')
    echo "check_cuda_archs: $arch compiled in $(( $(date +%s) - s )) s; objects with PTX for:${code:- none}"
  else
    status=1
    echo "check_cuda_archs: $arch FAILED ($dir.configure.log, $dir.build.log):"
    grep -E "error|Error" "$dir.build.log" "$dir.configure.log" 2>/dev/null | head -n 20
  fi
done
exit $status
