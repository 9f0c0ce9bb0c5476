#!/usr/bin/env python3
"""The Hugging Face transformers + PyTorch baseline of aerie's benchmarks (issue: the CUDA backend).

Two measurements on one GPU, with random bf16 weights of a Llama-3.1-8B-shaped target
(H 4096, 32 layers, 32 heads / 8 kv heads, MLP 14336, vocabulary 128256):

  extract  transformers' LlamaModel (attn_implementation="sdpa") forward over B x T tokens with
           output_hidden_states=True (what an extraction needs), tokens/s of the forward alone.
  train    a straightforward PyTorch EAGLE-3 draft (eagle3.md sections 3-4): fc 3H->H, one decoder
           layer reading 2H, lm_head over a K-token draft vocabulary, training-time test with S steps,
           the TTT attention as one masked fp32-softmax attention over [step-0 keys; diagonal keys],
           soft cross-entropy against target probabilities, AdamW. Step time for one sample of T tokens.

Prints one JSON object per measurement (tokens/s, step time, peak GPU memory, model FLOP utilisation
against --peak-tflops). Usage on the GPU machine:
  python3 tools/bench/hf_reference.py extract --batch 16 --seq 2048
  python3 tools/bench/hf_reference.py train --seq 2048 --ttt-steps 7
"""
import argparse
import json
import math
import time

import torch
import torch.nn.functional as F

H, LAYERS, HEADS, KV, MLP, VOCAB = 4096, 32, 32, 8, 14336, 128256


def timed(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters


def bench_extract(a):
    from transformers import LlamaConfig, LlamaModel

    cfg = LlamaConfig(hidden_size=H, num_hidden_layers=a.layers, num_attention_heads=HEADS,
                      num_key_value_heads=KV, intermediate_size=MLP, vocab_size=VOCAB,
                      max_position_embeddings=max(8192, a.seq), rope_theta=500000.0,
                      attn_implementation="sdpa", torch_dtype=torch.bfloat16)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaModel(cfg).to(torch.bfloat16).eval()
    ids = torch.randint(0, VOCAB, (a.batch, a.seq), device="cuda")
    torch.cuda.reset_peak_memory_stats()

    @torch.no_grad()
    def step():
        out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
        return out.last_hidden_state

    dt = timed(step, 2, a.iters)
    tokens = a.batch * a.seq
    params = sum(p.numel() for p in model.parameters()) - VOCAB * H  # the embedding gather is no matmul
    hd = H // HEADS
    flops = 2 * params * tokens + a.layers * 2 * 2 * a.batch * a.seq * a.seq / 2 * HEADS * hd  # causal QK^T + PV
    return {"bench": "extract", "impl": f"transformers {__import__('transformers').__version__} sdpa",
            "batch": a.batch, "seq": a.seq, "layers": a.layers, "tokens_per_s": tokens / dt, "step_s": dt,
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
            "mfu": flops / dt / (a.peak_tflops * 1e12)}


class Draft(torch.nn.Module):
    """eagle3.md section 3, bf16 parameters; attention over 2H; lm_head over K ids."""

    def __init__(self, K):
        super().__init__()
        d = H // HEADS
        lin = lambda i, o: torch.nn.Linear(i, o, bias=False)
        self.fc = lin(3 * H, H)
        self.q, self.k, self.v = lin(2 * H, HEADS * d), lin(2 * H, KV * d), lin(2 * H, KV * d)
        self.o = lin(HEADS * d, H)
        self.gate, self.up, self.down = lin(H, MLP), lin(H, MLP), lin(MLP, H)
        self.lm_head = lin(H, K)
        self.norms = torch.nn.ModuleList([torch.nn.RMSNorm(H, eps=1e-5) for _ in range(4)])
        inv = 1.0 / (500000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        self.register_buffer("inv_freq", inv, persistent=False)

    def rope(self, x, pos):  # x [T, heads, d], HF rotate_half convention
        f = pos[:, None].float() * self.inv_freq[None, :]
        cos, sin = torch.cat([f.cos(), f.cos()], -1)[:, None, :], torch.cat([f.sin(), f.sin()], -1)[:, None, :]
        x1, x2 = x.float().chunk(2, -1)
        return (x.float() * cos + torch.cat([-x2, x1], -1) * sin).to(x.dtype)


def ttt_loss(m, emb, feats, tokens, target_probs, S):
    """One sample: S TTT steps, the attention of step k over the step-0 keys (causal) and the row's own
    keys of steps 1..k, as one boolean-masked fp32 softmax attention."""
    T = tokens.shape[0]
    d = H // HEADS
    h = m.fc(feats)
    keys, vals, loss = [], [], 0.0
    causal = torch.ones(T, T, dtype=torch.bool, device=h.device).tril()
    eye = torch.eye(T, dtype=torch.bool, device=h.device)
    for k in range(S):
        u = torch.roll(tokens, -(k + 1))
        pos = torch.arange(T, device=h.device) + k
        e = m.norms[0](emb[u])
        a = torch.cat([e, m.norms[1](h)], -1)
        q = m.rope(m.q(a).view(T, HEADS, d), pos)
        keys.append(m.rope(m.k(a).view(T, KV, d), pos))
        vals.append(m.v(a).view(T, KV, d))
        K_all = torch.cat(keys, 0).repeat_interleave(HEADS // KV, 1)  # [(k+1)T, HEADS, d]
        V_all = torch.cat(vals, 0).repeat_interleave(HEADS // KV, 1)
        mask = torch.cat([causal] + [eye] * k, 1)  # [T, (k+1)T]
        s = torch.einsum("thd,shd->hts", q.float(), K_all.float()) / math.sqrt(d)
        p = torch.softmax(s.masked_fill(~mask, float("-inf")), -1)
        att = torch.einsum("hts,shd->thd", p, V_all.float()).to(h.dtype).reshape(T, HEADS * d)
        y = h + m.o(att)
        o = y + m.down(F.silu(m.gate(m.norms[2](y))) * m.up(m.norms[2](y)))
        logits = m.lm_head(m.norms[3](o)).float()
        loss = loss + 0.8 ** k * -(target_probs[k] * torch.log_softmax(logits, -1)).sum(-1).mean()
        h = o
    return loss


def bench_train(a):
    torch.manual_seed(0)
    dev = "cuda"
    m = Draft(a.draft_vocab).to(dev, torch.bfloat16)
    emb = torch.randn(VOCAB, H, device=dev, dtype=torch.bfloat16) * 0.02
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4, betas=(0.9, 0.999), weight_decay=0.0)
    T, S = a.seq, a.ttt_steps
    feats = torch.randn(T, 3 * H, device=dev, dtype=torch.bfloat16)
    tokens = torch.randint(0, VOCAB, (T,), device=dev)
    target_probs = torch.softmax(torch.randn(S, T, a.draft_vocab, device=dev), -1)
    torch.cuda.reset_peak_memory_stats()

    def step():
        opt.zero_grad(set_to_none=True)
        ttt_loss(m, emb, feats, tokens, target_probs, S).backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5)
        opt.step()

    try:
        dt = timed(step, 1, a.iters)
    except torch.OutOfMemoryError as e:
        return {"bench": "train", "impl": f"pytorch {torch.__version__}", "seq": T, "ttt_steps": S,
                "oom": True, "error": str(e).splitlines()[0]}
    params = sum(p.numel() for p in m.parameters()) - 0
    # forward + backward = 3 x forward; per step: the layer and lm_head on T tokens, fc once
    layer = params - 3 * H * H - a.draft_vocab * H
    d = H // HEADS
    flops = 3 * (2 * 3 * H * H * T + S * (2 * (layer + a.draft_vocab * H) * T + 2 * 2 * HEADS * d * T * (T / 2 + S)))
    return {"bench": "train", "impl": f"pytorch {torch.__version__} (straightforward draft, fp32 softmax)",
            "seq": T, "ttt_steps": S, "draft_vocab": a.draft_vocab, "step_s": dt, "tokens_per_s": T / dt,
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30, "mfu": flops / dt / (a.peak_tflops * 1e12)}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["extract", "train"])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--layers", type=int, default=LAYERS)
    p.add_argument("--ttt-steps", type=int, default=7)
    p.add_argument("--draft-vocab", type=int, default=32000)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak of the GPU (H100/H200 SXM)")
    a = p.parse_args()
    print(json.dumps(bench_extract(a) if a.what == "extract" else bench_train(a)), flush=True)


if __name__ == "__main__":
    main()
