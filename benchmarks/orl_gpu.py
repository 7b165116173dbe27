"""The demo's recipe at a larger model size on one GPU: SFT -> eval -> ORL -> eval, one command.

    python benchmarks/orl_gpu.py --out runs/gpu --size medium [--sft-steps 2000] [--orl-steps N]

Same task, decoder and ORL objective as `orl demo`; the model is the named size ``--size`` of the
sdar family, trained and decoded on CUDA. Prints a before/after table and writes summary.json.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="runs/gpu")
    ap.add_argument("--size", default="medium")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--sft-steps", type=int, default=2000)
    ap.add_argument("--orl-steps", type=int, default=None, help="default: the recipe's (orl_arith)")
    ap.add_argument("--n-eval", type=int, default=500)
    ap.add_argument("--set-orl", action="append", default=[])
    a = ap.parse_args()
    from orl.model.convert import make_orl_start
    from orl.recipes import apply_overrides
    from orl.tasks.registry import get_task
    from orl.train.loop import train_orl
    from orl.train.sft import train_sft
    from orl.recipes.arith import arith_sft
    from orl.recipes.orl_arith import orl_arith
    t0 = time.time()
    sft = arith_sft(os.path.join(a.out, "sft"))
    sft.size, sft.device, sft.batch_size = a.size, a.device, 128
    sft.stages[0].steps, sft.stages[1].steps = int(a.sft_steps * 0.6), a.sft_steps - int(a.sft_steps * 0.6)
    sft.stages[0].lr, sft.stages[1].lr = 1e-3, 5e-4
    base_dir = train_sft(sft, quiet=True)
    t_sft = time.time() - t0
    task = get_task(sft.task, **sft.task_kwargs)
    start = os.path.join(a.out, "start")
    if not os.path.exists(os.path.join(start, "config.json")):
        make_orl_start(base_dir, start, 8.0)
    orl = apply_overrides(orl_arith(start, os.path.join(a.out, "orl")), a.set_orl)
    orl.device, orl.eval_every = a.device, 0
    if a.orl_steps is not None:
        orl.steps = a.orl_steps
    base = _eval_on(base_dir, task, a.n_eval, orl.eval_decode, a.device)
    t1 = time.time()
    final = train_orl(orl, quiet=True)
    t_orl = time.time() - t1
    after = _eval_on(final, task, a.n_eval, orl.eval_decode, a.device)
    keys = ("accuracy", "tpf", "tpf_no_commit", "steps_per_block")
    summary = {"size": a.size, "device": torch.cuda.get_device_name() if a.device == "cuda" else "cpu",
               "torch": torch.__version__, "base": {k: base[k] for k in keys}, "orl": {k: after[k] for k in keys},
               "n_eval": a.n_eval, "sft_steps": a.sft_steps, "orl_steps": orl.steps,
               "sft_seconds": t_sft, "orl_seconds": t_orl, "params": sum(p.numel() for p in
                                                                          __import__("orl.model", fromlist=["x"]).load_pretrained(final).parameters())}
    json.dump(summary, open(os.path.join(a.out, "summary.json"), "w"), indent=2)
    print(json.dumps(summary, indent=2))
    print(f"| {a.size} | base | {100 * base['accuracy']:.1f} | {base['tpf']:.2f} |")
    print(f"| {a.size} | ORL | {100 * after['accuracy']:.1f} | {after['tpf']:.2f} |")


def _eval_on(model_dir, task, n, dcfg, device):
    from transformers import AutoTokenizer
    from orl.eval.heldout import evaluate
    from orl.model import load_pretrained
    m = load_pretrained(model_dir, device=device).eval()
    r = evaluate(m, AutoTokenizer.from_pretrained(model_dir), task, task.problems("test")[:n], dcfg, batch_size=256)
    r.pop("records")
    return r


if __name__ == "__main__":
    main()
