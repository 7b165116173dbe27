"""Run several ORL variants from one SFT base in parallel processes and evaluate each.

    python benchmarks/orl_sweep.py --base runs/demo/sft/final --out runs/sweep --jobs 4 --threads 2 \
        --variant full: --variant lr1e-4:lr=1e-4 --variant noaec:loss.lambda_aec=0

Each variant is ``name:key=value,key=value`` applied to the ``orl_arith`` recipe (``--recipe``).
All variants start from the same ORL start model (``orl convert scrp``, gamma ``--gamma``) and are
evaluated on the same held-out problems with the recipe's greedy decoder. Prints a markdown table
and writes ``sweep.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys


def _one(args) -> None:
    import torch
    torch.set_num_threads(args.threads)
    from orl.demo import _eval
    from orl.recipes import apply_overrides, get_recipe
    from orl.tasks.registry import get_task
    from orl.train.loop import train_orl
    name, sets = args.run.split(":", 1)
    cfg = get_recipe(args.recipe, init=args.start, out=os.path.join(args.out, name))
    apply_overrides(cfg, list(args.sets) + [s for s in sets.split(",") if s])
    final = train_orl(cfg, resume=True, quiet=True)
    r = _eval(final, get_task(cfg.task, **cfg.task_kwargs), args.n_eval, cfg.eval_decode)
    with open(os.path.join(args.out, name, "eval.json"), "w") as f:
        json.dump({k: r[k] for k in ("accuracy", "tpf", "tpf_no_commit", "steps_per_block", "n")}, f)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--out", default="runs/sweep")
    ap.add_argument("--recipe", default="orl_arith")
    ap.add_argument("--variant", action="append", default=[])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--n-eval", type=int, default=500)
    ap.add_argument("--gamma", type=float, default=8.0)
    ap.add_argument("--set", dest="sets", action="append", default=[],
                    help="override applied to every variant and to the base evaluation (e.g. task_kwargs.pad=true)")
    ap.add_argument("--run", help=argparse.SUPPRESS)
    ap.add_argument("--start", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.run:
        return _one(a)
    import torch
    torch.set_num_threads(a.threads)
    from orl.demo import _eval
    from orl.model.convert import make_orl_start
    from orl.recipes import apply_overrides, get_recipe
    from orl.tasks.registry import get_task
    os.makedirs(a.out, exist_ok=True)
    start = os.path.join(a.out, "start")
    if not os.path.exists(os.path.join(start, "config.json")):
        make_orl_start(a.base, start, a.gamma)
    env = {**os.environ, "OMP_NUM_THREADS": str(a.threads)}
    procs, pending = [], list(a.variant or ["full:"])
    while pending or procs:
        while pending and len(procs) < a.jobs:
            v = pending.pop(0)
            cmd = [sys.executable, __file__, "--base", a.base, "--out", a.out, "--recipe", a.recipe, "--run", v,
                   "--start", start, "--threads", str(a.threads), "--n-eval", str(a.n_eval)]
            cmd += [x for s in a.sets for x in ("--set", s)]
            procs.append((v, subprocess.Popen(cmd, env=env)))
        v, p = procs.pop(0)
        p.wait()
        if p.returncode:
            print(f"variant {v} failed ({p.returncode})", flush=True)
    cfg = apply_overrides(get_recipe(a.recipe, init=start, out=a.out), a.sets)
    base = _eval(a.base, get_task(cfg.task, **cfg.task_kwargs), a.n_eval, cfg.eval_decode)
    rows = {"base": {k: base[k] for k in ("accuracy", "tpf", "tpf_no_commit", "steps_per_block", "n")}}
    for v in a.variant or ["full:"]:
        name = v.split(":", 1)[0]
        p = os.path.join(a.out, name, "eval.json")
        if os.path.exists(p):
            rows[name] = json.load(open(p))
    json.dump(rows, open(os.path.join(a.out, "sweep.json"), "w"), indent=2)
    print("| variant | accuracy % | TPF | TPF no commit | steps/block | n |\n|---|---|---|---|---|---|")
    for k, r in rows.items():
        print(f"| {k} | {100 * r['accuracy']:.1f} | {r['tpf']:.2f} | {r['tpf_no_commit']:.2f} | "
              f"{r['steps_per_block']:.2f} | {r['n']} |")


if __name__ == "__main__":
    main()
