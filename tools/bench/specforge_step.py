#!/usr/bin/env python3
"""SpecForge's own EAGLE-3 training step, the reference of tools/bench/bench_train.sh (issue 16, item 1).

What a SpecForge user's offline training step does, built from the specforge wheel (0.2.0) itself, on the
shapes of aerie's bench_train: a Llama-3.1-8B-shaped draft (H 4096, 32 / 8 heads of 128, MLP 14336,
target vocabulary 128256, draft vocabulary --draft-vocab), one sample of --seq tokens, --ttt-steps TTT
steps, bf16 weights, random data. Per step, as SpecForge's Eagle3TrainStrategy.forward_loss and its
trainer run it:
  - the frozen target head over the stored final hidden state (TargetHead.preprocess's shift, then the
    [V, H] lm_head GEMM: full-vocabulary target logits);
  - OnlineEagle3Model.forward (specforge.algorithms.eagle3.model): the target distribution on the draft
    vocabulary (_compute_target_p, torch.compile), fc over the three aux hidden states, the TTT loop of
    LlamaForCausalLMEagle3 (specforge.modeling.draft.llama3_eagle) with --attention (flex_attention, its
    default for training, or sdpa), the soft cross-entropy per TTT step and the accuracy metrics;
  - the loss sum(0.8^i loss_i) (ploss_decay), its backward, and SpecForge's BF16Optimizer.step (fp32
    master weights, grad-norm clipping at 0.5, AdamW, its cosine scheduler, the copy back to bf16).
Left out: data loading and collation, the target model's forward (offline capture), distributed
all-reduces, logging and checkpointing. The embedding is frozen (SpecForge copies the target's).

Prints one JSON object per --seq: step time, tokens/s, peak GPU memory (torch.cuda.max_memory_allocated)
and MFU with the FLOPs that tools/bench/hf_reference.py and bench_train count. A run that does not fit
prints the line with "oom": true.

Usage on the GPU machine (the wheel carried as .whl, see /work/.library/device/README.md):
  python3 tools/bench/specforge_step.py --seq 2048,8192 [--ttt-steps 7] [--iters 5] [--attention flex_attention]
"""
import argparse
import json

import torch
import torch.nn.functional as F

from hf_reference import timed  # tools/bench/hf_reference.py, beside this script

H, HEADS, KV, MLP, VOCAB = 4096, 32, 8, 14336, 128256


def build(a):
    from transformers import LlamaConfig

    from specforge.algorithms.eagle3.model import OnlineEagle3Model
    from specforge.modeling.draft.llama3_eagle import LlamaForCausalLMEagle3
    from specforge.optimizer import BF16Optimizer

    cfg = LlamaConfig(hidden_size=H, intermediate_size=MLP, num_attention_heads=HEADS, num_key_value_heads=KV,
                      head_dim=H // HEADS, vocab_size=VOCAB, max_position_embeddings=131072, rms_norm_eps=1e-5,
                      rope_theta=500000.0, hidden_act="silu", num_hidden_layers=1, tie_word_embeddings=False,
                      pad_token_id=0)
    cfg.draft_vocab_size = a.draft_vocab
    torch.manual_seed(0)
    draft = LlamaForCausalLMEagle3(cfg, attention_backend=a.attention).to("cuda", torch.bfloat16)
    with torch.no_grad():  # the vocabulary map: the first draft_vocab target ids (d2t offsets 0)
        draft.t2d.zero_()
        draft.t2d[: a.draft_vocab] = True
        draft.d2t.zero_()
    draft.embed_tokens.weight.requires_grad_(False)
    model = OnlineEagle3Model(draft, length=a.ttt_steps, attention_backend=a.attention)
    opt = BF16Optimizer(model, lr=1e-4, max_grad_norm=0.5, total_steps=100000)
    head = torch.randn(VOCAB, H, device="cuda", dtype=torch.bfloat16) * 0.02  # the frozen target lm_head
    return model, opt, head


def bench(a, T, model, opt, head):
    from specforge.utils import padding

    S = a.ttt_steps
    ids = torch.randint(0, VOCAB, (1, T), device="cuda")
    aux = torch.randn(1, T, 3 * H, device="cuda", dtype=torch.bfloat16)
    last = torch.randn(1, T, H, device="cuda", dtype=torch.bfloat16)
    attn = torch.ones(1, T, dtype=torch.long, device="cuda")
    mask = torch.ones(1, T, dtype=torch.long, device="cuda")

    def step():
        with torch.no_grad():  # TargetHead.preprocess + forward
            input_ids, target = padding(ids, left=False), padding(last, left=False)
            target = F.linear(target, head)
        loss_mask = mask[..., None]
        plosses = model(input_ids=input_ids, attention_mask=attn, loss_mask=loss_mask, target=target,
                        hidden_states=aux)[0]
        loss = sum(0.8**i * p for i, p in enumerate(plosses))
        loss.backward()
        opt.step()

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    try:
        dt = timed(step, a.warmup, a.iters)
    except torch.OutOfMemoryError as e:
        torch.cuda.empty_cache()
        return {"bench": "train", "impl": impl(a), "seq": T, "ttt_steps": S, "oom": True,
                "error": str(e).splitlines()[0]}
    d = H // HEADS
    layer = (2 * H) * (H + 2 * KV * d) + H * H + 3 * H * MLP  # q, k, v of 2H inputs, o, the MLP
    flops = 3 * (2 * 3 * H * H * T + S * (2 * (layer + a.draft_vocab * H) * T + 2 * 2 * HEADS * d * T * (T / 2 + S)))
    return {"bench": "train", "impl": impl(a), "seq": T, "ttt_steps": S, "draft_vocab": a.draft_vocab,
            "step_s": dt, "tokens_per_s": T / dt, "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
            "mfu": flops / dt / (a.peak_tflops * 1e12)}


def impl(a):
    import importlib.metadata as md

    return f"specforge {md.version('specforge')} ({a.attention}, BF16Optimizer), torch {torch.__version__}"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq", default="2048,8192", help="comma-separated sample lengths")
    p.add_argument("--ttt-steps", type=int, default=7)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--draft-vocab", type=int, default=32000)
    p.add_argument("--attention", default="flex_attention", choices=["flex_attention", "sdpa"])
    p.add_argument("--peak-tflops", type=float, default=989.0)
    a = p.parse_args()
    model, opt, head = build(a)
    for T in (int(x) for x in a.seq.split(",")):
        print(json.dumps(bench(a, T, model, opt, head)), flush=True)


if __name__ == "__main__":
    main()
