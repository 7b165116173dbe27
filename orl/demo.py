"""`orl demo`: the whole loop on the embedded task, on a laptop CPU.

The task is the embedded suite's ``arith`` family (orl/recipes/suite.py): multi-term addition with
worked steps, graded strictly -- every written sum, the chain of partial sums and the final answer
must be right (`orl.tasks.arith.ArithTask(strict=True)`; the final-answer-only score is reported
beside it). 1. SFT a small block-diffusion model on it (or reuse the one already in ``--out``),
2. measure held-out accuracy and TPF with the family's decoder,
3. make the ORL start model (pathway rescaled, gamma 8), 4. run ORL, 5. measure again, 6. sweep both
models over the decoder's knob (``--sweep``, threshold for this recipe) and compare their
accuracy-vs-TPF frontiers (`orl.eval.frontier`): the headline is the frontier gain (TPF ratio at the
base's best accuracy - 1 point, with a bootstrap interval), the one-setting before/after table is
secondary. Writes ``summary.json`` (its ``frontier`` block), ``frontier.png``, ``orl_curve.png``,
``metrics.jsonl`` and ``resolved_config.json`` (both stages' configs, every ``--set-sft`` /
``--set-orl`` applied and checked before the SFT stage starts). Each stage resumes from what
``--out`` already holds, so a killed demo continues where it stopped.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import time

import torch


def _load(model_dir: str):
    from .tokenizer import load_tokenizer  # noqa: PLC0415

    from .model import load_pretrained  # noqa: PLC0415
    return load_pretrained(model_dir).eval(), load_tokenizer(model_dir)


def _eval(model_dir: str, task, n: int, dcfg) -> dict:
    """One setting: `evaluate`'s summary plus mean completion length and filler share (no records)."""
    from .eval.frontier import filler_share  # noqa: PLC0415
    from .eval.heldout import evaluate  # noqa: PLC0415
    model, tok = _load(model_dir)
    problems = task.problems("test")[:n]
    r = evaluate(model, tok, task, problems, dcfg)
    records = r.pop("records")
    fs = filler_share([tok.decode([i]) for i in x["token_ids"]] for x in records)
    r.update(mean_length=fs["mean_length"], filler_share=fs["share"])
    lenient = getattr(task, "verify_final", task.verify)  # a strict task's final-answer-only score
    by_id = {p.id: p for p in problems}
    r["final_accuracy"] = sum(lenient(by_id[x["id"]], x["completion"]) for x in records) / max(len(records), 1)
    return r


def _frontier(out: str, dirs: dict[str, str], task, n: int, dcfg, values, n_boot: int) -> dict:
    """Sweep each model over ``values`` on the first ``n`` held-out problems; the frontier block."""
    from .eval import frontier as F  # noqa: PLC0415
    rows = {}
    for name, d in dirs.items():
        model, tok = _load(d)
        rows[name] = F.sweep(model, tok, task, task.problems("test")[:n], dcfg, values)
    names = tuple(dirs)
    block = F.frontier_block(rows[names[0]], rows[names[1]], n_boot=n_boot, names=names)
    block["n"] = n
    F.plot(block["curves"], os.path.join(out, "frontier.png"), block)
    return block


def _plot(metrics_path: str, out_png: str, base: dict) -> None:
    import matplotlib  # noqa: PLC0415
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    rows = {}
    with open(metrics_path) as f:
        for line in f:
            r = json.loads(line)
            rows[r["step"]] = r
    steps = sorted(rows)
    ev = [s for s in steps if "eval_tpf" in rows[s]]
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.8))
    ax[0].plot(steps, [rows[s]["tpf"] for s in steps], label="rollout TPF (sampled)", alpha=0.6)
    ax[0].plot([0] + ev, [base["tpf"]] + [rows[s]["eval_tpf"] for s in ev], "o-", label="held-out TPF (greedy)")
    ax[0].set_xlabel("ORL step"), ax[0].set_ylabel("tokens per forward"), ax[0].legend()
    ax[1].plot(steps, [rows[s]["reward"] for s in steps], label="rollout reward", alpha=0.6)
    ax[1].plot([0] + ev, [base["accuracy"]] + [rows[s]["eval_accuracy"] for s in ev], "o-", label="held-out accuracy")
    ax[1].set_xlabel("ORL step"), ax[1].set_ylabel("accuracy"), ax[1].set_ylim(0, 1.02), ax[1].legend()
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)


def demo_configs(out: str, sft_recipe: str, orl_recipe: str, sets_sft=(), sets_orl=()) -> tuple:
    """Both stages' configs, every ``--set-sft`` / ``--set-orl`` applied and checked, the recipes'
    kinds and devices checked and the task built: a typo fails here, before the SFT stage runs."""
    from .cli import check_device  # noqa: PLC0415
    from .recipes import apply_overrides, get_recipe  # noqa: PLC0415
    from .train.loop import ORLConfig  # noqa: PLC0415
    from .train.sft import SFTConfig  # noqa: PLC0415
    from .train.sft_cli import build_task  # noqa: PLC0415
    sft = apply_overrides(get_recipe(sft_recipe, kind=SFTConfig, out=os.path.join(out, "sft")), list(sets_sft))
    orl = apply_overrides(get_recipe(orl_recipe, kind=ORLConfig, init=os.path.join(out, "start"),
                                     out=os.path.join(out, "orl")), list(sets_orl))
    check_device(sft.device, "--set-sft device")
    check_device(orl.device, "--set-orl device")
    build_task(sft.task, sft.task_kwargs)
    if (orl.task, orl.task_kwargs) != (sft.task, sft.task_kwargs):
        build_task(orl.task, orl.task_kwargs)
    return sft, orl


def run_demo(out: str, n_eval: int = 500, sft_recipe: str = "suite_sft_arith", orl_recipe: str = "orl_suite_arith",
             sets_sft=(), sets_orl=(), gamma: float = 8.0, quiet: bool = False, sweep=None,
             n_sweep: int | None = None, n_boot: int = 1000, loggers: tuple[str, ...] = ("tensorboard",)) -> dict:
    """The demo; ``sweep``: knob values of the frontier (None: the rule's default grid,
    `orl.eval.frontier.GRIDS`, plus the recipe's setting; an empty sequence: no frontier);
    ``n_sweep``: held-out problems per sweep point (None: ``n_eval``); ``loggers``: the stages'
    (`orl.train.loggers`). Writes ``out/resolved_config.json`` with both stages' configs."""
    from .model.convert import make_orl_start  # noqa: PLC0415
    from .tasks.registry import get_task  # noqa: PLC0415
    from .train.loggers import write_resolved_config  # noqa: PLC0415
    from .train.loop import train_orl  # noqa: PLC0415
    from .train.sft import train_sft  # noqa: PLC0415

    t0 = time.time()
    sft, orl = demo_configs(out, sft_recipe, orl_recipe, sets_sft, sets_orl)
    os.makedirs(out, exist_ok=True)
    write_resolved_config(out, "demo", {"sft": dataclasses.asdict(sft), "orl": dataclasses.asdict(orl),
                                        "n_eval": n_eval, "gamma": gamma, "sweep": sweep, "n_sweep": n_sweep,
                                        "n_boot": n_boot})
    print(f"[1/6] SFT of the base model ({sft.total_steps} steps) -> {sft.out}", flush=True)
    base_dir = train_sft(sft, resume=True, quiet=quiet, loggers=loggers)
    task = get_task(sft.task, **sft.task_kwargs)
    start = os.path.join(out, "start")
    dcfg = orl.eval_decode
    print(f"[2/6] held-out evaluation of the base ({n_eval} problems)", flush=True)
    base = _eval(base_dir, task, n_eval, dcfg)
    print(f"      base: accuracy {base['accuracy']:.3f}  TPF {base['tpf']:.2f}", flush=True)
    print(f"[3/6] ORL start model (residual pathway gamma = {gamma}) -> {start}", flush=True)
    if not os.path.exists(os.path.join(start, "config.json")):
        make_orl_start(base_dir, start, gamma)
    print(f"[4/6] ORL ({orl.steps} steps, {orl.prompts_per_step} prompts x {orl.group_size} rollouts)", flush=True)
    final = train_orl(orl, resume=True, quiet=quiet, loggers=loggers)
    print(f"[5/6] held-out evaluation of the ORL model ({n_eval} problems)", flush=True)
    after = _eval(final, task, n_eval, dcfg)
    print(f"      ORL: accuracy {after['accuracy']:.3f}  TPF {after['tpf']:.2f}", flush=True)
    block = None
    if sweep is None or len(sweep):
        from .eval.frontier import KNOBS, headline, knob_grid, table  # noqa: PLC0415
        values = knob_grid(dcfg, None if sweep is None else sweep)
        n_sw = n_eval if n_sweep is None else n_sweep
        print(f"[6/6] frontier: both models at {KNOBS[dcfg.rule]} {', '.join(f'{v:g}' for v in values)} "
              f"({n_sw} problems each)", flush=True)
        block = _frontier(out, {"base": base_dir, "orl": final}, task, n_sw, dcfg, values, n_boot)
    keys = ("accuracy", "final_accuracy", "tpf", "tpf_no_commit", "steps_per_block", "mean_length", "filler_share")
    summary = {"base": {k: base[k] for k in keys}, "orl": {k: after[k] for k in keys}, "n_eval": n_eval,
               "tpf_ratio": after["tpf"] / max(base["tpf"], 1e-9),
               "accuracy_delta_points": 100 * (after["accuracy"] - base["accuracy"]),
               "decode": dcfg.to_dict(), "machine": f"{platform.machine()} {os.cpu_count()} cpu, torch {torch.__version__}",
               "seconds": time.time() - t0}
    if block is not None:
        summary["frontier"] = block
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    metrics = os.path.join(orl.out, "metrics.jsonl")
    if os.path.exists(metrics):
        _plot(metrics, os.path.join(out, "orl_curve.png"), base)
    print(f"\nOne setting ({_setting(dcfg)}, n = {n_eval}; secondary: read both models on their frontiers):\n")
    print("| model | held-out accuracy | final answer only | TPF (with commit) | TPF (no commit) | steps/block | "
          "mean length | filler |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in (("base (SFT)", base), ("ORL", after)):
        print(f"| {name} | {100 * r['accuracy']:.1f}% | {100 * r['final_accuracy']:.1f}% | {r['tpf']:.2f} | {r['tpf_no_commit']:.2f} | "
              f"{r['steps_per_block']:.2f} | {r['mean_length']:.1f} | {100 * r['filler_share']:.1f}% |")
    print(f"\none setting: TPF x{summary['tpf_ratio']:.2f}, accuracy {summary['accuracy_delta_points']:+.1f} points")
    if block is not None:
        print(f"\nAccuracy vs TPF, {block['n']} held-out problems per setting (* = on the model's frontier):\n")
        print(table(block))
        print(f"\n{headline(block)}")
    print(f"\n{summary['seconds'] / 60:.1f} min; wrote {out}/summary.json"
          + (f" and {out}/frontier.png" if block is not None else ""))
    return summary


def _setting(dcfg) -> str:
    from .eval.frontier import KNOBS  # noqa: PLC0415
    field = KNOBS.get(dcfg.rule)
    return f"rule {dcfg.rule}, {field} {getattr(dcfg, field):g}" if field else f"rule {dcfg.rule}"


def build_parser() -> argparse.ArgumentParser:
    from .cli import HelpFormatter  # noqa: PLC0415
    from .train.sft_cli import add_logger_arg  # noqa: PLC0415
    ap = argparse.ArgumentParser(prog="orl demo", description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("--out", default="runs/demo", help="run directory (each stage resumes from what it holds)")
    ap.add_argument("--n-eval", type=int, default=500, help="held-out problems of the before/after evaluation")
    ap.add_argument("--sft-recipe", default="suite_sft_arith", help="SFT recipe of the base (arith_sft / orl_arith: "
                    "the same task graded on the final answer only, the demo before the suite)")
    ap.add_argument("--orl-recipe", default="orl_suite_arith", help="ORL recipe of the ORL stage")
    ap.add_argument("--set-sft", action="append", default=[], metavar="KEY=VALUE",
                    help="override a field of the SFT recipe (repeatable; as orl sft --set)")
    ap.add_argument("--set-orl", action="append", default=[], metavar="KEY=VALUE",
                    help="override a field of the ORL recipe (repeatable; as orl train --set); both are checked "
                         "before the SFT stage starts")
    ap.add_argument("--gamma", type=float, default=8.0, help="pathway re-parameterisation of the ORL start model "
                                                             "(orl convert scrp --gamma)")
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    ap.add_argument("--sweep", default=None, metavar="V1,V2,...",
                    help="knob values of the frontier sweep (default: the decoder rule's grid plus the recipe's "
                         "setting; 'off': no sweep)")
    ap.add_argument("--n-sweep", type=int, default=None, help="held-out problems per sweep point (default: --n-eval)")
    ap.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples of the frontier gain's interval")
    add_logger_arg(ap)
    return ap


def cli(argv: list[str]) -> int:
    from .train.loggers import parse_loggers  # noqa: PLC0415
    a = build_parser().parse_args(argv)
    loggers = parse_loggers(a.logger)
    sweep = None if a.sweep is None else (() if a.sweep == "off" else [float(v) for v in a.sweep.split(",") if v])
    run_demo(a.out, a.n_eval, a.sft_recipe, a.orl_recipe, a.set_sft, a.set_orl, a.gamma, a.quiet, sweep=sweep,
             n_sweep=a.n_sweep, n_boot=a.n_boot, loggers=loggers)
    return 0
