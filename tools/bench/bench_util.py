#!/usr/bin/env python3
"""Small parsers and checks of tools/bench/bench_scaling.sh; each subcommand prints one JSON object.

  shard-bytes DIR                  bytes and count of DIR/shard-*.h5 (the hidden-state shards)
  compare-shards DIR_A DIR_B TOL   the two shard sets of one prepared file (h5py): per dataset
                                   (aux_hidden_states, final_hidden_states; bf16 bits -> float32) the max
                                   abs difference, the max |a| (scale), the relative L2 ||a - b|| / ||a||, the
                                   count of values more than one bf16 step apart; input_ids/sample_index
                                   must be equal; ok = relative L2 <= TOL for both datasets
  train-metrics RUN_DIR WARM       RUN_DIR/metrics.jsonl of `aerie train --log-every 1`: steps, losses,
                                   per-step seconds, mean step seconds over the steps after the first WARM
  loss-diff A.json B.json          max relative difference of the per-step losses of two train-metrics
                                   outputs on their common steps
  scaling RTOL DP1 A1.json DP2 A2.json ...
                                   the dp scaling of train-metrics outputs on one global batch, against
                                   the first (dp_ref, t_ref): per dp speedup t_ref / t_dp, efficiency
                                   (dp_ref t_ref) / (dp t_dp) and the loss difference; losses_equal when
                                   every max relative loss difference is <= RTOL
  train-log LOG                    the preemption facts of an `aerie train` log: "stopped by signal S after
                                   step N of T", "resuming from .../step-K", "done"
"""
import glob
import json
import os
import re
import sys


def shard_bytes(d):
    files = sorted(glob.glob(os.path.join(d, "shard-*.h5")))
    return {"shards": len(files), "bytes": sum(os.path.getsize(f) for f in files)}


def compare_shards(da, db, tol):
    import h5py
    import numpy as np

    def f32(bits):
        return (bits.astype(np.uint32) << 16).view(np.float32)

    fa = sorted(glob.glob(os.path.join(da, "shard-*.h5")))
    fb = sorted(glob.glob(os.path.join(db, "shard-*.h5")))
    names = [os.path.basename(p) for p in fa]
    if not fa or names != [os.path.basename(p) for p in fb]:
        return {"ok": False, "error": f"shard files differ: {len(fa)} in {da}, {len(fb)} in {db}"}
    out = {"shards": len(fa), "ok": True}
    for name in ("aux_hidden_states", "final_hidden_states"):
        n = beyond = 0
        max_abs = max_a = 0.0
        d2 = a2 = 0.0
        for pa, pb in zip(fa, fb):
            with h5py.File(pa, "r") as ha, h5py.File(pb, "r") as hb:
                for key in ("input_ids", "sample_index", "sample_offsets"):
                    if not np.array_equal(ha[key][...], hb[key][...]):
                        return {"ok": False, "error": f"{key} differs in {os.path.basename(pa)}"}
                rows = ha[name].shape[0]
                for r0 in range(0, rows, 4096):  # row blocks: a 70B shard is GBs
                    a = f32(ha[name][r0:r0 + 4096]).astype(np.float64)
                    b = f32(hb[name][r0:r0 + 4096]).astype(np.float64)
                    d = np.abs(a - b)
                    n += a.size
                    max_abs = max(max_abs, float(d.max()))
                    max_a = max(max_a, float(np.abs(a).max()))
                    d2 += float((d * d).sum())
                    a2 += float((a * a).sum())
                    step = 2.0 ** -7 * np.maximum(np.abs(a), np.abs(b)) + 1e-30  # one bf16 step (8 significant bits)
                    beyond += int((d > step).sum())
        rel = (d2 ** 0.5) / max(a2 ** 0.5, 1e-30)
        out[name] = {"values": n, "max_abs": max_abs, "max_abs_a": max_a, "rel_l2": rel,
                     "beyond_one_bf16_step": beyond}
        out["ok"] = out["ok"] and rel <= tol
    out["rel_l2_tol"] = tol
    return out


def train_metrics(run, warm):
    steps, losses, secs = [], [], []
    with open(os.path.join(run, "metrics.jsonl")) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            j = json.loads(line)
            steps.append(j["step"])
            losses.append(j["loss"])
            secs.append(j["seconds"])
    timed = secs[warm:] if len(secs) > warm else secs
    return {"steps": steps, "loss": losses, "seconds": secs,
            "mean_step_s": sum(timed) / len(timed) if timed else None, "timed_steps": len(timed)}


def loss_diff(pa, pb):
    a, b = json.load(open(pa)), json.load(open(pb))
    la, lb = dict(zip(a["steps"], a["loss"])), dict(zip(b["steps"], b["loss"]))
    common = sorted(set(la) & set(lb))
    worst = max((abs(la[s] - lb[s]) / max(abs(la[s]), 1e-30) for s in common), default=None)
    return {"common_steps": len(common), "max_rel_diff": worst}


def scaling(rtol, pairs):
    (ref_dp, ref_path), rest = pairs[0], pairs[1:]
    ref = json.load(open(ref_path))
    t_ref = ref["mean_step_s"]
    per, equal = [], True
    for dp, path in rest:
        m = json.load(open(path))
        t = m["mean_step_s"]
        d = loss_diff(ref_path, path)["max_rel_diff"]
        ok = d is not None and d <= rtol
        equal = equal and ok
        per.append({"dp": dp, "mean_step_s": t, "speedup": t_ref / t, "efficiency": ref_dp * t_ref / (dp * t),
                    "loss_max_rel_diff": d, "loss_equal": ok})
    return {"ref_dp": ref_dp, "ref_mean_step_s": t_ref, "per_dp": per, "losses_equal": equal, "loss_rtol": rtol}


def train_log(path):
    log = open(path, errors="replace").read()
    out = {"stopped_signal": None, "stopped_after": None, "resumed_from_step": None, "done": "train: done" in log}
    m = re.search(r"stopped by signal (\d+) after step (\d+) of (\d+)", log)
    if m:
        out["stopped_signal"], out["stopped_after"], out["total"] = int(m.group(1)), int(m.group(2)), int(m.group(3))
    m = re.search(r"resuming from \S*step-(\d+)", log)
    if m:
        out["resumed_from_step"] = int(m.group(1))
    m = re.search(r"train: done, final checkpoint \S*step-(\d+)", log)
    if m:
        out["final_step"] = int(m.group(1))
    return out


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "shard-bytes":
        r = shard_bytes(args[0])
    elif cmd == "compare-shards":
        r = compare_shards(args[0], args[1], float(args[2]))
    elif cmd == "train-metrics":
        r = train_metrics(args[0], int(args[1]))
    elif cmd == "loss-diff":
        r = loss_diff(args[0], args[1])
    elif cmd == "scaling":
        r = scaling(float(args[0]), [(int(args[i]), args[i + 1]) for i in range(1, len(args), 2)])
    elif cmd == "train-log":
        r = train_log(args[0])
    else:
        sys.exit(f"bench_util.py: unknown command {cmd}")
    print(json.dumps(r))


if __name__ == "__main__":
    main()
