"""Ablations of the release's Table 3a on the embedded task: full ORL and one change at a time.

    python benchmarks/ablations.py --demo runs/demo --out runs/ablations [--n-eval 500]

Needs a finished `orl demo --out runs/demo` (its SFT base and ORL start model). Each variant is an
ORL recipe in orl/recipes/orl_arith.py run from the same start model with the same seed; each is
evaluated on the same held-out problems with the same greedy decoder. Prints a markdown table.
"""
from __future__ import annotations

import argparse
import json
import os

from orl.demo import _eval
from orl.recipes import apply_overrides, get_recipe
from orl.tasks.registry import get_task
from orl.train.loop import train_orl

VARIANTS = [("full ORL", "orl_arith"), ("- AEC", "orl_arith_no_aec"), ("- reverse-KL anchor", "orl_arith_no_anchor"),
            ("- pathway scaling (gamma 1)", "orl_arith_no_scaling"), ("- residual pathway", "orl_arith_no_pathway"),
            ("off-policy (stale rollouts)", "orl_arith_offpolicy")]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--demo", default="runs/demo")
    ap.add_argument("--out", default="runs/ablations")
    ap.add_argument("--n-eval", type=int, default=500)
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--only", help="comma-separated recipe names")
    a = ap.parse_args()
    start = os.path.join(a.demo, "start")
    base_dir = os.path.join(a.demo, "sft", "final")
    rows = {}
    path = os.path.join(a.out, "ablations.json")
    if os.path.exists(path):
        rows = json.load(open(path))
    for label, recipe in VARIANTS:
        if a.only and recipe not in a.only.split(","):
            continue
        init = start
        if recipe == "orl_arith_no_scaling":  # same base, pathway left at gamma = 1
            init = os.path.join(a.out, "start-gamma1")
            if not os.path.exists(os.path.join(init, "config.json")):
                from orl.model.convert import make_orl_start
                make_orl_start(base_dir, init, gamma=1.0)
            recipe = "orl_arith"
        cfg = apply_overrides(get_recipe(recipe, init=init, out=os.path.join(a.out, label.replace(" ", "_"))), a.set)
        cfg.eval_every = 0
        final = train_orl(cfg, resume=True, quiet=True)
        task = get_task(cfg.task, **cfg.task_kwargs)
        r = _eval(final, task, a.n_eval, cfg.eval_decode)
        rows[label] = {k: r[k] for k in ("accuracy", "tpf", "tpf_no_commit", "steps_per_block")}
        os.makedirs(a.out, exist_ok=True)
        json.dump(rows, open(path, "w"), indent=2)
        print(label, rows[label], flush=True)
    base = _eval(base_dir, get_task("arith", **cfg.task_kwargs), a.n_eval, cfg.eval_decode)
    print("\n| config | held-out accuracy | TPF | steps/block |\n|---|---|---|---|")
    print(f"| base (no ORL) | {100 * base['accuracy']:.1f} | {base['tpf']:.2f} | {base['steps_per_block']:.2f} |")
    for label, r in rows.items():
        print(f"| {label} | {100 * r['accuracy']:.1f} | {r['tpf']:.2f} | {r['steps_per_block']:.2f} |")


if __name__ == "__main__":
    main()
