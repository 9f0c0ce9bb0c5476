#!/usr/bin/env python3
"""vLLM's Marlin MoE kernel (W4A16, group-wise INT4 experts) on Kimi-K2.5's MoE shape: the anchor of the INT4 expert
GEMM of tools/bench/bench_deepseek.sh (issue: the user's GPUs, item 2).

What vLLM 0.26.0 runs for a compressed-tensors pack-quantized INT4 MoE (MARLIN WNA16, as it picked serving the
Kimi-K2.5 fixture): `fused_marlin_moe` (vllm/model_executor/layers/fused_moe/experts/marlin_moe.py) =
moe_align_block_size, moe_wna16_marlin_gemm over gate/up (uint4b8, fp32 reduce), SiLU-and-mul, moe_wna16_marlin_gemm
over down with the router weights, the sum over the top-k. This script calls the same two custom ops of the released
wheel's `vllm/_moe_C_stable_libtorch.abi3.so` directly (torch.ops._moe_C, loaded alone with its scalar_type.py beside
it: tools/bench/marlin_bundle.sh), with the same block size rule, so that the 38-80 MB vLLM tree need not travel.
SiLU-and-mul is torch's (unfused: vLLM's kernel lives in the larger _C library), so "experts_gemm_ms" (alignment, both
GEMMs, the sum) is also given without it.

Weights are random bits in Marlin's packed layout (every bit pattern is a valid INT4 value; the layout of the repacked
tensors as gptq_marlin_moe_repack makes them: w13 [E, H/16, 2 I * 2] int32, w2 [E, I/16, H * 2] int32; scales
[E, H/32, 2 I] and [E, I/32, H] bf16), the router's top-k uniform random (distinct experts per token), inputs U(-1, 1).
"block_ms" adds what aerie's MoE block (bench_deepseek's "moe" line) also computes, in torch bf16: the router's
[H, E] GEMM with sigmoid and top-k, and the shared expert's gate/up and down GEMMs; FLOPs are counted as
bench_deepseek.cc counts them (active parameters: top_k + shared experts, 3 H I each, and the router).

Prints one JSON line per --tokens T. Usage:
  python3 tools/bench/marlin_moe.py BUNDLE_DIR [--tokens 2048,8192] [--iters 10] [--experts 384] [--top-k 8]
                                    [--hidden 7168] [--intermediate 2048] [--group 32] [--shared 1]
BUNDLE_DIR holds _moe_C_stable_libtorch.abi3.so and scalar_type.py of the vllm==0.26.0 wheel.
"""
import argparse
import importlib.util
import json
import os
import sys



def int_list(text):
    try:
        v = [int(t) for t in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"a comma-separated list of token counts, got '{text}'")
    if not v or min(v) < 1:
        raise argparse.ArgumentTypeError(f"token counts must be positive, got '{text}'")
    return v


def load_bundle(folder):
    torch.ops.load_library(os.path.join(folder, "_moe_C_stable_libtorch.abi3.so"))
    spec = importlib.util.spec_from_file_location("vllm_scalar_type", os.path.join(folder, "scalar_type.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules["vllm_scalar_type"] = mod
    spec.loader.exec_module(mod)
    return mod.scalar_types.uint4b8.id


def block_size_m(m, topk, experts):
    # fused_marlin_moe's rule (marlin_moe.py): the first of 8 .. 64 rows per block that leaves < 0.9 blocks an expert
    for b in [8, 16, 32, 48, 64]:
        if m * topk / experts / b < 0.9:
            break
    return b


def align(topk_ids, experts, block):
    # moe_align_block_size's buffers (fused_moe/moe_align_block_size.py)
    padded = topk_ids.numel() + experts * (block - 1)
    if topk_ids.numel() < experts:
        padded = min(topk_ids.numel() * block, padded)
    sorted_ids = torch.empty(padded, dtype=torch.int32, device=topk_ids.device)
    expert_ids = torch.empty((padded + block - 1) // block, dtype=torch.int32, device=topk_ids.device)
    post_pad = torch.empty(1, dtype=torch.int32, device=topk_ids.device)
    torch.ops._moe_C.moe_align_block_size(topk_ids, experts, block, sorted_ids, expert_ids, post_pad, None)
    return sorted_ids, expert_ids, post_pad


def marlin_gemm(x, out, w, scales, ws, sorted_ids, expert_ids, post_pad, topk_w, block, top_k, mul_w, qtype, m, n, k):
    return torch.ops._moe_C.moe_wna16_marlin_gemm(
        x, out, w, None, scales, None, None, None, None, None, ws, sorted_ids, expert_ids, post_pad, topk_w,
        block, top_k, mul_w, qtype, m, n, k, True, False, True, False, -1, -1, -1)


def main():
    ap = argparse.ArgumentParser(description="vLLM 0.26.0's Marlin MoE on Kimi-K2.5's MoE shape (this file's header)")
    ap.add_argument("bundle", help="the folder tools/bench/marlin_bundle.sh's archive unpacks into")
    ap.add_argument("--tokens", type=int_list, default=[2048, 8192])
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--experts", type=int, default=384)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--intermediate", type=int, default=2048)
    ap.add_argument("--group", type=int, default=32)
    ap.add_argument("--shared", type=int, default=1)
    a = ap.parse_args()
    global torch, F, timed  # imported after the options, so that --help and a bad option need no torch
    import torch
    import torch.nn.functional as F

    from hf_reference import timed  # tools/bench/hf_reference.py, beside this script
    qtype = load_bundle(a.bundle)
    dev = torch.device("cuda")
    E, H, I, K, G = a.experts, a.hidden, a.intermediate, a.top_k, a.group
    gen = torch.Generator(device=dev).manual_seed(0)
    bits = lambda *shape: torch.randint(-2**31, 2**31 - 1, shape, dtype=torch.int32, device=dev, generator=gen)
    scl = lambda *shape: (torch.rand(*shape, device=dev, generator=gen) * 0.01 + 0.005).to(torch.bfloat16)
    w13, w2 = bits(E, H // 16, 2 * I * 2), bits(E, I // 16, H * 2)
    s13, s2 = scl(E, H // G, 2 * I), scl(E, I // G, H)
    router = (torch.rand(E, H, device=dev, generator=gen) * 2 - 1).mul_(H ** -0.5).to(torch.bfloat16)
    shared_gu = (torch.rand(2 * I * a.shared, H, device=dev, generator=gen) * 2 - 1).mul_(H ** -0.5).to(torch.bfloat16)
    shared_d = (torch.rand(H, I * a.shared, device=dev, generator=gen) * 2 - 1).mul_(I ** -0.5).to(torch.bfloat16)
    ws = torch.zeros(torch.cuda.get_device_properties(dev).multi_processor_count * 4, dtype=torch.int32, device=dev)

    for T in a.tokens:
        x = (torch.rand(T, H, device=dev, generator=gen) * 2 - 1).to(torch.bfloat16)
        topk_ids = torch.rand(T, E, device=dev, generator=gen).topk(K, dim=1).indices.to(torch.int32)
        topk_w = torch.softmax(torch.rand(T, K, device=dev, generator=gen), dim=1)
        block = block_size_m(T, K, E)
        c13 = torch.empty(T * K, 2 * I, dtype=torch.bfloat16, device=dev)
        c3 = torch.empty(T * K, H, dtype=torch.bfloat16, device=dev)
        act = torch.empty(T * K, I, dtype=torch.bfloat16, device=dev)

        def experts(ids=topk_ids, wts=topk_w, activation=True):
            sorted_ids, expert_ids, post_pad = align(ids, E, block)
            marlin_gemm(x, c13, w13, s13, ws, sorted_ids, expert_ids, post_pad, wts, block, K, False, qtype,
                        T, 2 * I, H)
            if activation:
                torch.mul(F.silu(c13[:, :I]), c13[:, I:], out=act)
            marlin_gemm(act, c3, w2, s2, ws, sorted_ids, expert_ids, post_pad, wts, block, 1, True, qtype,
                        T * K, H, I)
            return c3.view(T, K, H).sum(dim=1)

        def block_fn():
            scores = torch.sigmoid((x @ router.t()).float())
            w, ids = scores.topk(K, dim=1)
            w = w / w.sum(dim=1, keepdim=True)
            routed = experts(ids.to(torch.int32), w)
            gu = x @ shared_gu.t()
            shared = (F.silu(gu[:, :I * a.shared]) * gu[:, I * a.shared:]) @ shared_d.t()
            return routed + shared

        out = experts()
        assert torch.isfinite(out).all(), "Marlin MoE gave non-finite outputs"
        experts_ms = timed(experts, 3, a.iters) * 1e3
        gemm_ms = timed(lambda: experts(activation=False), 3, a.iters) * 1e3
        block_ms = timed(block_fn, 3, a.iters) * 1e3
        flops = 2.0 * ((K + a.shared) * 3.0 * H * I + H * E) * T
        routed_flops = 2.0 * K * 3.0 * H * I * T
        print(json.dumps({
            "bench": "marlin_moe", "impl": "vllm-0.26.0 moe_wna16_marlin_gemm", "gpu": torch.cuda.get_device_name(),
            "experts": E, "top_k": K, "hidden": H, "intermediate": I, "group": G, "tokens": T, "block_size_m": block,
            "experts_ms": round(experts_ms, 3), "experts_gemm_ms": round(gemm_ms, 3), "block_ms": round(block_ms, 3),
            "experts_tflops": round(routed_flops / experts_ms * 1e-9, 1),
            "block_tflops": round(flops / block_ms * 1e-9, 1)}), flush=True)


if __name__ == "__main__":
    main()
