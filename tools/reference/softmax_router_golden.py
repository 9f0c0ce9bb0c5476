#!/usr/bin/env python3
"""Goldens of moe_router_softmax_topk (kernels/moe_router.h): tests/kernels/fixtures/softmax_router_golden.safetensors.

transformers' own routers with an identity gate weight (hidden_size = E), so that the stored logits are exactly the
router logits:
  qwen3.*        Qwen3MoeTopKRouter, E 16, top-k 4, norm_topk_prob true
  qwen3_nonorm.* the same logits, norm_topk_prob false (Qwen3MoeConfig's default)
  mixtral.*      MixtralTopKRouter, E 8, top-k 2 (always renormalized)
Each case holds 24 rows: 20 random (N(0, 1.5^2)) and 4 constructed near ties: two logits 4e-6 apart (distinct fp32
probabilities, the pair straddling the top-k cut in two rows and inside the picks in two). Stored per case:
  <case>.logits  [T, E] F32    <case>.indices [T, k] I32    <case>.weights [T, k] F32
Indices are torch.topk's (sorted: probabilities descending); the file's metadata holds the smallest gap at the cut
(p of the k-th pick minus the (k+1)-th) so a test knows how close the near ties are. No exact ties are stored:
torch.topk's choice among equal values is not specified.

Needs torch and transformers (the versions used go into the metadata):
    python3 tools/reference/softmax_router_golden.py [--out tests/kernels/fixtures/softmax_router_golden.safetensors]
"""
import argparse
import json

import torch
import transformers
from safetensors.torch import save_file
from transformers import MixtralConfig, Qwen3MoeConfig
from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter


def logits_rows(e, k, g):
    x = torch.randn(24, e, generator=g, dtype=torch.float64).mul(1.5).float()
    for r in range(20, 24):  # near ties: at the cut (rows 20, 21) or among the picks (22, 23)
        order = x[r].argsort(descending=True)
        a, b = (order[k - 1], order[k]) if r < 22 else (order[0], order[1])
        x[r, b] = x[r, a] - 4e-6 if r % 2 == 0 else x[r, a] + 4e-6
    return x


def run(router, logits):
    with torch.no_grad():
        router.weight.copy_(torch.eye(logits.shape[1]))
        out_logits, w, idx = router(logits)
    assert torch.equal(out_logits, logits)
    p = torch.softmax(logits, dim=-1)
    srt = p.sort(dim=-1, descending=True)[0]
    k = idx.shape[1]
    assert (srt[:, k - 1] > srt[:, k]).all(), "an exact tie at the cut"
    return idx.to(torch.int32), w.float(), (srt[:, k - 1] - srt[:, k]).min().item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/kernels/fixtures/softmax_router_golden.safetensors")
    a = ap.parse_args()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1234)
    out, margins = {}, {}
    q = logits_rows(16, 4, g)
    for name, norm in (("qwen3", True), ("qwen3_nonorm", False)):
        cfg = Qwen3MoeConfig(hidden_size=16, num_experts=16, num_experts_per_tok=4, norm_topk_prob=norm)
        idx, w, m = run(Qwen3MoeTopKRouter(cfg), q)
        out.update({f"{name}.logits": q.clone(), f"{name}.indices": idx, f"{name}.weights": w})
        margins[name] = m
    mx = logits_rows(8, 2, g)
    cfg = MixtralConfig(hidden_size=8, num_local_experts=8, num_experts_per_tok=2)
    idx, w, m = run(MixtralTopKRouter(cfg), mx)
    out.update({"mixtral.logits": mx, "mixtral.indices": idx, "mixtral.weights": w})
    margins["mixtral"] = m
    meta = {"torch": torch.__version__, "transformers": transformers.__version__,
            "source": "tools/reference/softmax_router_golden.py", "min_margin_at_cut": json.dumps(margins)}
    save_file({k: v.contiguous() for k, v in sorted(out.items())}, a.out, metadata=meta)
    print(a.out, margins)


if __name__ == "__main__":
    main()
