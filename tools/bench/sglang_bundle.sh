#!/usr/bin/env bash
# Builds SGLang 0.5.17 (the newest release that pins torch==2.11.0, the GPU machine's torch, and the first
# line with the MLA EAGLE-3 draft Eagle3DeepseekV2ForCausalLM is 0.5.12) as one compressed site-packages tree
# for the GPU machine, which has no network, so that sglang.Engine(..., speculative_algorithm="EAGLE3") runs
# there from PYTHONPATH. Runs on a machine that reaches PyPI: ~1.6 GB under /tmp, a few minutes (one xz run).
#   1. pip download --no-deps the 32 wheels listed below (what `import sglang` and the offline Engine's start
#      import at module level, less what the GPU machine has: torch 2.11 cu130, transformers, tokenizers,
#      triton, numpy, safetensors, hf_hub(+httpx, click), accelerate(+psutil, pyyaml), tiktoken(+requests,
#      regex), torchvision(+pillow), pytorch-lightning(+aiohttp via fsspec[http]), jinja2 ...)
#   2. pip install --no-deps --target BUILD/site (cp312, manylinux x86_64)
#   3. prune what an H100 never loads: sgl_kernel's sm100 ops and InfLLM ops, SGLang's Rust server/gRPC/
#      multimodal extensions and diffusion package, xgrammar's static library and debug info, console scripts
#      (bin/ninja is kept: SGLang's JIT kernels call `ninja`)
#   4. zero the GPU code for other architectures (sm80/86/100/103/120 cubins) in sgl_kernel's CUDA libraries,
#      FA3's flash_ops above all (986 MiB of cubins, 473 MiB of them sm_90). FA3_BF16_ONLY=1 also zeroes the
#      sm_90 FA3 kernels for fp16 and fp8 inputs (then only bf16 attention through FA3 works; needs zstd here).
#      NO_FA3=1 leaves FA3 out altogether (sgl_kernel loads flash_ops only when the fa3 attention backend runs):
#      the tree then serves with attention_backend="triton" (engine_eval --attention-backend triton), and packs
#      into about a third of the bytes
#   5. add IPython.display as a stub that is used only when the GPU machine has no IPython (sglang/utils.py
#      imports it at `import sglang`): site/sitecustomize.py appends site/_fallback to the end of sys.path; the
#      same file lets SGLang's config registrations replace transformers 5.17's (see there)
#   6. tar | xz into BUILD/sglang.tar.xz and print how to cut it into parts and unpack it on the GPU machine
# The tree's size and parts: docs/performance.md ("Served by vLLM", SGLang).
# usage: tools/bench/sglang_bundle.sh
# env:   WHL=/tmp/sglang-whl  BUILD=/tmp/sglang-bundle  FA3_BF16_ONLY=0  NO_FA3=0  XZ_OPT="-6 -T1"  PART_MB=50
#        EXTRA="name==ver ..." (more wheels, e.g. one that turns out missing on the GPU machine)
# On the GPU machine, after unpacking into /tmp/site:
#   export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH CUDA_HOME=/usr/local/cuda HF_HUB_OFFLINE=1
# SGLang compiles some kernels (rope, KV-cache store, activations) at first use with tvm_ffi: that needs
# nvcc (CUDA_HOME), a host c++ compiler and ninja there; set TVM_FFI_CACHE_DIR to reuse the builds.
set -euo pipefail
WHL="${WHL:-/tmp/sglang-whl}"; BUILD="${BUILD:-/tmp/sglang-bundle}"
FA3_BF16_ONLY="${FA3_BF16_ONLY:-0}"; NO_FA3="${NO_FA3:-0}"; XZ_OPT="${XZ_OPT:--6 -T1}"; PART_MB="${PART_MB:-50}"
PLAT=(--python-version 3.12 --implementation cp --only-binary=:all:)
for n in 34 28 27 26 24 17 5; do PLAT+=(--platform "manylinux_2_${n}_x86_64"); done
PLAT+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)

# name==version  bytes  wheel file           (sum: 478,878,876 bytes = 457 MiB; sglang-kernel alone 383 MB)
WHEELS="$(cat <<'EOF'
sglang==0.5.17 22299652 sglang-0.5.17-cp312-cp312-manylinux_2_34_x86_64.whl
sglang-kernel==0.4.5 382990222 sglang_kernel-0.4.5-cp310-abi3-manylinux2014_x86_64.whl
flashinfer-python==0.6.15.post1 14952951 flashinfer_python-0.6.15.post1-py3-none-any.whl
apache-tvm-ffi==0.1.11 2697683 apache_tvm_ffi-0.1.11-cp312-abi3-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl
xgrammar==0.2.1 44678489 xgrammar-0.2.1-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
ninja==1.13.2 183365 ninja-1.13.2-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl
nvidia-ml-py==13.615.71 58132 nvidia_ml_py-13.615.71-py3-none-any.whl
pyzmq==27.3.0 855178 pyzmq-27.3.0-cp312-abi3-manylinux_2_26_x86_64.manylinux_2_28_x86_64.whl
uvloop==0.23.0 4532597 uvloop-0.23.0-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.manylinux_2_28_x86_64.whl
msgspec==0.23.0 236624 msgspec-0.23.0-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.manylinux_2_28_x86_64.whl
orjson==3.13.0 130612 orjson-3.13.0-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl
pybase64==1.5.1 94689 pybase64-1.5.1-cp312-cp312-manylinux1_x86_64.manylinux2014_x86_64.manylinux_2_17_x86_64.manylinux_2_5_x86_64.whl
setproctitle==1.3.8 32929 setproctitle-1.3.8-cp312-cp312-manylinux1_x86_64.manylinux_2_28_x86_64.manylinux_2_5_x86_64.whl
partial-json-parser==0.2.1.1.post7 10877 partial_json_parser-0.2.1.1.post7-py3-none-any.whl
dill==0.4.1 120019 dill-0.4.1-py3-none-any.whl
einops==0.8.2 65638 einops-0.8.2-py3-none-any.whl
gguf==0.19.0 118475 gguf-0.19.0-py3-none-any.whl
compressed-tensors==0.20.1 260637 compressed_tensors-0.20.1-py3-none-any.whl
loguru==0.7.3 61595 loguru-0.7.3-py3-none-any.whl
openai==2.6.1 1005551 openai-2.6.1-py3-none-any.whl
distro==1.9.0 20277 distro-1.9.0-py3-none-any.whl
jiter==0.19.0 338071 jiter-0.19.0-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl
sniffio==1.3.1 10235 sniffio-1.3.1-py3-none-any.whl
fastapi==0.136.3 117481 fastapi-0.136.3-py3-none-any.whl
starlette==1.10.0 80571 starlette-1.10.0-py3-none-any.whl
annotated-doc==0.0.7 5286 annotated_doc-0.0.7-py3-none-any.whl
uvicorn==0.55.0 87457 uvicorn-0.55.0-py3-none-any.whl
pydantic==2.14.4 494865 pydantic-2.14.4-py3-none-any.whl
pydantic_core==2.50.5 2264846 pydantic_core-2.50.5-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl
annotated-types==0.8.0 13427 annotated_types-0.8.0-py3-none-any.whl
typing-inspection==0.4.5 14874 typing_inspection-0.4.5-py3-none-any.whl
typing_extensions==4.16.0 45571 typing_extensions-4.16.0-py3-none-any.whl
EOF
)"

mkdir -p "$WHL" "$BUILD"
files=(); need=()
while read -r spec _size file; do
  files+=("$WHL/$file"); [ -s "$WHL/$file" ] || need+=("$spec")
done <<< "$WHEELS"
[ ${#need[@]} -eq 0 ] || python3 -m pip download -q --no-deps "${PLAT[@]}" -d "$WHL" "${need[@]}"
for f in "${files[@]}"; do [ -s "$f" ] || { echo "sglang_bundle: missing $f" >&2; exit 1; }; done
if [ -n "${EXTRA:-}" ]; then
  read -r -a extra <<< "$EXTRA"
  xdir="$WHL/extra"; rm -rf "$xdir"; mkdir -p "$xdir"
  python3 -m pip download -q --no-deps "${PLAT[@]}" -d "$xdir" "${extra[@]}"
  for f in "$xdir"/*.whl; do files+=("$f"); done
fi
echo "sglang_bundle: ${#files[@]} wheels, $(du -cb "${files[@]}" | tail -1 | cut -f1) bytes" >&2

site="$BUILD/site"; rm -rf "$site"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
  "${PLAT[@]}" "${files[@]}" 2>&1 | grep -v -e "^WARNING: Target directory" -e "^WARNING: Running pip as" >&2 || true
cd "$site"
test -f sglang/srt/entrypoints/engine.py && test -f sgl_kernel/flash_ops.abi3.so &&
  test -f sgl_kernel/sm90/common_ops.abi3.so && test -f tvm_ffi/lib/libtvm_ffi.so && test -x bin/ninja

# --- prune ---
find bin -mindepth 1 ! -name ninja -exec rm -rf {} +
rm -rf sglang/multimodal_gen sglang/srt/server/_core.*.so sglang/srt/grpc/_core.*.so \
  sglang/srt/multimodal/_core.*.so sgl_kernel/infllm_ops.*.so sgl_kernel/sm100 xgrammar/lib/libxgrammar.a \
  flashinfer/data/cutlass/{examples,test,python,docs,media} flashinfer/data/cccl/{python,benchmarks,docs,ci,test}
[ "$NO_FA3" = 1 ] && rm -f sgl_kernel/flash_ops.abi3.so
find . -name __pycache__ -prune -exec rm -rf {} +
find . -name '*.so' -type f | while read -r so; do
  if readelf -S -W "$so" 2>/dev/null | grep -q ' \.debug_info '; then strip --strip-debug "$so"; fi
done

# --- zero GPU code an sm_90 GPU never loads (payload bytes only: ELF layout and fatbin headers unchanged) ---
fa3=(); [ -f sgl_kernel/flash_ops.abi3.so ] && fa3=(sgl_kernel/flash_ops.abi3.so)
python3 - "$FA3_BF16_ONLY" "${fa3[@]}" sgl_kernel/flashmla_ops.abi3.so \
  sgl_kernel/sm90/common_ops.abi3.so sgl_kernel/spatial_ops.abi3.so <<'PY' >&2
import struct, subprocess, sys
MAGIC, MAJOR = 0xBA55ED50, 9
bf16_only = sys.argv[1] == "1"

def section(f, name):
    f.seek(0); ident = f.read(64)
    assert ident[:4] == b"\x7fELF" and ident[4] == 2 and ident[5] == 1, "64-bit little-endian ELF only"
    shoff, = struct.unpack_from("<Q", ident, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", ident, 0x3A)
    f.seek(shoff); table = f.read(shentsize * shnum)
    hdr = lambda i: struct.unpack_from("<IIQQQQIIQQ", table, i * shentsize)
    f.seek(hdr(shstrndx)[4]); names = f.read(hdr(shstrndx)[5])
    for i in range(shnum):
        h = hdr(i)
        if names[h[0]:names.index(b"\0", h[0])] == name:
            return h[4], h[5]
    return None

def func_names(elf):
    shoff, = struct.unpack_from("<Q", elf, 0x28); shentsize, shnum, _ = struct.unpack_from("<HHH", elf, 0x3A)
    hdr = lambda i: struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize)
    out = []
    for i in range(shnum):
        h = hdr(i)
        if h[1] == 2:  # SHT_SYMTAB
            so = hdr(h[6])[4]
            for j in range(h[5] // 24):
                name, info = struct.unpack_from("<IB", elf, h[4] + j * 24)
                if info & 0xF == 2:
                    out.append(elf[so + name:elf.index(b"\0", so + name)])
    return out

def fa3_not_bf16(cubin):
    """True when every kernel of this unit is an FA3 forward kernel for fp16 or fp8 inputs."""
    if cubin[:4] != b"\x7fELF":  # zstd-compressed cubin
        cubin = subprocess.run(["zstd", "-dcq"], input=cubin, capture_output=True, check=True).stdout
    names = func_names(cubin)
    heads = [n.split(b"CollectiveEpilogue")[0] for n in names if b"FlashAttnFwdSm90" in n]
    return bool(heads) and len(heads) == len(names) and all(
        b"half_t" in h or b"float_e4m3_t" in h for h in heads)

for lib in sys.argv[2:]:
    with open(lib, "r+b") as f:
        sec = section(f, b".nv_fatbin")
        if sec is None:
            continue
        base, size = sec; f.seek(base); data = f.read(size)
        patches, kept, off = [], 0, 0
        while off + 16 <= len(data):
            magic, _v, hsz, fsz = struct.unpack_from("<IHHQ", data, off)
            if magic != MAGIC:
                off += 8; continue
            eoff, end, entries = off + hsz, off + hsz + fsz, []
            while eoff < end:
                kind, _u, ehsz, psz = struct.unpack_from("<HHIQ", data, eoff)
                arch, = struct.unpack_from("<I", data, eoff + 28)
                entries.append((kind, arch, eoff + ehsz, psz)); eoff += ehsz + psz
            has_cubin = any(k == 2 and a // 10 == MAJOR for k, a, _, _ in entries)
            for kind, arch, poff, psz in entries:
                drop = (kind == 2 and arch // 10 != MAJOR) or (kind == 1 and has_cubin)
                if not drop and bf16_only and kind == 2 and b"flash_ops" in lib.encode():
                    drop = fa3_not_bf16(data[poff:poff + psz])
                if drop:
                    patches.append((base + poff, psz))
                else:
                    kept += psz
            off = end
        for p, n in patches:
            f.seek(p); f.write(bytes(n))
    print(f"zero_fatbin: {lib}: zeroed {sum(n for _, n in patches) >> 20} MiB, kept {kept >> 20} MiB")
PY

# --- IPython.display stub, used only where no IPython is installed ---
mkdir -p _fallback/IPython
cat > _fallback/IPython/__init__.py <<'EOF'
"""Stand-in for IPython, put there by tools/bench/sglang_bundle.sh: sglang/utils.py imports IPython.display
at `import sglang`; this copy is found only when the machine has no IPython (it is last on sys.path)."""
__version__ = "0.0.0+sglang-bundle-stub"
EOF
cat > _fallback/IPython/display.py <<'EOF'
class HTML:
    def __init__(self, data=None, *args, **kwargs):
        self.data = data

    def __str__(self):
        return str(self.data)


def display(*objs, **kwargs):
    for obj in objs:
        print(obj)
EOF
cat > sitecustomize.py <<'EOF'
# From tools/bench/sglang_bundle.sh: puts <this folder>/_fallback last on sys.path (modules used only when the
# machine lacks them), lets a transformers newer than SGLang's pin take SGLang's config registrations, then runs
# the next sitecustomize on sys.path, if any.
import os as _os
import sys as _sys

# SGLang 0.5.17 registers configs of its own under names transformers 5.17 already has ('qwen3_asr' is already
# used by a Transformers config: `import sglang.srt.entrypoints.engine` fails), and transformers 5.12.1 (its pin)
# refuses the GPU machine's tokenizers 0.23.2. Here a re-registration replaces the entry instead (SGLang's class for
# that model_type, as under its pin). Done in every process, SGLang's spawned schedulers too; skipped when
# transformers is absent.
try:
    from transformers.models.auto import configuration_auto as _ca

    _register = _ca._LazyConfigMapping.register

    def _replace(self, key, value, exist_ok=False):
        return _register(self, key, value, exist_ok=True)

    _ca._LazyConfigMapping.register = _replace
except Exception:
    pass

_here = _os.path.dirname(_os.path.abspath(__file__))
_fb = _os.path.join(_here, "_fallback")
if _os.path.isdir(_fb) and _fb not in _sys.path:
    _sys.path.append(_fb)
for _p in list(_sys.path):
    _f = _os.path.join(_p or ".", "sitecustomize.py")
    if _os.path.abspath(_p or ".") not in (_here, _fb) and _os.path.isfile(_f):
        with open(_f) as _h:
            exec(compile(_h.read(), _f, "exec"), {"__name__": "sitecustomize", "__file__": _f})
        break
EOF

echo "sglang_bundle: tree $(du -sb . | cut -f1) bytes in $(find . -type f | wc -l) files; compressing (xz $XZ_OPT)" >&2
# shellcheck disable=SC2086
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf - . | xz $XZ_OPT > "$BUILD/sglang.tar.xz"
size=$(stat -c %s "$BUILD/sglang.tar.xz"); part=$((PART_MB * 1000 * 1000)); n=$(( (size + part - 1) / part ))
ls -l "$BUILD/sglang.tar.xz"
cat <<EOF
sglang_bundle: $size bytes = $n part(s) of at most $PART_MB MB. To carry them to the GPU machine, from your
checkout's root (.sglang/ stays out of git through .git/info/exclude):
  grep -qx '/.sglang/' .git/info/exclude || echo '/.sglang/' >> .git/info/exclude
  rm -rf .sglang && mkdir .sglang && split -b ${PART_MB}000000 -d -a 2 $BUILD/sglang.tar.xz .sglang/sglang.part
  (cd .sglang && sha256sum sglang.part* > sglang.sha256)
then one device call per part, back to back (the machine keeps /tmp only while warm):
  parts 1..$((n > 1 ? n - 1 : 1)): carry [".sglang/sglang.partNN"]
    command: mkdir -p /tmp/sglang-parts && mv .sglang/sglang.part* /tmp/sglang-parts/
  last part: carry [".sglang/sglang.partNN", ".sglang/sglang.sha256"]
    command: mkdir -p /tmp/sglang-parts && mv .sglang/sglang.part* /tmp/sglang-parts/ &&
      (cd /tmp/sglang-parts && sha256sum -c --quiet "\$OLDPWD/.sglang/sglang.sha256") && mkdir -p /tmp/site &&
      cat /tmp/sglang-parts/sglang.part* | xz -dc -T0 | tar -x -C /tmp/site &&
      export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:\$PATH CUDA_HOME=\${CUDA_HOME:-/usr/local/cuda} HF_HUB_OFFLINE=1 &&
      python3 -c "import sglang, sgl_kernel, flashinfer; print('sglang', sglang.__version__)" && python3 YOUR_SCRIPT.py
EOF
