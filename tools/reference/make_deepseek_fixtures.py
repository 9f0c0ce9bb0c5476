#!/usr/bin/env python3
"""Parity fixtures of the DeepSeek-V3-architecture targets (MLA attention, noaux_tc MoE, YaRN, block-FP8 and
INT4 weights): small RANDOM-weight models in the REAL checkpoints' tensor names and config.json layout, and the
float32 forward of Hugging Face transformers on fixed ids.

    python3 tools/reference/make_deepseek_fixtures.py [OUT_DIR]     (default tests/model/fixtures/hf)

Needs torch (CPU is enough), transformers 5.17.0, safetensors and compressed-tensors 0.20.x (README.md beside
the fixtures gives the exact commands and versions; the versions are also in each file's metadata).
Deterministic for given versions (seeded); rerun and commit the output when a model changes here.

Fixtures (hidden 64, 3 layers: layer 0 dense MLP (intermediate 192), layers 1-2 MoE (8 routed experts,
top-2, 1 shared expert); 4 heads, q_lora 32, kv_lora 32, qk_nope 16, qk_rope 8, v_head 16; vocab 256; T = 24):
  deepseek_v3       DeepseekV3ForCausalLM, BF16 weights, e_score_correction_bias F32; n_group 4 / topk_group 2,
                    routed_scaling 2.5; YaRN factor 40, original_max_position_embeddings 64, beta 32/1,
                    mscale 1/1, rope_theta 1e4, eps 1e-6. num_nextn_predict_layers 1 with a few model.layers.3.*
                    tensors (layer 3 = num_hidden_layers plays DeepSeek's MTP layer 61): a loader must skip them.
  deepseek_v3_fp8   the same weights with every Linear of attention, dense MLP, experts and shared experts
                    (and the MTP stand-in's) in block-FP8 e4m3 + weight_scale_inv F32 [ceil(N/128), ceil(K/128)]
                    (deepseek-v3.md section 5; the dense MLP's 192 gives a full and a partial block);
                    quantization_config fp8; two shards + model.safetensors.index.json.
  kimi_k25_int4     Kimi-K2.5's multimodal wrapper (model_type kimi_k25): text under language_model.model.* and
                    language_model.lm_head.weight, random vision_tower.* / mm_projector.* tensors, the routed
                    experts only in compressed-tensors pack-quantized INT4 (group 32, symmetric; packed by
                    compressed-tensors; weight_shape written I32 as the real checkpoint); n_group 1 / topk_group 1,
                    routed_scaling 2.827, moe_intermediate 64; YaRN factor 64, orig 64, beta 32/1, rope_theta
                    5e4, eps 1e-5. Built with transformers' Kimi_K25ForConditionalGeneration; its save_pretrained
                    names are renamed to the real ones (blocks.N -> layers.N and two vision/projector prefixes).
                    Two shards (text | vision + projector) + index.

Each OUT_DIR/NAME/ holds config.json (written here in the real checkpoints' layout: rope_scaling {"type": "yarn"}
+ rope_theta, torch_dtype; not transformers 5's rope_parameters/dtype), the weights, and
  reference.safetensors
      ids                   [T] I32      input ids (positions 0..T-1, no cache)
      r                     [N+1, T, H] F32  r^k = INPUT of decoder layer k (k < N); r^N = input of the final
                                             norm (the last layer's output before the norm)
      z                     [T, H] F32   output of the final norm
      logits                [T, V] F32
      router.{l}.logits     [T, E] F32   gate logits x . W_g^T (fp32) of MoE layer l (l = 1, 2)
      router.{l}.indices    [T, K] I32   selected experts, ordered by choice score (sigmoid + bias, group-masked)
                                         descending, ties at the lower index
      router.{l}.weights    [T, K] F32   their weights (unbiased sigmoid, normalized, * routed_scaling_factor)
      rope.inv_freq         [qk_rope_head_dim / 2] F32   YaRN inv_freq as transformers computes it (pair i
                                         rotates dims 2i, 2i+1 of q_pe / k_pe: interleaved)
      rope.attention_scaling [1] F32     the factor on cos/sin (1.0 here)
      attn.softmax_scale    [1] F32      qk_head_dim^-0.5 * mscale(factor, mscale_all_dim)^2
  The metadata holds the versions, the exact scalars (repr of the float64 values) and the smallest router
  margins (choice score of the K-th pick minus the (K+1)-th; group score of the last kept group minus the best
  dropped one, null where n_group = topk_group), so a test knows how far its fp32 router may drift before a
  selection flips.
For the quantized fixtures the reference is the forward of the DEQUANTIZED model: W = fp8 * scale_inv (resp.
q * scale) computed in fp32 and rounded once to bf16, as DeepSeek's weight_dequant, transformers and
compressed-tensors' decompress produce it; reference_f32_dequant.safetensors (same keys) is the forward with the
exact fp32 products instead, for an implementation that dequantizes into fp32.

The reference runs in float32 (weights as stored, widened exactly), eager attention, transformers' grouped_mm
experts path (fp32 accumulation). The same forward in float64 is run as a check; the largest |fp32 - fp64| of r,
z and the logits is printed and kept in the metadata.
"""
import copy
import json
import math
import os
import shutil
import struct
import sys
import tempfile

import compressed_tensors
import torch
import transformers
from compressed_tensors.compressors.pack_quantized import PackedQuantizationCompressor
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
from compressed_tensors.quantization.utils import calculate_qparams
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import (DeepseekV3Config, DeepseekV3ForCausalLM, Kimi_K25Config,
                          Kimi_K25ForConditionalGeneration)

T = 24
BLOCK = 128
TEXT = dict(vocab_size=256, hidden_size=64, intermediate_size=192, moe_intermediate_size=32, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8,
            num_experts_per_tok=2, kv_lora_rank=32, q_lora_rank=32, qk_rope_head_dim=8, v_head_dim=16,
            qk_nope_head_dim=16, first_k_dense_replace=1, norm_topk_prob=True, hidden_act="silu",
            attention_bias=False, tie_word_embeddings=False, num_nextn_predict_layers=0)
DS_TEXT = dict(TEXT, n_group=4, topk_group=2, routed_scaling_factor=2.5, rms_norm_eps=1e-6,
               max_position_embeddings=2560, bos_token_id=0, eos_token_id=1)
DS_YARN = {"type": "yarn", "factor": 40, "original_max_position_embeddings": 64, "beta_fast": 32, "beta_slow": 1,
           "mscale": 1.0, "mscale_all_dim": 1.0}
DS_THETA = 10000
KIMI_TEXT = dict(TEXT, moe_intermediate_size=64, n_group=1, topk_group=1, routed_scaling_factor=2.827,
                 rms_norm_eps=1e-5, max_position_embeddings=4096, bos_token_id=1, eos_token_id=2, pad_token_id=255)
KIMI_YARN = {"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 64, "beta_fast": 32.0,
             "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}
KIMI_THETA = 50000.0
KIMI_VISION = dict(patch_size=14, pos_emb_height=4, pos_emb_width=4, pos_emb_time=2, num_attention_heads=2,
                   num_hidden_layers=1, hidden_size=32, intermediate_size=64, merge_kernel_size=[2, 2])
# compressed-tensors' quantization_config as Kimi-K2.5 ships it (config.transformers-5.7.0-redump.json).
KIMI_QUANT = {
    "config_groups": {"group_0": {
        "input_activations": None, "output_activations": None, "targets": ["Linear"],
        "weights": {"actorder": None, "block_structure": None, "dynamic": False, "group_size": 32, "num_bits": 4,
                    "observer": "minmax", "observer_kwargs": {}, "strategy": "group", "symmetric": True,
                    "type": "int"}}},
    "format": "pack-quantized",
    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
    "kv_cache_scheme": None, "quant_method": "compressed-tensors", "quantization_status": "compressed"}
FP8_QUANT = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}
VERSIONS = {"transformers": transformers.__version__, "torch": torch.__version__,
            "compressed_tensors": compressed_tensors.__version__, "source": "tools/reference/make_deepseek_fixtures.py"}


def hf_rope(theta, yarn):
    """The rope_scaling block in transformers 5's rope_parameters spelling."""
    rp = {k: float(v) if k != "original_max_position_embeddings" else int(v) for k, v in yarn.items() if k != "type"}
    return dict(rp, rope_type="yarn", rope_theta=float(theta))


def ds_config():
    return DeepseekV3Config(**DS_TEXT, rope_parameters=hf_rope(DS_THETA, DS_YARN))


def kimi_config():
    return Kimi_K25Config(text_config=dict(KIMI_TEXT, model_type="deepseek_v3",
                                           rope_parameters=hf_rope(KIMI_THETA, KIMI_YARN)),
                          vision_config=KIMI_VISION, projection_hidden_size=KIMI_VISION["hidden_size"],
                          tie_word_embeddings=False)


# ---------------------------------------------------------------- config.json in the real checkpoints' layout

def ds_config_json(quantized):
    """As DeepSeek-V3's config.json (transformers 4.33 era, remote code): rope_scaling + rope_theta, torch_dtype,
    num_nextn_predict_layers 1 (the MTP layer's tensors are in the checkpoint). auto_map is left out: the remote
    code files are not shipped."""
    c = dict(architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3", attention_dropout=0.0,
             ep_size=1, initializer_range=0.02, moe_layer_freq=1, scoring_func="sigmoid", topk_method="noaux_tc",
             rope_theta=DS_THETA, rope_scaling=DS_YARN, torch_dtype="bfloat16", transformers_version="4.33.1",
             use_cache=True, **DS_TEXT)
    c["num_nextn_predict_layers"] = 1
    if quantized:
        c["quantization_config"] = FP8_QUANT
    return c


def kimi_config_json():
    """As Kimi-K2.5's config.json (remote code KimiK25ForConditionalGeneration; field set of the 5.7.0 redump, with
    the text rope block in the checkpoint's rope_scaling + rope_theta spelling and a MoonViT vision_config in the
    remote code's field names), scaled down. quantization_config at the top level and repeated in text_config."""
    text = dict(architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3", attention_dropout=0.0,
                aux_loss_alpha=0.001, ep_size=1, initializer_range=0.02, moe_layer_freq=1, scoring_func="sigmoid",
                seq_aux=True, topk_method="noaux_tc", rope_theta=KIMI_THETA, rope_scaling=KIMI_YARN,
                torch_dtype="bfloat16", use_cache=True, quantization_config=KIMI_QUANT, **KIMI_TEXT)
    v = KIMI_VISION
    vision = dict(init_pos_emb_height=v["pos_emb_height"], init_pos_emb_time=v["pos_emb_time"],
                  init_pos_emb_width=v["pos_emb_width"], merge_kernel_size=v["merge_kernel_size"],
                  merge_type="sd2_tpool", mm_hidden_size=v["hidden_size"], mm_projector_type="patchmerger",
                  model_type="", patch_size=v["patch_size"], pos_emb_type="divided_fixed", projector_hidden_act="gelu",
                  projector_ln_eps=1e-5, text_hidden_size=KIMI_TEXT["hidden_size"],
                  video_attn_type="spatial_temporal", vt_hidden_size=v["hidden_size"],
                  vt_intermediate_size=v["intermediate_size"], vt_num_attention_heads=v["num_attention_heads"],
                  vt_num_hidden_layers=v["num_hidden_layers"])
    return dict(architectures=["KimiK25ForConditionalGeneration"], model_type="kimi_k25",
                bos_token_id=KIMI_TEXT["bos_token_id"], eos_token_id=KIMI_TEXT["eos_token_id"],
                pad_token_id=KIMI_TEXT["pad_token_id"], ignore_index=-100, media_placeholder_token_id=250,
                quantization_config=KIMI_QUANT, text_config=text, tie_word_embeddings=False, torch_dtype="bfloat16",
                transformers_version="5.7.0", use_unified_vision_chunk=True,
                video_placeholder="<|kimi_k25_video_placeholder|>", vision_config=vision)


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")


# ---------------------------------------------------------------- weights

def randomize(model, seed):
    """Weights ~ U(-0.3, 0.3), norm weights ~ U(0.5, 1.5) (far from the default 1, so a skipped norm shows),
    e_score_correction_bias ~ U(-0.15, 0.15) in fp32 (comparable to the spread of the sigmoid scores, so the bias
    changes selections)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("norm1.weight") or name.endswith("norm2.weight"):
                p.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):
                p.uniform_(-0.5, 0.5)
            else:
                p.uniform_(-0.3, 0.3)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.uniform_(-0.15, 0.15)


def saved_state(model, bias_prefix):
    """The bf16 tensors exactly as save_pretrained names them, with each e_score_correction_bias put back in
    fp32 (save_pretrained of a bf16 model rounds it to bf16; real checkpoints store F32)."""
    biases = {bias_prefix + n: b.detach().clone().float()
              for n, b in model.named_buffers() if n.endswith("e_score_correction_bias")}
    with tempfile.TemporaryDirectory() as d:
        copy.deepcopy(model).to(torch.bfloat16).save_pretrained(d)
        state = {}
        for f in sorted(os.listdir(d)):
            if f.endswith(".safetensors"):
                with safe_open(os.path.join(d, f), "pt") as sf:
                    state.update({k: sf.get_tensor(k) for k in sf.keys()})
    return state, biases


def mtp_standin(prefix, h, q_lora, e, moe_i, g):
    """A few tensors of DeepSeek's MTP layer (layer num_hidden_layers): its own enorm/hnorm/eh_proj/shared_head
    and a piece of a regular decoder layer."""
    r = lambda *s: ((torch.rand(*s, generator=g) - 0.5) * 0.6).to(torch.bfloat16)
    one = lambda n: (torch.rand(n, generator=g) + 0.5).to(torch.bfloat16)
    return {prefix + "enorm.weight": one(h), prefix + "hnorm.weight": one(h),
            prefix + "eh_proj.weight": r(h, 2 * h), prefix + "shared_head.norm.weight": one(h),
            prefix + "input_layernorm.weight": one(h), prefix + "self_attn.q_a_proj.weight": r(q_lora, h),
            prefix + "mlp.gate.weight": r(e, h),
            prefix + "mlp.gate.e_score_correction_bias": (torch.rand(e, generator=g) - 0.5) * 0.3,
            prefix + "mlp.experts.0.gate_proj.weight": r(moe_i, h)}


def fp8_block_quantize(w):
    """deepseek-v3.md section 5: per 128 x 128 block (edge blocks zero-padded) scale_inv = amax / 448,
    q = e4m3(w / scale_inv). Returns q [N, K] float8_e4m3fn, scale_inv [ceil(N/128), ceil(K/128)] F32 and the
    dequantized fp32 product q * scale_inv."""
    w = w.float()
    n, k = w.shape
    rb, cb = -(-n // BLOCK), -(-k // BLOCK)
    padded = torch.zeros(rb * BLOCK, cb * BLOCK)
    padded[:n, :k] = w
    amax = padded.view(rb, BLOCK, cb, BLOCK).abs().amax(dim=(1, 3))
    scale_inv = (amax / 448.0).float()
    assert (scale_inv > 0).all()
    s_full = scale_inv.repeat_interleave(BLOCK, 0)[:n].repeat_interleave(BLOCK, 1)[:, :k]
    q = (w / s_full).to(torch.float8_e4m3fn)
    assert not torch.isnan(q.float()).any()
    return q, scale_inv, q.float() * s_full


def is_fp8_linear(name):
    """Every Linear of attention, dense MLP, experts and shared experts (not the router, norms, embed, head)."""
    if not name.endswith(".weight") or ".mlp.gate.weight" in name or "norm" in name:
        return False
    return any(s in name for s in ("self_attn.", ".mlp.experts.", ".mlp.shared_experts.", ".mlp.gate_proj.",
                                   ".mlp.up_proj.", ".mlp.down_proj.", ".eh_proj."))


def int4_pack(w, group=32):
    """compressed-tensors pack-quantized, int4 symmetric group 32 (min/max observer, as quant_router_golden.py):
    returns its weight_packed I32, weight_scale BF16, weight_shape (I64 as it writes it) and decompress()'s bf16
    dequantization, plus the exact fp32 product q * scale."""
    args = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group", group_size=group)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    n, k = w.shape
    assert k % group == 0, f"K {k} is not a multiple of the group {group}"
    wg = w.float().view(n, k // group, group)
    scale, _ = calculate_qparams(wg.amin(-1), wg.amax(-1), args)
    scale = scale.to(torch.bfloat16)
    comp = PackedQuantizationCompressor.compress({"weight": w.to(torch.bfloat16), "weight_scale": scale}, scheme)
    dec = PackedQuantizationCompressor.decompress(dict(comp), scheme)["weight"]
    assert comp["weight_packed"].dtype == torch.int32 and tuple(comp["weight_packed"].shape) == (n, k // 8)
    # Unpack by the documented formula and check it against the library's decompress.
    p = comp["weight_packed"]
    nib = torch.stack([(p >> (4 * i)) & 0xF for i in range(8)], dim=-1).reshape(n, k) - 8
    exact = nib.float() * comp["weight_scale"].float().repeat_interleave(group, 1)
    assert torch.equal(exact.to(torch.bfloat16), dec.to(torch.bfloat16)), "INT4 formula != decompress"
    return comp, dec.to(torch.bfloat16), exact


def write_checkpoint(model_dir, state, shards=None):
    """state: {name: tensor}. shards: None (model.safetensors) or a function name -> shard index 0/1 (two files
    model-0000k-of-00002.safetensors + model.safetensors.index.json, as the real checkpoints)."""
    if shards is None:
        save_file(state, os.path.join(model_dir, "model.safetensors"), metadata={"format": "pt"})
        return
    parts = [{}, {}]
    for k, v in state.items():
        parts[shards(k)][k] = v
    weight_map, total = {}, 0
    for i, part in enumerate(parts):
        fname = f"model-{i + 1:05d}-of-00002.safetensors"
        save_file(part, os.path.join(model_dir, fname), metadata={"format": "pt"})
        for k, v in part.items():
            weight_map[k] = fname
            total += v.numel() * v.element_size()
    write_json(os.path.join(model_dir, "model.safetensors.index.json"),
               {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))})


# ---------------------------------------------------------------- the reference forward

def order_selection(choice, idx, w):
    """Reorder each row's K picks by choice score descending, ties at the lower index."""
    out_i, out_w = torch.empty_like(idx), torch.empty_like(w)
    for t in range(idx.shape[0]):
        order = sorted(range(idx.shape[1]), key=lambda j: (-choice[t, idx[t, j]].item(), idx[t, j].item()))
        out_i[t], out_w[t] = idx[t, order], w[t, order]
    return out_i, out_w


def router_margins(logits, gate):
    """Smallest gap at the expert cut and at the group cut (group-masked choice scores, as the router)."""
    choice = logits.sigmoid() + gate.e_score_correction_bias.float()
    t, e = choice.shape
    g, kg, k = gate.num_group, gate.topk_group, gate.top_k
    gs = choice.view(t, g, e // g).topk(2, dim=-1)[0].sum(-1)
    gmargin = math.inf
    if kg < g:
        s = gs.sort(dim=-1, descending=True)[0]
        gmargin = (s[:, kg - 1] - s[:, kg]).min().item()
    keep = torch.zeros(t, g, dtype=torch.bool)
    keep.scatter_(1, gs.topk(kg, dim=-1)[1], True)
    masked = choice.masked_fill(~keep.repeat_interleave(e // g, 1), -math.inf)
    s = masked.sort(dim=-1, descending=True)[0]
    emargin = (s[:, k - 1] - s[:, k]).min().item()
    # How much the bias and the group limit change: picks without the bias, picks without the group mask.
    nobias = (logits.sigmoid()).topk(k, dim=-1)[1].sort(-1)[0]
    nogroup = choice.topk(k, dim=-1)[1].sort(-1)[0]
    picked = masked.topk(k, dim=-1)[1].sort(-1)[0]
    return emargin, gmargin, (nobias != picked).any(-1).sum().item(), (nogroup != picked).any(-1).sum().item()


def forward_reference(model, text_model, ids):
    """r, z, logits and the routers of `model` (text_model = its DeepseekV3Model) on ids, with hooks."""
    model.eval()
    captured, routers, handles = {}, {}, []
    layers = text_model.layers
    n = len(layers)
    for k, layer in enumerate(layers):
        def pre_hook(mod, args, kwargs, k=k):
            captured[k] = (args[0] if args else kwargs["hidden_states"]).detach().clone()
        handles.append(layer.register_forward_pre_hook(pre_hook, with_kwargs=True))
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None and hasattr(gate, "e_score_correction_bias"):
            def router_hook(mod, args, output, k=k):
                routers[k] = (mod, [o.detach().clone() for o in output])
            handles.append(gate.register_forward_hook(router_hook))

    def norm_hook(mod, args, output):
        captured[n] = args[0].detach().clone()
        captured["z"] = output.detach().clone()
    handles.append(text_model.norm.register_forward_hook(norm_hook))
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), use_cache=False, output_hidden_states=True)
    for h in handles:
        h.remove()
    hs = out.hidden_states
    for k in range(n):
        assert torch.equal(hs[k], captured[k]), f"hidden_states[{k}] differs from layer {k}'s input"
    assert not torch.equal(hs[n], captured[n]), "hidden_states[N] is expected to be the NORMED state (section 10)"
    res = {"r": torch.stack([captured[k][0] for k in range(n + 1)]), "z": captured["z"][0],
           "logits": out.logits[0]}
    margins = {}
    for k, (gate, (logits, w, idx)) in sorted(routers.items()):
        choice = logits.float().sigmoid() + gate.e_score_correction_bias.float()
        oi, ow = order_selection(choice, idx, w)
        res[f"router.{k}.logits"] = logits.float()
        res[f"router.{k}.indices"] = oi.to(torch.int32)
        res[f"router.{k}.weights"] = ow.float()
        margins[k] = router_margins(logits.float(), gate)
    return res, margins


def load_and_run(model_dir, cls, ids, dtype, text_of):
    experts = "grouped_mm" if dtype == torch.float32 else "eager"  # eager in fp64 is fp64 throughout
    model, info = cls.from_pretrained(model_dir, dtype=dtype, attn_implementation="eager", output_loading_info=True)
    # Kimi_K25ForConditionalGeneration refuses experts_implementation= and silently falls back to "eager"; the
    # experts read the text config's field at every forward, so set it there.
    model.config.get_text_config()._experts_implementation = experts
    assert all(m.config._experts_implementation == experts for m in model.modules() if hasattr(m, "gate_up_proj"))
    text = text_of(model)
    for name, b in text.named_buffers():
        if name.endswith("e_score_correction_bias"):
            # fp32 kept in an fp32 model (_keep_in_fp32_modules_strict); an fp64 model holds it in fp64
            assert b.dtype == max(dtype, torch.float32, key=lambda t: t.itemsize) and b.abs().min() > 0, name
    res, margins = forward_reference(model, text, ids)
    rot, attn = text.rotary_emb, text.layers[0].self_attn
    res["rope.inv_freq"] = rot.inv_freq.float().clone()
    res["rope.attention_scaling"] = torch.tensor([rot.attention_scaling], dtype=torch.float32)
    res["attn.softmax_scale"] = torch.tensor([attn.scaling], dtype=torch.float32)
    scalars = {"rope.inv_freq": repr(rot.inv_freq.double().tolist()),
               "rope.attention_scaling": repr(float(rot.attention_scaling)),
               "attn.softmax_scale": repr(float(attn.scaling)),
               "rope_interleave": repr(bool(model.config.get_text_config().rope_interleave))}
    return res, margins, scalars, info


def reference(model_dir, cls, ids, text_of, check=None):
    """The fp32 goldens of the checkpoint in model_dir (transformers-loadable), checked against float64."""
    res, margins, scalars, info = load_and_run(model_dir, cls, ids, torch.float32, text_of)
    if check:
        check(info)
    res64, _, _, _ = load_and_run(model_dir, cls, ids, torch.float64, text_of)
    dev = {k: (res[k].double() - res64[k]).abs().max().item() for k in ("r", "z", "logits")}
    for k in res:
        if k.endswith(".indices"):
            assert torch.equal(res[k], res64[k]), f"{k}: fp32 and fp64 select different experts"
    meta = dict(VERSIONS, **scalars)
    meta["fp32_minus_fp64_max"] = json.dumps(dev)
    meta["router_min_margin"] = json.dumps({str(k): {"expert_cut": m[0], "group_cut": m[1] if m[1] < math.inf else None}
                                            for k, m in margins.items()})
    return res, meta, margins, dev


def save_reference(path, res, ids, meta):
    """F32/I32 tensors in the safetensors format, written here (not with safetensors' save_file, which orders
    the metadata keys at random) so that a rerun gives the same bytes."""
    out = {"ids": torch.tensor(ids, dtype=torch.int32)}
    out.update({k: v.detach().float() if v.is_floating_point() else v for k, v in res.items()})
    header, blobs, off = {"__metadata__": dict(sorted(meta.items()))}, [], 0
    for k, v in out.items():
        data = v.contiguous().numpy().tobytes()
        dt = {torch.float32: "F32", torch.int32: "I32"}[v.dtype]
        header[k] = {"dtype": dt, "shape": list(v.shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def summary(name, model_dir, res, margins, dev):
    files = sorted(os.listdir(model_dir))
    size = sum(os.path.getsize(os.path.join(model_dir, f)) for f in files)
    print(f"{name}: {files} {size} bytes")
    print(f"  |logits|max {res['logits'].abs().max().item():.3f} |r|max {res['r'].abs().max().item():.3f} "
          f"fp32-fp64 {dev}")
    print(f"  inv_freq {res['rope.inv_freq'].tolist()} attention_scaling {res['rope.attention_scaling'].item()} "
          f"softmax_scale {res['attn.softmax_scale'].item():.9f}")
    for k, (em, gm, nb, ng) in margins.items():
        print(f"  router layer {k}: min margin expert cut {em:.4g}, group cut {gm:.4g}; "
              f"tokens whose picks the bias changes {nb}/{T}, the group limit changes {ng}/{T}")


def fresh_dir(path):
    if os.path.isdir(path):
        shutil.rmtree(path)
    os.makedirs(path)


# ---------------------------------------------------------------- the fixtures

def make_deepseek(out_dir, ids):
    model = DeepseekV3ForCausalLM(ds_config())
    randomize(model, 316)
    state, biases = saved_state(model, "")
    state.update(biases)
    c = model.config
    state.update(mtp_standin(f"model.layers.{c.num_hidden_layers}.", c.hidden_size, c.q_lora_rank,
                             c.n_routed_experts, c.moe_intermediate_size, torch.Generator().manual_seed(301)))
    n = c.num_hidden_layers
    mtp = f"model.layers.{n}."

    def check(info):  # the MTP stand-in is all that transformers does not load, and nothing is missing
        assert not info["missing_keys"], info["missing_keys"]
        assert info["unexpected_keys"] and all(k.startswith(mtp) for k in info["unexpected_keys"]), info

    # deepseek_v3: BF16 (+ F32 bias), one file; the reference loads the fixture itself.
    d = os.path.join(out_dir, "deepseek_v3")
    fresh_dir(d)
    write_checkpoint(d, state)
    write_json(os.path.join(d, "config.json"), ds_config_json(False))
    res, meta, margins, dev = reference(d, DeepseekV3ForCausalLM, ids, lambda m: m.model, check)
    save_reference(os.path.join(d, "reference.safetensors"), res, ids, meta)
    summary("deepseek_v3", d, res, margins, dev)

    # deepseek_v3_fp8: the same tensors, the Linears in block FP8.
    name = "deepseek_v3_fp8"
    d = os.path.join(out_dir, name)
    fresh_dir(d)
    qstate, deq_bf16, deq_f32 = {}, dict(state), dict(state)
    for k, v in state.items():
        if is_fp8_linear(k):
            q, s, deq = fp8_block_quantize(v)
            qstate[k], qstate[k[:-len("weight")] + "weight_scale_inv"] = q, s
            deq_bf16[k], deq_f32[k] = deq.to(torch.bfloat16), deq
        else:
            qstate[k] = v
    # Shard 2 holds layer 2 and the MTP stand-in (as DeepSeek's last shard holds layer 61).
    write_checkpoint(d, qstate, shards=lambda k: 1 if k.startswith(("model.layers.2.", mtp)) else 0)
    write_json(os.path.join(d, "config.json"), ds_config_json(True))
    with tempfile.TemporaryDirectory() as tmp:  # the dequantized model, loaded by transformers without a quantizer
        refs = {}
        for tag, st in (("", deq_bf16), ("_f32_dequant", deq_f32)):
            write_checkpoint(tmp, st)
            write_json(os.path.join(tmp, "config.json"), ds_config_json(False))
            res, meta, margins, dev = reference(tmp, DeepseekV3ForCausalLM, ids, lambda m: m.model, check)
            meta["dequantization"] = ("fp8 * scale_inv in fp32, rounded to bf16" if not tag else
                                      "fp8 * scale_inv in fp32 (exact product)")
            save_reference(os.path.join(d, f"reference{tag}.safetensors"), res, ids, meta)
            refs[tag] = res
            summary(f"{name}/reference{tag}", d, res, margins, dev)
    print(f"  |bf16-rounded - exact dequant| logits max "
          f"{(refs['']['logits'] - refs['_f32_dequant']['logits']).abs().max().item():.3g}")
    return state


def kimi_names(k):
    """transformers 5.17's save_pretrained names -> Kimi-K2.5's (the K25dump tensor list)."""
    k = k.replace("language_model.model.blocks.", "language_model.model.layers.")
    k = k.replace("model.mm_projector.pre_norm.", "mm_projector.pre_norm.")
    k = k.replace("vision_tower.encoder.patch_embed.", "vision_tower.patch_embed.")
    return k


def make_kimi(out_dir, ids):
    model = Kimi_K25ForConditionalGeneration(kimi_config())
    randomize(model, 406)
    raw, biases = saved_state(model, "")
    state = {kimi_names(k): v for k, v in raw.items()}
    for k, v in biases.items():  # buffer names are the module's: model.language_model.layers.L.mlp.gate...
        state[k.replace("model.language_model.", "language_model.model.")] = v
    assert all(v.dtype == torch.float32 for k, v in state.items() if k.endswith("e_score_correction_bias"))
    assert not any(".blocks." in k for k in state if k.startswith("language_model."))
    assert all(k.startswith(("language_model.model.", "language_model.lm_head.", "vision_tower.", "mm_projector."))
               for k in state), sorted(state)

    name = "kimi_k25_int4"
    d = os.path.join(out_dir, name)
    fresh_dir(d)
    qstate, deq_bf16, deq_f32 = {}, dict(state), dict(state)
    for k, v in state.items():
        if ".mlp.experts." in k and k.endswith(".weight"):
            comp, dec, exact = int4_pack(v)
            base = k[:-len("weight")]
            qstate[base + "weight_packed"] = comp["weight_packed"]
            qstate[base + "weight_scale"] = comp["weight_scale"]
            assert comp["weight_shape"].dtype == torch.int64  # what compressed-tensors writes; Kimi-K2.5 has I32
            qstate[base + "weight_shape"] = comp["weight_shape"].to(torch.int32)
            deq_bf16[k], deq_f32[k] = dec, exact
        else:
            qstate[k] = v
    write_checkpoint(d, qstate, shards=lambda k: 0 if k.startswith("language_model.") else 1)
    write_json(os.path.join(d, "config.json"), kimi_config_json())

    def check(info):  # every text tensor is loaded by name
        text_missing = [k for k in info["missing_keys"] if "language_model" in k or k.startswith("lm_head")]
        assert not text_missing, text_missing

    with tempfile.TemporaryDirectory() as tmp:  # dequantized, real names, transformers' own config
        refs = {}
        for tag, st in (("", deq_bf16), ("_f32_dequant", deq_f32)):
            write_checkpoint(tmp, st)
            cfg = kimi_config()
            cfg.save_pretrained(tmp)
            res, meta, margins, dev = reference(tmp, Kimi_K25ForConditionalGeneration, ids,
                                                lambda m: m.model.language_model, check)
            meta["dequantization"] = ("q * weight_scale (compressed-tensors decompress, bf16)" if not tag else
                                      "q * weight_scale in fp32 (exact product)")
            save_reference(os.path.join(d, f"reference{tag}.safetensors"), res, ids, meta)
            refs[tag] = res
            summary(f"{name}/reference{tag}", d, res, margins, dev)
    print(f"  |bf16-rounded - exact dequant| logits max "
          f"{(refs['']['logits'] - refs['_f32_dequant']['logits']).abs().max().item():.3g}")


def cross_check(out_dir):
    """transformers' own loaders on the fixtures as written (needs accelerate): FineGrainedFP8Config(dequantize=True)
    on deepseek_v3_fp8 must give reference.safetensors' logits, and the compressed-tensors loader on kimi_k25_int4
    must decompress every routed expert to the bf16 dequantization the reference used."""
    try:
        import accelerate  # noqa: F401  (transformers' quantizers require it)
    except ImportError:
        print("cross-check skipped: pip install accelerate")
        return
    from transformers import FineGrainedFP8Config
    d = os.path.join(out_dir, "deepseek_v3_fp8")
    ref = safe_open(os.path.join(d, "reference.safetensors"), "pt")
    q = DeepseekV3ForCausalLM.from_pretrained(d, dtype=torch.bfloat16, attn_implementation="eager",
                                              quantization_config=FineGrainedFP8Config(dequantize=True))
    m = DeepseekV3ForCausalLM.from_pretrained(os.path.join(out_dir, "deepseek_v3"), dtype=torch.float32,
                                              attn_implementation="eager")
    m.load_state_dict({k: v.float() for k, v in q.state_dict().items()})
    m.config._experts_implementation = "grouped_mm"
    with torch.no_grad():
        logits = m(ref.get_tensor("ids").long()[None]).logits[0]
    err = (logits - ref.get_tensor("logits")).abs().max().item()
    print(f"cross-check deepseek_v3_fp8: transformers FineGrainedFP8Config(dequantize=True) logits vs reference: {err:.3g}")
    assert err < 1e-4

    d = os.path.join(out_dir, "kimi_k25_int4")
    k = Kimi_K25ForConditionalGeneration.from_pretrained(d, dtype=torch.bfloat16, attn_implementation="eager")
    f = safe_open(os.path.join(d, "model-00001-of-00002.safetensors"), "pt")

    def dequant(base):  # deepseek-v3.md section 5, rounded to bf16 as decompress
        p, s = f.get_tensor(base + "weight_packed"), f.get_tensor(base + "weight_scale")
        n, kk = f.get_tensor(base + "weight_shape").tolist()
        nib = torch.stack([(p >> (4 * i)) & 0xF for i in range(8)], -1).reshape(n, kk) - 8
        return (nib.float() * s.float().repeat_interleave(kk // s.shape[1], 1)).to(torch.bfloat16)
    text = k.model.language_model
    for layer in range(text.config.first_k_dense_replace, text.config.num_hidden_layers):
        ex = text.layers[layer].mlp.experts
        for e in range(text.config.n_routed_experts):
            b = f"language_model.model.layers.{layer}.mlp.experts.{e}."
            assert torch.equal(ex.gate_up_proj[e], torch.cat([dequant(b + "gate_proj."), dequant(b + "up_proj.")]))
            assert torch.equal(ex.down_proj[e], dequant(b + "down_proj."))
    print("cross-check kimi_k25_int4: transformers + compressed-tensors load it as written; every routed expert "
          "equals the formula's bf16 dequantization")


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "model", "fixtures", "hf")
    transformers.logging.set_verbosity_error()  # the load reports list the MTP stand-in; check() asserts on them
    torch.set_num_threads(1)  # the same summation order on every machine
    g = torch.Generator().manual_seed(12)
    ds_ids = [DS_TEXT["bos_token_id"]] + torch.randint(3, DS_TEXT["vocab_size"], (T - 1,), generator=g).tolist()
    kimi_ids = [KIMI_TEXT["bos_token_id"]] + torch.randint(3, KIMI_TEXT["vocab_size"] - 1, (T - 1,),
                                                           generator=g).tolist()
    make_deepseek(out_dir, ds_ids)
    make_kimi(out_dir, kimi_ids)
    cross_check(out_dir)


if __name__ == "__main__":
    main()
