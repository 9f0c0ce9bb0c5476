#!/usr/bin/env python3
"""SpecForge's own EAGLE-3 trainer on aerie's hidden-state shards (issue 15, item 4).

Trains a draft with the specforge wheel (0.2.0) on the samples of an `aerie extract` folder, so that aerie's
drafts and SpecForge's can be compared on the same data with the same hyperparameters; the draft is saved as
an export folder that `aerie eval --draft` reads (and vLLM / SGLang load).

What runs is SpecForge's offline path, its modules called in the order its trainer calls them:
  - data: each shard sample becomes SpecForge's raw offline sample (`input_ids`, `loss_mask`, `hidden_state`
    = the target's final hidden state z_t, the lm_head input, `aux_hidden_state` = the three aux hidden states
    concatenated), through its own `normalize_offline_sample` (the max_len cut, the last loss-mask position
    cleared) and `DataCollatorWithPadding`; the order is a fresh permutation of the training samples each
    epoch (torch.randperm with the seed);
  - the model: its `LlamaForCausalLMEagle3` (draft init as its constructor does it, so a random lm_head), the
    target's embedding copied and frozen, d2t/t2d from aerie's draft vocabulary, its `OnlineEagle3Model`
    (TTT of --ttt-steps, the soft cross-entropy of its LogSoftmaxLoss, a mean over the [B, T] rows) wrapped
    in its `Eagle3TrainStrategy` with its frozen `TargetHead` (the single shift of TargetHead.preprocess: the
    target at position t is lm_head(z_{t+1}), the input token x_{t+1}) and the 0.8^i step weights;
  - the step: loss / accumulation, backward, and at each boundary its `BF16Optimizer.step` (fp32 masters,
    clipping at --max-grad-norm, torch AdamW with betas 0.9/0.999 and no weight decay, its cosine schedule
    with --warmup-ratio), as TrainerCore.train_step does.
Left out: its launcher and config schema, FSDP (a no-op wrap on one rank), checkpoints and logging.
The held-out samples of an aerie run (--data-split, its data_split.json) are left out of training, so both
trainers see the same training samples and `aerie eval --data-split` scores both on the same held-out ones.

Needs torch, h5py, numpy, safetensors, transformers and `pip install --no-deps specforge==0.2.0` (its
`datasets` import is stubbed when missing). Usage, as tools/bench/specforge_demo.sh runs it on the demo:
  python3 tools/bench/specforge_train.py --shards D/shards --target D/target --vocab D/draft_vocab.safetensors \
      --data-split RUN/data_split.json --output OUT --steps 1000 --batch-size 8 --accumulation 1 --lr 3e-3 \
      --warmup-ratio 0.015 --max-grad-norm 0.5 --ttt-steps 7 --seed 0 --attention sdpa
(flex_attention, SpecForge's default, compiles only for head dims of 16 or more.)
Prints one JSON line per --log-every optimizer steps ({"step", "loss", "acc_0", "lr"}) and a last line with
the output folder.
"""
import argparse
import glob
import json
import os
import sys
import time

import h5py
import numpy as np
import torch


def die(msg):
    print(f"specforge_train: {msg}", file=sys.stderr)
    sys.exit(2)


def bf16(bits):
    """uint16 bf16 bits (aerie's shard storage, docs/formats.md) -> a torch bfloat16 tensor."""
    return torch.from_numpy(np.ascontiguousarray(bits).view(np.int16)).view(torch.bfloat16)


def read_samples(shard_dir, heldout):
    """Every sample of the shards but the held-out ones, as SpecForge's raw offline samples (CPU tensors)."""
    paths = sorted(glob.glob(os.path.join(shard_dir, "shard-*.h5")))
    if not paths:
        die(f"{shard_dir}: no shard-*.h5")
    samples, aux_layers, found = [], None, 0
    for p in paths:
        shard_no = int(os.path.basename(p)[len("shard-"):-len(".h5")])
        with h5py.File(p, "r") as f:
            if f.attrs.get("format_version", 1) != 1:
                die(f"{p}: format_version {f.attrs.get('format_version')}: only bf16 shards (version 1) are read")
            aux_layers = [int(a) for a in f.attrs["aux_layers"]]
            offsets = f["sample_offsets"][:]
            index = f["sample_index"][:]
            ids = f["input_ids"][:]
            mask = f["loss_mask"][:]
            aux = f["aux_hidden_states"][:]
            final = f["final_hidden_states"][:]
            for k in range(len(index)):
                if (shard_no, k) in heldout:
                    found += 1
                    continue
                a, b = int(offsets[k]), int(offsets[k + 1])
                samples.append({
                    "input_ids": torch.from_numpy(ids[a:b].astype(np.int64)),
                    "loss_mask": torch.from_numpy(mask[a:b].astype(np.int64)),
                    "hidden_state": bf16(final[a:b]).unsqueeze(0),
                    "aux_hidden_state": bf16(aux[a:b]).unsqueeze(0),
                })
    if found != len(heldout):
        die(f"{shard_dir}: {len(heldout) - found} of the {len(heldout)} held-out samples are not in these shards")
    return samples, aux_layers


def heldout_indices(path):
    """The held-out samples of an aerie run's data_split.json as (shard number, sample k of the shard) pairs
    (docs/formats.md: its "eval" list of {"shard", "index", "global"}); empty without a file."""
    if not path:
        return set()
    with open(path) as f:
        split = json.load(f)
    if "eval" not in split:
        die(f"{path}: no \"eval\" list (not an aerie data_split.json)")
    return {(int(e["shard"]), int(e["index"])) for e in split["eval"]}


def load_tensor(model_dir, names):
    """The first of `names` found in the target's safetensors files."""
    from safetensors import safe_open
    for p in sorted(glob.glob(os.path.join(model_dir, "*.safetensors"))):
        with safe_open(p, framework="pt") as f:
            for n in names:
                if n in f.keys():
                    return f.get_tensor(n)
    die(f"{model_dir}: none of {names} in its safetensors files")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shards", required=True)
    ap.add_argument("--target", required=True, help="the target model folder (config.json, safetensors)")
    ap.add_argument("--vocab", required=True, help="aerie's draft_vocab.safetensors (d2t, t2d)")
    ap.add_argument("--data-split", default="", help="an aerie run's data_split.json: its held-out samples are not trained on")
    ap.add_argument("--output", required=True)
    ap.add_argument("--steps", type=int, default=1000, help="optimizer steps")
    ap.add_argument("--batch-size", type=int, default=1, help="samples per micro-batch (padded to the longest)")
    ap.add_argument("--accumulation", type=int, default=8, help="micro-batches per optimizer step")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup-ratio", type=float, default=0.015)
    ap.add_argument("--max-grad-norm", type=float, default=0.5)
    ap.add_argument("--ttt-steps", type=int, default=7)
    ap.add_argument("--max-len", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--attention", default="flex_attention", choices=["flex_attention", "sdpa"])
    ap.add_argument("--log-every", type=int, default=100)
    a = ap.parse_args()

    from safetensors.torch import load_file, save_file
    from transformers import LlamaConfig

    try:
        import datasets  # noqa: F401  specforge.data.utils imports it; the collator does not use it
    except ImportError as e:
        import types
        print(f"specforge_train: datasets does not import ({e}); a stub stands in for it", file=sys.stderr)
        sys.modules["datasets"] = types.SimpleNamespace(Dataset=object)
    from specforge.algorithms.eagle3.data import normalize_offline_sample
    from specforge.algorithms.eagle3.model import OnlineEagle3Model
    from specforge.data.utils import DataCollatorWithPadding
    from specforge.modeling.draft.llama3_eagle import LlamaForCausalLMEagle3
    from specforge.modeling.target.target_head import TargetHead
    from specforge.optimizer import BF16Optimizer
    from specforge.runtime.contracts import TrainBatch
    from specforge.training.strategies.base import Eagle3TrainStrategy

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(a.seed)
    samples, aux_layers = read_samples(a.shards, heldout_indices(a.data_split))
    if not samples:
        die(f"{a.shards}: no training sample left")
    vocab = load_file(a.vocab)
    with open(os.path.join(a.target, "config.json")) as f:
        tcfg = json.load(f)
    H = tcfg["hidden_size"]
    heads = tcfg["num_attention_heads"]
    cfg = LlamaConfig(
        hidden_size=H, intermediate_size=tcfg["intermediate_size"], num_attention_heads=heads,
        num_key_value_heads=tcfg.get("num_key_value_heads", heads), head_dim=tcfg.get("head_dim", H // heads),
        vocab_size=tcfg["vocab_size"], max_position_embeddings=tcfg.get("max_position_embeddings", 2048),
        rms_norm_eps=tcfg.get("rms_norm_eps", 1e-5), rope_theta=tcfg.get("rope_theta", 10000.0),
        rope_scaling=tcfg.get("rope_scaling"), hidden_act="silu", num_hidden_layers=1,
        tie_word_embeddings=False, pad_token_id=0)
    cfg.draft_vocab_size = int(vocab["d2t"].numel())

    draft = LlamaForCausalLMEagle3(cfg, attention_backend=a.attention)
    with torch.no_grad():
        draft.embed_tokens.weight.copy_(load_tensor(a.target, ["model.embed_tokens.weight"]))
        draft.t2d.copy_(vocab["t2d"].bool())
        draft.d2t.copy_(vocab["d2t"])
    draft.freeze_embedding()
    model = OnlineEagle3Model(draft, length=a.ttt_steps, attention_backend=a.attention).to(dev, torch.bfloat16)
    head = TargetHead(a.target)
    with torch.no_grad():
        head.fc.weight.copy_(load_tensor(a.target, ["lm_head.weight", "model.embed_tokens.weight"]))
    head.freeze_weights()
    head = head.eval().to(dev, torch.bfloat16)
    strategy = Eagle3TrainStrategy(model, target_head=head, ploss_decay=0.8)
    opt = BF16Optimizer(model, lr=a.lr, max_grad_norm=a.max_grad_norm, total_steps=a.steps,
                        warmup_ratio=a.warmup_ratio, lr_scheduler="cosine")
    collate = DataCollatorWithPadding()
    gen = torch.Generator().manual_seed(a.seed)

    def batches():
        while True:
            order = torch.randperm(len(samples), generator=gen).tolist()
            for i in range(0, len(order) - a.batch_size + 1, a.batch_size):
                feats = [normalize_offline_sample(samples[j], a.max_len) for j in order[i:i + a.batch_size]]
                yield TrainBatch(sample_ids=[str(j) for j in order[i:i + a.batch_size]], strategy="eagle3",
                                 tensors=collate(feats), metadata={"target_repr": "hidden_state"})

    print(json.dumps({"samples": len(samples), "aux_layers": aux_layers, "draft_vocab": cfg.draft_vocab_size,
                      "device": dev, "attention": a.attention, "seed": a.seed}), flush=True)
    t0 = time.time()
    it = batches()
    model.train()
    for step in range(1, a.steps + 1):
        losses, accs = [], []
        for _ in range(a.accumulation):
            out = strategy.forward_loss(next(it))
            (out.loss / a.accumulation).backward()
            losses.append(float(out.loss.detach()))
            accs.append(float(out.metrics["acces"][0]))
        lr = opt.optimizer.param_groups[0]["lr"]
        opt.step()
        if step % a.log_every == 0 or step == a.steps:
            print(json.dumps({"step": step, "loss": round(sum(losses) / len(losses), 4),
                              "acc_0": round(sum(accs) / len(accs), 4), "lr": lr,
                              "elapsed_s": round(time.time() - t0, 1)}), flush=True)

    # The export: SpecForge's checkpoint filter (draft_model.* without the frozen embedding) in bf16, and an
    # eagle3 config.json as aerie export writes it (docs/formats.md), with the shards' aux layers.
    os.makedirs(a.output, exist_ok=True)
    state = strategy.checkpoint_state_filter(model.state_dict())
    state = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v).contiguous().cpu() for k, v in state.items()}
    save_file(state, os.path.join(a.output, "model.safetensors"), metadata={"format": "pt"})
    out_cfg = {k: tcfg[k] for k in ("max_position_embeddings", "rope_theta", "rope_scaling", "rope_parameters",
                                     "rms_norm_eps", "vocab_size", "bos_token_id", "eos_token_id") if k in tcfg}
    out_cfg.update({
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": H,
        "intermediate_size": cfg.intermediate_size, "num_attention_heads": heads,
        "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim, "num_hidden_layers": 1,
        "hidden_act": "silu", "tie_word_embeddings": False, "draft_vocab_size": cfg.draft_vocab_size,
        "torch_dtype": "bfloat16", "eagle_config": {"eagle_aux_hidden_state_layer_ids": aux_layers},
        "specforge_train": {"seed": a.seed, "steps": a.steps, "batch_size": a.batch_size,
                            "accumulation": a.accumulation, "lr": a.lr, "attention": a.attention},
    })
    with open(os.path.join(a.output, "config.json"), "w") as f:
        json.dump(out_cfg, f, indent=2)
    print(json.dumps({"output": a.output, "train_s": round(time.time() - t0, 1)}), flush=True)


if __name__ == "__main__":
    main()
