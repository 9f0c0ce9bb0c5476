#!/usr/bin/env bash
# Packs what tools/bench/marlin_moe.py needs of the released vLLM 0.26.0 wheel into one small archive for a GPU
# machine without network: vllm/_moe_C_stable_libtorch.abi3.so (the MoE custom ops, Marlin's among them) and
# vllm/scalar_type.py. The GPU code that an sm_90 GPU cannot load is zeroed first (../shared/device/vllm/
# zero_fatbin.py; the library stays loadable as is), so the archive is about 14 MB instead of the 38-80 MB tree.
# Needs PyPI (pip download) or WHEEL=path/to/vllm-0.26.0-*.whl. The wheel needs torch 2.11 on the GPU machine.
# Usage: tools/bench/marlin_bundle.sh OUT_DIR        (writes OUT_DIR/marlin-vllm026.tar.xz)
#   on the GPU machine: mkdir -p /tmp/marlin && tar -xJf marlin-vllm026.tar.xz -C /tmp/marlin
#                       python3 tools/bench/marlin_moe.py /tmp/marlin
set -euo pipefail
case "${1:-}" in -h | --help | "")
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  [ -n "${1:-}" ]; exit $? ;;
esac
root="$(cd "$(dirname "$0")/../.." && pwd)"
if [ -n "${WHEEL:-}" ] && [ ! -f "$WHEEL" ]; then echo "marlin_bundle: WHEEL=$WHEEL: no such file" >&2; exit 2; fi
out="$(mkdir -p "$1" && cd "$1" && pwd)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
wheel=${WHEEL:-}
if [ -z "$wheel" ]; then
  python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
    -d "$work/whl" vllm==0.26.0 >&2
  wheel=$(ls "$work"/whl/vllm-0.26.0-*.whl)
fi
[ -f "$wheel" ] || { echo "marlin_bundle: WHEEL=$wheel: no such file" >&2; exit 2; }
python3 - "$wheel" "$work/b" <<'PY' || exit 2
import os, sys, zipfile
try:
    z = zipfile.ZipFile(sys.argv[1])
    names = ["vllm/_moe_C_stable_libtorch.abi3.so", "vllm/scalar_type.py"]
    missing = [n for n in names if n not in z.namelist()]
except zipfile.BadZipFile:
    sys.exit(f"marlin_bundle: {sys.argv[1]} is not a wheel (zip)")
if missing or "vllm-0.26.0" not in os.path.basename(sys.argv[1]):
    sys.exit(f"marlin_bundle: {sys.argv[1]} is not vllm 0.26.0's wheel (missing: {', '.join(missing) or 'none'})")
os.makedirs(sys.argv[2], exist_ok=True)
for name in names:
    with open(os.path.join(sys.argv[2], os.path.basename(name)), "wb") as f:
        f.write(z.read(name))
PY
python3 "$root/../shared/device/vllm/zero_fatbin.py" "$work/b/_moe_C_stable_libtorch.abi3.so" >&2
tar -C "$work/b" -cf - _moe_C_stable_libtorch.abi3.so scalar_type.py | xz -T0 -9 > "$out/marlin-vllm026.tar.xz"
ls -l "$out/marlin-vllm026.tar.xz"
