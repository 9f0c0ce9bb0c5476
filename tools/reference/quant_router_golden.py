#!/usr/bin/env python3
"""Goldens of the quant and moe_router kernel families: tests/kernels/fixtures/quant_router_golden.safetensors.

Made with the libraries that define the formats (pip install torch compressed-tensors transformers
safetensors; the versions used are written to the file's metadata):
  fp8.*    torch's float8_e4m3fn cast (all 256 codes decoded; a 144 x 200 weight quantized per 128x128
           block, partial edge blocks in both dims) and the block-FP8 formula of DeepSeek-V3
           (README_WEIGHTS.md): W = fp8(w).float() * scale_inv[n // 128, k // 128], rounded to bf16.
  int4.*   compressed-tensors' PackedQuantizationCompressor (format pack-quantized, int4 symmetric group 32,
           the Kimi-K2.5 routed-expert scheme) on a 64 x 96 bf16 weight: compress() gives weight_packed /
           weight_scale / weight_shape, decompress() the dequantized bf16 golden.
  router.<case>.*  transformers' DeepseekV3TopkRouter (E=16, n_group=4, topk_group=2, top-k 4) with an identity
           gate weight (hidden_size = E) so that the stored logits are exactly the router logits; rows include
           constructed exact ties and near ties. Indices are stored reordered to aerie's documented order
           (choice score descending, then expert index ascending) with their weights; rows whose k-th
           choice ties the (k+1)-th (an exact tie at the cut, where torch.topk's introselect picks an
           arbitrary member) are flagged in tie_at_cut and also stored as the lower-index rule's pick.

Run: python tools/reference/quant_router_golden.py [--out tests/kernels/fixtures/quant_router_golden.safetensors]
"""
import argparse
import importlib.metadata as md

import torch
from safetensors.torch import save_file

from compressed_tensors.compressors.pack_quantized import PackedQuantizationCompressor
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
from compressed_tensors.quantization.utils import calculate_qparams
from transformers import DeepseekV3Config
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

BLOCK = 128


def fp8_goldens(out):
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    out["fp8.codes"] = codes
    out["fp8.codes_f32_bits"] = codes.view(torch.float8_e4m3fn).float().view(torch.int32)

    g = torch.Generator().manual_seed(1)
    n, k = 144, 200
    rb, cb = (n + BLOCK - 1) // BLOCK, (k + BLOCK - 1) // BLOCK
    # Block magnitudes spread over decades, so that scales are not all alike.
    mag = torch.exp(torch.randn(rb, cb, generator=g) * 2.0)
    w = torch.randn(n, k, generator=g) * mag.repeat_interleave(BLOCK, 0)[:n].repeat_interleave(BLOCK, 1)[:, :k]
    scale = torch.empty(rb, cb)
    for i in range(rb):
        for j in range(cb):
            scale[i, j] = w[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK].abs().max() / 448.0
    s_full = scale.repeat_interleave(BLOCK, 0)[:n].repeat_interleave(BLOCK, 1)[:, :k]
    q = (w / s_full).to(torch.float8_e4m3fn)
    assert not torch.isnan(q.float()).any()
    deq = q.float() * s_full  # the DeepSeek-V3 formula, in fp32
    out["fp8.weight"] = q
    out["fp8.weight_scale_inv"] = scale
    out["fp8.dequant_bf16"] = deq.to(torch.bfloat16)


def int4_goldens(out):
    g = torch.Generator().manual_seed(2)
    n, k, group = 64, 96, 32
    w = (torch.randn(n, k, generator=g) * 0.05).to(torch.bfloat16)
    args = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group", group_size=group)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    wg = w.float().view(n, k // group, group)
    scale, _ = calculate_qparams(wg.amin(-1), wg.amax(-1), args)
    scale = scale.to(torch.bfloat16)
    comp = PackedQuantizationCompressor.compress({"weight": w, "weight_scale": scale}, scheme)
    dec = PackedQuantizationCompressor.decompress(dict(comp), scheme)
    out["int4.weight_packed"] = comp["weight_packed"]
    out["int4.weight_scale"] = comp["weight_scale"]
    out["int4.weight_shape"] = comp["weight_shape"]
    out["int4.dequant_bf16"] = dec["weight"].to(torch.bfloat16)
    assert comp["weight_packed"].dtype == torch.int32 and comp["weight_packed"].shape == (n, k // 8)
    assert dec["weight"].dtype == torch.bfloat16


def router_rows(e, t_random, g):
    rows = [torch.randn(e, generator=g) * 2.0 for _ in range(t_random)]
    # Exact tie inside the selected set: experts 1 and 2 (group 0) equal and far above the rest.
    r = torch.randn(e, generator=g) * 0.1
    r[1] = r[2] = 4.0
    r[9] = 3.0
    rows.append(r)
    # Near tie at the cut: experts 5 and 6 differ by 2^-16 in the logit (about 50 ulps of the score,
    # far below a bf16 ulp: an fp32 router resolves it, a bf16 one would not).
    r = torch.randn(e, generator=g) * 0.1 - 2.0
    r[4], r[7] = 3.0, 2.5
    r[5], r[6] = 1.0, 1.0 + 2.0 ** -16
    rows.append(r)
    # Exact tie at the cut: experts 5 and 6 equal, each the k-th best.
    r = torch.randn(e, generator=g) * 0.1 - 2.0
    r[4], r[7], r[0] = 3.0, 2.5, 2.0
    r[5] = r[6] = 1.0
    rows.append(r)
    # Two groups tied exactly on their group score (groups 1 and 3 mirror each other), one group above.
    r = torch.full((e,), -3.0)
    r[0], r[1] = 3.0, 3.0
    r[4], r[5] = 1.0, 0.5
    r[12], r[13] = 1.0, 0.5
    rows.append(r)
    # The best single expert sits in a group whose top-2 sum loses: it must be masked out.
    r = torch.full((e,), -1.0)
    r[8] = 5.0  # group 2: 5 + (-1) top-2
    r[0], r[1], r[4], r[5] = 2.0, 2.0, 1.9, 1.9
    rows.append(r)
    # All equal: every group ties and every expert ties.
    rows.append(torch.zeros(e))
    return torch.stack(rows)


def ordered(choice, idx):
    """idx (T, k) reordered to choice descending, then index ascending (aerie's documented order)."""
    out = []
    for t in range(idx.shape[0]):
        ids = sorted(idx[t].tolist(), key=lambda i: (-choice[t, i].item(), i))
        out.append(ids)
    return torch.tensor(out, dtype=torch.int64)


def rule_topk(choice_masked, k):
    out = []
    for t in range(choice_masked.shape[0]):
        out.append(sorted(range(choice_masked.shape[1]), key=lambda i: (-choice_masked[t, i].item(), i))[:k])
    return torch.tensor(out, dtype=torch.int64)


def router_case(out, name, bias, norm_topk_prob, scaling, seed, t_random=24):
    e, n_group, topk_group, k = 16, 4, 2, 4
    # The constructed tie rows tie in choice = score + bias only where the biases tie too.
    bias = bias.clone()
    bias[2], bias[6] = bias[1], bias[5]
    bias[12:16] = bias[4:8]
    cfg = DeepseekV3Config(hidden_size=e, n_routed_experts=e, n_group=n_group, topk_group=topk_group,
                           num_experts_per_tok=k, norm_topk_prob=norm_topk_prob, routed_scaling_factor=scaling)
    router = DeepseekV3TopkRouter(cfg)
    with torch.no_grad():
        router.weight.copy_(torch.eye(e))
        router.e_score_correction_bias.copy_(bias)
    g = torch.Generator().manual_seed(seed)
    x = router_rows(e, t_random, g)
    with torch.no_grad():
        logits, weights, idx = router(x)
    assert torch.equal(logits, x), "identity gate: logits must be the inputs"
    # What the router selected on (HF's own intermediate values, recomputed the same way).
    scores = logits.sigmoid()
    choice = scores + bias
    gs = choice.view(-1, n_group, e // n_group).topk(2, dim=-1)[0].sum(-1)
    # Group selection by the lower-index rule, then expert selection among the kept groups.
    gsel = rule_topk(gs, topk_group)
    keep = torch.zeros(x.shape[0], n_group, dtype=torch.bool)
    keep.scatter_(1, gsel, True)
    masked = choice.masked_fill(~keep.repeat_interleave(e // n_group, 1), float("-inf"))
    rule = rule_topk(masked, k)
    hf = ordered(choice, idx)
    tie = torch.zeros(x.shape[0], dtype=torch.uint8)
    for t in range(x.shape[0]):
        gsort = sorted(gs[t].tolist(), reverse=True)
        msort = sorted(masked[t].tolist(), reverse=True)
        if gsort[topk_group - 1] == gsort[topk_group] or msort[k - 1] == msort[k]:
            tie[t] = 1
        elif not torch.equal(hf[t], rule[t]):
            raise SystemExit(f"{name} row {t}: HF {hf[t].tolist()} vs rule {rule[t].tolist()} without a tie")
    # Weights in aerie's order: HF's weight of each chosen expert.
    hw = []
    for t in range(x.shape[0]):
        m = dict(zip(idx[t].tolist(), weights[t].tolist()))
        hw.append([m[i] for i in hf[t].tolist()])
    p = f"router.{name}."
    out[p + "logits"] = logits.contiguous()
    out[p + "bias"] = bias.float().contiguous()
    out[p + "config"] = torch.tensor([e, n_group, topk_group, k, int(norm_topk_prob)], dtype=torch.int32)
    out[p + "routed_scaling_factor"] = torch.tensor([scaling], dtype=torch.float32)
    out[p + "hf_indices"] = hf.to(torch.int32)
    out[p + "hf_weights"] = torch.tensor(hw, dtype=torch.float32)
    out[p + "rule_indices"] = rule.to(torch.int32)
    out[p + "tie_at_cut"] = tie
    ties = [t for t in range(x.shape[0]) if tie[t]]
    for t in ties:
        print(f"{name} row {t}: tie at the cut; torch.topk picked {sorted(idx[t].tolist())}, "
              f"lower-index rule {sorted(rule[t].tolist())}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/kernels/fixtures/quant_router_golden.safetensors")
    a = ap.parse_args()
    torch.manual_seed(0)
    out = {}
    fp8_goldens(out)
    int4_goldens(out)
    g = torch.Generator().manual_seed(3)
    router_case(out, "random", (torch.rand(16, generator=g) - 0.5) * 0.2, True, 2.5, 4)
    # Every choice score negative: masked groups must lose (-inf), not win over them (a 0.0 mask would).
    neg = torch.full((16,), -1.5)
    neg[8:] = -1.2
    router_case(out, "negative_bias", neg, True, 2.5, 5)
    router_case(out, "no_norm", (torch.rand(16, generator=g) - 0.5) * 0.2, False, 1.0, 6)
    meta = {k: md.version(k) for k in ("torch", "compressed-tensors", "transformers")}
    meta["made_by"] = "tools/reference/quant_router_golden.py"
    save_file({k: v.contiguous() for k, v in out.items()}, a.out, metadata=meta)
    print("wrote", a.out, meta)


if __name__ == "__main__":
    main()
