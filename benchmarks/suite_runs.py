"""Does ORL beat the base's own frontier? ORL and its baselines at equal training compute, per suite family.

    python benchmarks/suite_runs.py --family carry_mul --out runs/suite_runs [--base runs/calib/carry_mul/sft/final] \
        [--orl-seeds 0,1,2] [--sft-seeds 0,1] [--n-sweep 300] [--thresholds 0.1,...,0.95] [--threads 2]
    python benchmarks/suite_runs.py --task path/to/task.py:make_task [--task-kw digits=4] --recipes-from chain ...

Your own task (``--task``, as `orl sft` / `orl train` take it, with ``--task-kw``) runs every stage below
in place of a family's: the recipes (model, size, SFT steps, decoders, ORL's budget) are those of the
family ``--recipes-from`` names, with the task (and its options) replaced in each: the base's SFT, every
ORL seed and ablation, RFT, more SFT (on a fresh part of the task's stream where it takes a ``seed``)
and the sweeps. Its results go to ``--out/<--name>/`` (default: the task's ``name``).

Per family (``--out/<family>/``), each stage skipped when its output exists (a killed run continues):
  base      ``suite_sft_<family>`` at SFT seed 0 (or ``--base``: a finished SFT of that recipe, e.g. the
            calibration's); more SFT seeds (``--sft-seeds``) are swept too, for the spread of the base;
  orl_s<k>  ``orl_suite_<family>`` with ORLConfig.seed = k, from ``make_orl_start(base, gamma 8)`` (the demo's start);
  rft       ``rft_suite_<family>`` (orl.train.rft, `rft_from_orl` of ``orl_suite_<family>``): ORL's rollout budget
            and optimizer steps, plain SFT loss on the verified rollouts, from the base (``--set-orl`` does not
            reach it);
  more_sft  ``more_sft_suite_<family>`` (`orl.train.sft.more_sft_from`): the base's SFT (with ``--set-sft``,
            ``--size``) continued for ORL's number of optimizer steps at the LR it ended with;
then every model is swept over the decoder's threshold on the same ``--n-sweep`` held-out problems
(`orl.eval.frontier.sweep`) and compared with the seed-0 base on their frontiers (`frontier_block`:
TPF ratio at the base's best accuracy - 1 point with a paired bootstrap interval, and the accuracy
gain at the TPF of the base's best setting). The base's region (strict and final-only accuracy and
TPF at threshold 0.9, the TPF-doubling cost) uses benchmarks/suite_calibrate.py's `verdict`.
Writes ``--out/<family>/results.json`` (sweeps without per-problem records; those stay in
``sweeps/``) and ``--out/<family>/table.markdown``; ``--report`` rebuilds ``--out/table.markdown`` over all families.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from suite_calibrate import verdict  # noqa: E402

GRID = (0.1, 0.2, 0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
# the release's Table 3a rows (and two of our own), as overrides of orl_suite_<family>; each trained at
# every ORL seed from the same start model; each sweep decodes with its variant's eval_decode.
ABLATIONS = {"no_aec": ["loss.lambda_aec=0"], "no_anchor": ["loss.anchor=none"],
             "no_pathway": ["decode.residual=false", "eval_decode.residual=false"],
             "gamma1": [], "offpolicy": ["stale_every=10"]}
GROUPS = ("orl", *ABLATIONS)   # the names trained per seed: <group>_s<k>


def _done(d: str) -> bool:
    return os.path.exists(os.path.join(d, "config.json"))


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _stage(label: str, final: str, train) -> str:
    """``final`` when a model is already there, else ``train()`` (resumable) timed and logged."""
    if _done(final):
        return final
    _log(label)
    t = time.time()
    final = train()
    _log(f"  done in {(time.time() - t) / 60:.1f} min")
    return final


def _with_task(cfg, task: tuple[str, dict] | None):
    """``cfg`` with the user's task (spec, options) in place of the family's; None: unchanged."""
    if task is not None:
        cfg.task, cfg.task_kwargs = task[0], dict(task[1])
    return cfg


def _orl_recipe(family: str, init: str, out: str, task: tuple[str, dict] | None = None):
    """``orl_suite_<family>``, on the user's task when one is given."""
    from orl.recipes import get_recipe
    return _with_task(get_recipe(f"orl_suite_{family}", init=init, out=out), task)


def _sft_recipe(family: str, out: str, sets_sft=(), size: str | None = None, device: str | None = None,
                task: tuple[str, dict] | None = None):
    """``suite_sft_<family>`` with the run's task (None: the family's), overrides, model size and device."""
    from orl.recipes import apply_overrides, get_recipe
    cfg = apply_overrides(_with_task(get_recipe(f"suite_sft_{family}", out=out), task), list(sets_sft))
    cfg.size, cfg.device = size or cfg.size, device or cfg.device
    return cfg


def train_all(family: str, out: str, base: str | None, orl_seeds, sft_seeds, sets_orl, steps: int | None = None,
              ablations=(), baselines: bool = True, orl: bool = True, sets_sft=(), size: str | None = None,
              device: str | None = None, ablation_seeds=None, task: tuple[str, dict] | None = None) -> dict[str, str]:
    """Every model of the comparison, trained or found; name -> final model directory. ``steps``: the
    optimizer steps of ORL, RFT and more SFT alike (None: the recipes'; a smoke test's few); ``ablations``:
    names of ABLATIONS, each trained at every ORL seed; ``baselines``: also RFT and more SFT; ``orl``:
    also the full recipe (False: another process trains it; those models are then left out).
    ``sets_sft``: overrides of the base's SFT recipe (more SFT continues at its final LR and batch);
    ``size``: the base's model size (None: the recipe's `small`); ``device``: where every method trains;
    ``task``: (task spec, options) of the user's task every stage trains on (None: the family's)."""
    from orl.model.convert import make_orl_start
    from orl.recipes import apply_overrides
    from orl.train.loop import train_orl
    from orl.train.rft import rft_from_orl, train_rft
    from orl.train.sft import more_sft_from, train_sft

    dirs = {}
    for s in sft_seeds:
        name = "base" if s == 0 else f"base_s{s}"
        if s == 0 and base:
            dirs[name] = base
            continue
        cfg = _sft_recipe(family, os.path.join(out, f"sft_s{s}"), sets_sft, size, device, task)
        cfg.seed = s
        final = _stage(f"{family}: SFT seed {s} ({cfg.total_steps} steps)", os.path.join(cfg.out, "final"),
                       lambda cfg=cfg: train_sft(cfg, resume=True, quiet=True))
        dirs[name] = final
    base = dirs["base"]
    starts = {8.0: os.path.join(out, "start"), 1.0: os.path.join(out, "start_gamma1")}
    for group in ("orl", *ablations) if orl else ablations:
        gamma = 1.0 if group == "gamma1" else 8.0
        if not _done(starts[gamma]):
            make_orl_start(base, starts[gamma], gamma)
        for k in orl_seeds if group == "orl" or ablation_seeds is None else ablation_seeds:
            name = f"{group}_s{k}"
            cfg = apply_overrides(_orl_recipe(family, starts[gamma], os.path.join(out, name), task),
                                  [*sets_orl, *ABLATIONS.get(group, [])])
            cfg.seed, cfg.prompt_seed, cfg.eval_every = k, k, 0   # each seed its own prompt stream
            cfg.steps = steps or cfg.steps
            cfg.device = device or cfg.device
            label = f"{family}: {group} seed {k} ({cfg.steps} steps x {cfg.prompts_per_step} prompts x {cfg.group_size})"
            dirs[name] = _stage(label, os.path.join(cfg.out, "final"),
                                lambda cfg=cfg: train_orl(cfg, resume=True, quiet=True))
    if not baselines:
        return dirs
    rft = os.path.join(out, "rft")
    cfg = rft_from_orl(_orl_recipe(family, base, rft, task), base, rft)   # = rft_suite_<family> on the family's task
    cfg.eval_every = 0
    cfg.steps = steps or cfg.steps
    cfg.device = device or cfg.device
    label = f"{family}: RFT ({cfg.steps} steps x {cfg.prompts_per_step} prompts x {cfg.group_size})"
    final = _stage(label, os.path.join(cfg.out, "final"),
                   lambda: train_rft(cfg, resume=True, quiet=True))
    dirs["rft"] = final
    more = os.path.join(out, "more_sft")
    # = more_sft_suite_<family> on the family's task, continuing the base's SFT as this run trained it
    # (--set-sft: its batch, final LR, precision ...)
    cfg = more_sft_from(_orl_recipe(family, base, more, task), _sft_recipe(family, more, sets_sft, size, device, task),
                        base, more)
    cfg.stages[0].steps = steps or cfg.stages[0].steps
    cfg.device = device or cfg.device
    final = _stage(f"{family}: more SFT ({cfg.total_steps} steps)", os.path.join(cfg.out, "final"),
                   lambda: train_sft(cfg, resume=True, quiet=True))
    dirs["more_sft"] = final
    return dirs


def sweep_all(family: str, out: str, dirs: dict[str, str], n: int, values, device: str = "cpu",
              task: tuple[str, dict] | None = None) -> dict[str, list[dict]]:
    """Each model's sweep rows (with records), cached in ``out/sweeps/<name>.json``; each row also gets
    ``final`` (the final-answer-only accuracy, `verify_final`; a task without one: its `verify`).
    ``task``: (spec, options) of the user's task the problems come from (None: the family's)."""
    from transformers import AutoTokenizer

    from orl.eval.frontier import sweep
    from orl.model import load_pretrained
    from orl.recipes import apply_overrides, get_recipe
    from orl.recipes.suite import FAMILIES, task_of
    from orl.tasks.registry import get_task

    task = get_task(task[0], **task[1]) if task is not None else get_task(task_of(family), **FAMILIES[family][0])
    verify_final = getattr(task, "verify_final", task.verify)
    dcfg = get_recipe(f"orl_suite_{family}").eval_decode
    problems = task.problems("test")[:n]
    by_id = {p.id: p for p in problems}
    os.makedirs(os.path.join(out, "sweeps"), exist_ok=True)
    rows = {}
    for name, d in dirs.items():
        path = os.path.join(out, "sweeps", f"{name}.json")
        if os.path.exists(path):
            rows[name] = json.load(open(path))["rows"]
            continue
        _log(f"{family}: sweep {name} ({len(values)} thresholds x {len(problems)} problems)")
        model, tok = load_pretrained(d, device=device).eval(), AutoTokenizer.from_pretrained(d)
        group = name.rsplit("_s", 1)[0]   # an ablation decodes with its own eval_decode (no_pathway: no residual)
        cfg = apply_overrides(get_recipe(f"orl_suite_{family}"), ABLATIONS[group]).eval_decode \
            if group in ABLATIONS else dcfg
        r = sweep(model, tok, task, problems, cfg, values)
        for row in r:
            row["final"] = sum(verify_final(by_id[x["id"]], x["completion"]) for x in row["records"]) / len(problems)
        json.dump({"model": d, "rows": r}, open(path, "w"))
        rows[name] = r
    return rows


def _stats(xs: list) -> dict:
    xs = [x for x in xs if x is not None]
    return {"mean": statistics.mean(xs) if xs else None, "sd": statistics.stdev(xs) if len(xs) > 1 else None,
            "n": len(xs), "values": xs}


def compare(rows: dict[str, list[dict]], n_boot: int) -> dict:
    """The base's region and each model's frontier block against the seed-0 base."""
    from orl.eval.frontier import frontier_block
    base = rows["base"]
    region = {}
    for name in [n for n in rows if n.startswith("base")]:
        v = verdict([{"threshold": r["value"], "strict": r["accuracy"], "tpf": r["tpf"]} for r in rows[name]])
        at = next(r for r in rows[name] if abs(r["value"] - 0.9) < 1e-9)
        region[name] = {**v, "final": at["final"], "mean_length": at["mean_length"], "filler_share": at["filler_share"]}
    blocks = {}
    for name, r in rows.items():
        if name == "base":
            continue
        b = frontier_block(base, r, n_boot=n_boot, names=("base", name))
        at = next(x for x in r if abs(x["value"] - 0.9) < 1e-9)
        b["at_0.9"] = {k: at[k] for k in ("accuracy", "final", "tpf", "mean_length", "filler_share")}
        blocks[name] = b
    summary = {}
    for g in GROUPS:
        names = [n for n in blocks if n.startswith(f"{g}_s")]
        if names:
            summary[f"{g}_gain"] = _stats([blocks[n]["gain"] for n in names])
            summary[f"{g}_acc_gain_points"] = _stats([blocks[n]["acc_gain_points"] for n in names])
            for k in ("accuracy", "tpf"):
                summary[f"{g}_{k}_at_0.9"] = _stats([blocks[n]["at_0.9"][k] for n in names])
    return {"region": region, "blocks": blocks, "summary": summary}


def _f(x, fmt="{:.2f}", none="-"):
    return none if x is None else fmt.format(x)


def table(family: str, res: dict) -> str:
    """Markdown: the base's region, then one line per method (ORL as mean +- sd over seeds, and per seed)."""

    def fastest(name: str) -> str:
        r = min(res["sweeps"][name], key=lambda x: x["value"])
        return f"{100 * r['accuracy']:.1f} / {r['tpf']:.2f}"
    task = f" (task `{res['task']}`, the `{res['recipes_from']}` recipes)" if res.get("task") else ""
    lines = [f"**{family}**{task} {res['task_kwargs']}, n = {res['n_sweep']} held-out problems per setting, thresholds "
             f"{', '.join(f'{v:g}' for v in res['thresholds'])}", "",
             "| base | strict % @0.9 | final-only % @0.9 | TPF @0.9 | 2x TPF: strict % (threshold) | cost (points) "
             "| in region | bends |", "|---|---|---|---|---|---|---|---|"]
    for name, v in res["region"].items():
        # 2x not reached: the sweep's fastest setting is reported with its cost; whether that is a steep
        # frontier or a TPF ceiling (one denoising step + the commit per block) is for the reader to judge
        at2 = (f"{100 * v['strict_at_target']:.1f} ({v['nearest_threshold']:g})" if v["reached"]
               else f"2x not reached: max TPF {v['max_tpf']:.2f} (threshold {v['max_tpf_threshold']:g})")
        cost = (_f(v["drop_points"], "{:.1f}") if v["reached"]
                else f"{v['drop_at_max_tpf_points']:.1f} at max TPF")
        bends = ("yes" if v["bends"] else "no") if v["reached"] else "n/a (2x beyond the sweep)"
        lines.append(f"| {name} | {100 * v['strict']:.1f} | {100 * v['final']:.1f} | {v['tpf']:.2f} | {at2} | "
                     f"{cost} | {'yes' if v['base_in_range'] else 'no'} | {bends} |")
    b0 = next(iter(res["blocks"].values()))
    lvl = b0["level"]
    lines += ["", f"Base at the fastest threshold: {fastest('base')} (strict % / TPF).",
              "", f"Baseline (a), the base's own frontier: best strict accuracy {100 * b0['base_best_accuracy']:.1f} % at "
              f"TPF {b0['base_best_tpf']:.2f}; at {100 * lvl:.1f} % its frontier reaches TPF {_f(b0['base_tpf'])}"
              + (" (its fastest setting: capped)" if b0["base_capped"] else "") + ".",
              "", f"Frontier gain = TPF ratio at the base's best strict accuracy - 1 point ({100 * lvl:.1f} %), "
              "95 % paired-bootstrap CI; accuracy gain at the TPF of the base's best setting; length / filler at "
              "threshold 0.9.", "",
              "| method | frontier gain (CI) | acc. gain (points) | strict % @0.9 | TPF @0.9 | strict % / TPF at the "
              "fastest threshold | mean length | filler % |",
              "|---|---|---|---|---|---|---|---|"]

    s = res["summary"]
    for grp in GROUPS:
        names = [n for n in res["blocks"] if n.startswith(f"{grp}_s")]
        if not names:
            continue
        g, a = s[f"{grp}_gain"], s[f"{grp}_acc_gain_points"]
        mean = lambda k, names=names: statistics.mean(res["blocks"][n]["at_0.9"][k] for n in names)  # noqa: E731
        sd = lambda k, names=names: (statistics.stdev(res["blocks"][n]["at_0.9"][k] for n in names)  # noqa: E731
                                     if len(names) > 1 else 0.0)
        label = "ORL" if grp == "orl" else f"ORL {grp.replace('_', ' ')}"
        lines.append(f"| {label} (mean +- sd, {len(names)} seeds; {g['n']} reach the level) | {_f(g['mean'])} +- "
                     f"{_f(g['sd'])} | {_f(a['mean'], '{:+.1f}')} +- {_f(a['sd'], '{:.1f}')} | "
                     f"{100 * mean('accuracy'):.1f} +- {100 * sd('accuracy'):.1f} | {mean('tpf'):.2f} +- {sd('tpf'):.2f} | - | "
                     f"{mean('mean_length'):.1f} | {100 * mean('filler_share'):.1f} |")
    for name, b in res["blocks"].items():
        at = b["at_0.9"]
        ci = b.get("gain_ci") or [None, None]
        gain = "none" if b["gain"] is None else f"{b['gain']:.2f} ({ci[0]:.2f}-{ci[1]:.2f})"
        lines.append(f"| {name} | {gain} | {_f(b['acc_gain_points'], '{:+.1f}')} | {100 * at['accuracy']:.1f} | "
                     f"{at['tpf']:.2f} | {fastest(name)} | {at['mean_length']:.1f} | {100 * at['filler_share']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--family", help="one of orl.recipes.suite.FAMILIES (omit with --report; with --task: the recipes' "
                    "family, as --recipes-from)")
    ap.add_argument("--task", default=None, help="your own task instead of a family's ('path/to/file.py:function', "
                    "'module:function', a built-in name or a data.jsonl, as `orl sft --task`); every stage trains "
                    "and sweeps on it with the recipes of --recipes-from (default: the family's own task)")
    ap.add_argument("--task-kw", action="append", default=[], metavar="KEY=VALUE",
                    help="an option of --task's task (repeatable), e.g. --task-kw digits=4")
    ap.add_argument("--recipes-from", default=None, metavar="FAMILY",
                    help="with --task: the suite family whose recipes (model, size, SFT steps, block size, decoders' "
                         "token budget, ORL's budget) run on your task (default: --family)")
    ap.add_argument("--name", default=None, help="with --task: the results' folder under --out (default: the "
                    "task's name)")
    ap.add_argument("--out", default="runs/suite_runs")
    ap.add_argument("--base", default=None, help="a finished suite_sft_<family> model (seed 0) to reuse")
    ap.add_argument("--orl-seeds", default="0,1,2")
    ap.add_argument("--sft-seeds", default="0")
    ap.add_argument("--n-sweep", type=int, default=300)
    ap.add_argument("--thresholds", default=",".join(map(str, GRID)))
    ap.add_argument("--n-boot", type=int, default=1000)
    ap.add_argument("--set-orl", dest="sets_orl", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps of ORL, RFT and more SFT (default: "
                    "the recipes'); for smoke tests")
    ap.add_argument("--set-sft", dest="sets_sft", action="append", default=[], metavar="KEY=VALUE",
                    help="overrides of the base's SFT recipe (e.g. batch_size=128, stages.0.lr=6e-4)")
    ap.add_argument("--size", default=None, help="the base's model size (default: the recipe's, `small`)")
    ap.add_argument("--device", default="cpu", help="where every model trains and is swept ('cuda' on a GPU)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ablations", default="", help=f"comma-separated, of {', '.join(ABLATIONS)}: each trained at every "
                    "ORL seed")
    ap.add_argument("--ablation-seeds", default=None, help="the ORL seeds of every ablation (default: --orl-seeds)")
    ap.add_argument("--no-baselines", action="store_true", help="skip RFT and more SFT (e.g. an ablation-only call)")
    ap.add_argument("--no-orl", action="store_true", help="skip the full ORL recipe (another process trains it: "
                    "with --train-only, to train ablations in parallel)")
    ap.add_argument("--train-only", action="store_true", help="train the models, sweep nothing")
    ap.add_argument("--sweep-only", default=None, metavar="NAMES",
                    help="train as asked, then sweep only these models (comma-separated names: base, orl_s0, rft, "
                         "no_aec_s1, ...) into the sweeps cache and stop, so processes side by side share the sweeps")
    ap.add_argument("--report", action="store_true", help="rebuild --out/table.markdown from the families' results")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.report:
        parts = []
        for fam in sorted(os.listdir(a.out)):
            p = os.path.join(a.out, fam, "results.json")
            if os.path.exists(p):
                parts.append(table(fam, json.load(open(p))))
        open(os.path.join(a.out, "table.markdown"), "w").write("\n\n".join(parts) + "\n")
        print("\n\n".join(parts))
        return
    from orl.recipes.suite import FAMILIES
    family, task, name = _family_and_task(a)
    if family not in FAMILIES:
        raise SystemExit(f"unknown family {family!r}; choose one of {', '.join(FAMILIES)}")
    t0 = time.time()
    out = os.path.join(a.out, name)
    seeds = [int(x) for x in a.orl_seeds.split(",") if x]
    sft_seeds = sorted({0, *(int(x) for x in a.sft_seeds.split(",") if x)})
    abl = [x for x in a.ablations.split(",") if x]
    if unknown := [x for x in abl if x not in ABLATIONS]:
        raise SystemExit(f"unknown ablation(s) {unknown}; choose from {', '.join(ABLATIONS)}")
    if a.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    dirs = train_all(family, out, a.base, seeds, sft_seeds, a.sets_orl, a.steps, abl, not a.no_baselines,
                     not a.no_orl, a.sets_sft, a.size, a.device,
                     None if a.ablation_seeds is None else [int(x) for x in a.ablation_seeds.split(",") if x], task)
    if a.train_only:
        return
    values = sorted({float(v) for v in a.thresholds.split(",")} | {0.9})
    if a.sweep_only is not None:
        names = set(a.sweep_only.split(","))
        sweep_all(family, out, {n: d for n, d in dirs.items() if n in names}, a.n_sweep, values, a.device, task)
        return
    rows = sweep_all(family, out, dirs, a.n_sweep, values, a.device, task)
    res = compare(rows, a.n_boot)
    res.update(family=name, task_kwargs=task[1] if task else FAMILIES[family][0], n_sweep=a.n_sweep, thresholds=values,
               models=dirs, orl_seeds=seeds, ablations=abl, sft_seeds=sft_seeds, sets_orl=a.sets_orl,
               sets_sft=a.sets_sft, size=_sft_recipe(family, out, a.sets_sft, a.size, task=task).size, device=a.device,
               task=task[0] if task else None, recipes_from=family,
               sweeps={n: [{k: v for k, v in r.items() if k != "records"} for r in rs] for n, rs in rows.items()},
               machine=f"{platform.machine()} {os.cpu_count()} cpu, torch {torch.__version__}"
               + (f", {torch.cuda.get_device_name()}" if a.device.startswith("cuda") else ""),
               seconds=time.time() - t0)
    for b in res["blocks"].values():
        b.pop("curves", None)
    json.dump(res, open(os.path.join(out, "results.json"), "w"), indent=2)
    md = table(name, res)
    open(os.path.join(out, "table.markdown"), "w").write(md + "\n")
    print(md)


def _family_and_task(a: argparse.Namespace) -> tuple[str, tuple[str, dict] | None, str]:
    """(the recipes' family, the user's task as (spec, options) or None, the results' folder name),
    the task built once here so a bad spec or option stops before any stage."""
    if not a.task:
        if a.task_kw or a.recipes_from or a.name:
            raise SystemExit("--task-kw, --recipes-from and --name go with --task")
        return a.family, None, a.family
    family = a.recipes_from or a.family
    if not family:
        raise SystemExit("--task needs --recipes-from FAMILY: the suite family whose recipes run on it")
    from orl.recipes.overrides import parse_sets
    from orl.tasks.registry import get_task
    task = (a.task, parse_sets(a.task_kw))
    try:
        built = get_task(task[0], **task[1])
    except (ValueError, TypeError, ImportError, FileNotFoundError) as e:
        raise SystemExit(f"--task {a.task}: {e}") from None
    return family, task, a.name or built.name


if __name__ == "__main__":
    main()
