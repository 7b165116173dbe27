"""Issue 30: ORL from a weak base -- the collapse in miniature, the ablations that find its cause, the fix.

    python benchmarks/weak_base.py --out /tmp/weak [--device cpu] [--steps 40] [--only orl,guard]

Through the public CLI, as the outside check ran it (`orl sft` -> `orl convert scrp --gamma 8` -> `orl train
--recipe orl_suite_chain --task FILE:make_task`), on a family no recipe was tuned on
(tests/fixtures/weak_family.py, "letter walk": ``d;+3;-2;+1=`` -> ``d+3=g;g-2=e;e+1=f;#f``), from a `small`
base stopped early (SFT_SETS: two short SFT runs, the second continuing the first). Then, from the same start
model and seed, one ORL run per variant in VARIANTS (one change each: `--set` overrides of the recipe), and
more SFT from the base for the same number of optimizer steps (`more_sft_suite_chain`, task seed 1). Every
model is scored on the task's 200 held-out problems with the recipe's eval decoder (threshold 0.9, block 32).
Each run directory keeps its metrics.jsonl (the per-step numbers the table summarises: gate share, AEC /
CE / anchor magnitudes, the anchor's coverage, the pathway's relative update, verified share, reward, TPF).
Every stage resumes from what ``--out`` holds (a finished stage is skipped). One process at a time, one
thread each (``ORL_THREADS``). Prints a markdown table and writes ``OUT/results.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TASK = os.path.join(ROOT, "tests", "fixtures", "weak_family.py") + ":make_task"
# the base: 400 SFT steps of the suite's chain recipe (block 32; 0 % held-out), then 200 more continuing from it
# (21.0 %; 400 more instead reach 81 %: the family is learned between these points)
SFT_SETS = [["stages.0.steps=300", "stages.1.steps=100"], ["stages.0.steps=150", "stages.1.steps=50"]]
# the strong control: the first call of SFT_SETS, then 400 steps continuing it (81 % held-out)
SFT_STRONG = ["stages.0.steps=300", "stages.1.steps=100"]
ORL_SETS = ["eval_every=10", "eval_n=200", "save_every=10"]   # plus steps=N
# variant -> ORL --set overrides (one change each, from the same start and seed)
VARIANTS: dict[str, list[str]] = {
    "orl": [],                                                   # the recipe as the outside check ran it
    "no_aec": ["loss.lambda_aec=0"],                             # - AEC
    "frozen_pathway": ["pathway_lr=0"],                          # no pathway update
    "lr_div10": ["lr=5e-6"],                                     # a 10x smaller LR
    "prompts_x4": ["prompts_per_step=32"],                       # 4x the prompts (and verified responses) per step
    "floor32": ["min_verified=32"],                              # the fix: a verified-batch floor of 32 responses
    "guard": ["guard_every=10"],                                 # the safeguard: the held-out accuracy guard
    "floor32_guard": ["min_verified=32", "guard_every=10"],      # both (the recipe's new defaults, at this run length)
}
# the first 10 steps at the recipe's peak LR (constant schedule), where the collapse happens: one change each
FIRST10_SETS = ["steps=10", "lr_schedule=constant", "eval_every=5", "eval_n=200", "save_every=100"]
FIRST10: dict[str, list[str]] = {
    "recipe": [], "no_anchor": ["loss.anchor=none"], "anchor_all": ["loss.kl_gate_tau=1.0"],
    "anchor_x10": ["loss.lambda_kl=3"], "no_gate": ["loss.gate=none"], "ce_only": ["loss.lambda_aec=0", "loss.anchor=none"],
    "no_aec": ["loss.lambda_aec=0"], "frozen_pathway": ["pathway_lr=0"], "lr_div10": ["lr=5e-6"],
    "warmup50": ["warmup=50"], "group_x4": ["group_size=32"], "prompts_x4": ["prompts_per_step=32"],
    "floor16": ["min_verified=16"], "floor32": ["min_verified=32"],
    "floor32_lr_only": ["min_verified=32", "max_rollout_rounds=1"],
}


def _cli(args: list[str], log: str, threads: int) -> float:
    """Run ``orl ARGS`` (a child process, one thread); its output to ``log``. Returns seconds."""
    env = {**os.environ, "ORL_THREADS": str(threads), "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
    os.makedirs(os.path.dirname(log), exist_ok=True)
    t0 = time.time()
    with open(log, "w") as f:
        r = subprocess.run([sys.executable, "-m", "orl.cli", *args], cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
    if r.returncode:
        raise RuntimeError(f"orl {' '.join(args)} failed (exit {r.returncode}); see {log}")
    return time.time() - t0


def _score(model_dir: str, n: int, device: str) -> dict:
    """Held-out accuracy and TPF of a model with orl_suite_chain's eval decoder (200 problems)."""
    import torch  # noqa: PLC0415

    from orl.eval.heldout import evaluate  # noqa: PLC0415
    from orl.model import load_pretrained  # noqa: PLC0415
    from orl.recipes import get_recipe  # noqa: PLC0415
    from orl.tasks.registry import get_task  # noqa: PLC0415
    from orl.tokenizer import load_tokenizer  # noqa: PLC0415
    dcfg = get_recipe("orl_suite_chain").eval_decode
    task = get_task(TASK)
    model = load_pretrained(model_dir, device=device).eval()
    with torch.no_grad():
        r = evaluate(model, load_tokenizer(model_dir), task, task.problems("test")[:n], dcfg)
    return {"accuracy": r["accuracy"], "tpf": r["tpf"], "steps_per_block": r["steps_per_block"]}


def _curve(run: str) -> dict:
    """Summary of an ORL run's metrics.jsonl: the rollouts' reward (first, min, last), no-verified share, the
    in-loop held-out curve and the means of the mechanism's per-step numbers (steps that updated)."""
    rows = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl")) if line.strip()]
    upd = [r for r in rows if "loss" in r]

    def mean(k, rs=upd):
        v = [r[k] for r in rs if k in r]
        return sum(v) / len(v) if v else None

    first = upd[:5]
    return {"reward_first": rows[0]["reward"], "reward_min": min(r["reward"] for r in rows),
            "reward_last5": sum(r["reward"] for r in rows[-5:]) / len(rows[-5:]),
            "tpf_first": rows[0]["tpf"], "tpf_last5": sum(r["tpf"] for r in rows[-5:]) / len(rows[-5:]),
            "no_verified_share": rows[-1]["run"]["no_verified_share"],
            "verified_mean": sum(r["verified"] for r in rows) / len(rows),
            "reward_mean": sum(r["reward"] for r in rows) / len(rows),
            "eval": {str(r["step"]): (r["eval_accuracy"], r["eval_tpf"]) for r in rows if "eval_accuracy" in r},
            "guard": {str(r["step"]): (r["guard_accuracy"], r["guard_ok"]) for r in rows if "guard_accuracy" in r},
            **{k: mean(k) for k in ("gate_frac", "loss_pred", "loss_aec", "loss_anchor", "ce_gated", "ce_ungated",
                                    "argmax_wrong", "kl_unresolved", "kl_anchored", "kl_free", "anchor_frac",
                                    "aec_active", "entropy_unresolved", "update_pathway", "update_model",
                                    "verified_share", "post_eos_frac", "entropy_contraction")},
            **{f"{k}_first5": mean(k, first) for k in ("update_pathway", "update_model", "loss_aec", "kl_unresolved",
                                                       "argmax_wrong", "entropy_unresolved")}}


def _orl(a, res: dict, key: str, d: str, sets: list[str], start: str) -> dict:
    """One ORL run from the start model (skipped when ``res`` holds it with the same overrides)."""
    if key in res and res[key].get("sets") == sets:
        return res[key]
    t = _cli(["train", "--recipe", "orl_suite_chain", "--task", TASK, "--init", start, "--out", d, "--quiet",
              "--no-resume", *sum((["--set", x] for x in sets), [])], d + ".log", a.threads)
    res[key] = {"sets": sets, "seconds": t, **_score(os.path.join(d, "final"), a.n_eval, a.device), **_curve(d)}
    return res[key]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="/tmp/weak_base")
    ap.add_argument("--table", choices=("main", "first10", "strong"), default="main",
                    help="main: --steps steps of the recipe's schedule, each variant and more SFT; first10: the first "
                         "10 steps at the recipe's peak LR, one change each (FIRST10); strong: from a strong base "
                         "(SFT_STRONG), the recipe without and with the safeguards")
    ap.add_argument("--steps", type=int, default=40, help="optimizer steps of every ORL run and of more SFT (main)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--only", help="comma-separated variants (default: all, then more_sft)")
    ap.add_argument("--n-eval", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    res_path = os.path.join(a.out, "results.json")
    res = json.load(open(res_path)) if os.path.exists(res_path) else {}
    dev = [f"device={a.device}"]

    def save():
        json.dump(res, open(res_path, "w"), indent=1)

    # 1. the weak base: SFT in two calls (the second continues the first), then the ORL start model
    prev = None
    for i, sets in enumerate(SFT_SETS):
        d = os.path.join(a.out, f"sft{i}")
        if not os.path.exists(os.path.join(d, "final", "config.json")):
            extra = [f"init={prev}"] if prev else []
            t = _cli(["sft", "--recipe", "suite_sft_chain", "--task", TASK, "--out", d, "--quiet",
                      *sum((["--set", x] for x in sets + extra + dev), [])], d + ".log", a.threads)
            res.setdefault("seconds", {})[f"sft{i}"] = t
        prev = os.path.join(d, "final")
    base, start = prev, os.path.join(a.out, "start")
    if not os.path.exists(os.path.join(start, "config.json")):
        _cli(["convert", "scrp", "--in", base, "--out", start, "--gamma", "8"], start + ".log", a.threads)
    if "base" not in res:
        res["base"] = _score(base, a.n_eval, a.device)
        save()
    b = res["base"]
    print(f"weak base: held-out {100 * b['accuracy']:.1f} %, TPF {b['tpf']:.2f}", flush=True)
    off = ["min_verified=0", "guard_every=0"]   # the recipe without this issue's defaults, as the outside check ran it

    if a.table == "strong":  # the same family trained on to 81 %: do the safeguards change its run?
        d = os.path.join(a.out, "sft_strong")
        if not os.path.exists(os.path.join(d, "final", "config.json")):
            _cli(["sft", "--recipe", "suite_sft_chain", "--task", TASK, "--out", d, "--quiet",
                  *sum((["--set", x] for x in [*SFT_STRONG, f"init={a.out}/sft0/final", *dev]), [])], d + ".log",
                 a.threads)
        s_start = os.path.join(a.out, "start_strong")
        if not os.path.exists(os.path.join(s_start, "config.json")):
            _cli(["convert", "scrp", "--in", os.path.join(d, "final"), "--out", s_start, "--gamma", "8"],
                 s_start + ".log", a.threads)
        tab = res.setdefault("strong", {})
        if "base" not in tab:
            tab["base"] = _score(os.path.join(d, "final"), a.n_eval, a.device)
        for name, extra in (("off", off), ("safeguards", ["min_verified=32", "guard_every=10"])):
            _orl(a, tab, name, os.path.join(a.out, "strong", name),
                 [f"steps={a.steps}", f"seed={a.seed}", *ORL_SETS, *extra, *dev], s_start)
            save()
        from orl.model.checkpoint import read_state_dict  # noqa: PLC0415
        import torch  # noqa: PLC0415
        w = [read_state_dict(os.path.join(a.out, "strong", n, "final")) for n in ("off", "safeguards")]
        same = all(torch.equal(w[0][k], w[1][k]) for k in w[0])
        sb = tab["base"]
        print(f"\nstrong base {100 * sb['accuracy']:.1f} % / TPF {sb['tpf']:.2f}; {a.steps} ORL steps\n")
        print("| run | held-out acc % | TPF | verified / step (min) | steps with an extra round | guard checks failed |")
        print("|---|---|---|---|---|---|")
        for name in ("off", "safeguards"):
            r = tab[name]
            rows = [json.loads(x) for x in open(os.path.join(a.out, "strong", name, "metrics.jsonl"))]
            extra = sum(x.get("rollout_rounds", 1) > 1 for x in rows)
            failed = sum(1 for x in rows if x.get("guard_ok") == 0.0)
            print(f"| {name} | {100 * r['accuracy']:.1f} | {r['tpf']:.2f} | {r['verified_mean']:.1f} "
                  f"({min(x['verified'] for x in rows)}) | {extra} | {failed} |")
        print(f"\nfinal weights bit-for-bit equal: {same}")
        return 0

    if a.table == "first10":
        tab = res.setdefault("first10", {})
        for name in (a.only.split(",") if a.only else FIRST10):
            r = _orl(a, tab, name, os.path.join(a.out, "first10", name),
                     [*FIRST10_SETS, f"seed={a.seed}", *off, *FIRST10[name], *dev], start)
            save()
            print(name, {k: r[k] for k in ("accuracy", "eval")}, flush=True)
        print(f"\nfirst 10 ORL steps at the peak LR (5e-5 after a 5-step warm-up, constant), one change each; "
              f"held-out accuracy of {a.n_eval} problems (base {100 * b['accuracy']:.1f} %)\n")
        print("| variant | held-out acc % after 5 / 10 steps | verified responses / step | rollout reward steps 1-10 |")
        print("|---|---|---|---|")
        for name in [n for n in FIRST10 if n in tab]:
            r, ev = tab[name], tab[name]["eval"]
            print(f"| {name} ({' '.join(FIRST10[name]) or 'the recipe'}) | {100 * ev['5'][0]:.1f} / {100 * ev['10'][0]:.1f}"
                  f" | {r['verified_mean']:.1f} | {r['reward_mean']:.2f} |")
        return 0

    # 2. ORL variants from the same start, 3. more SFT for as many optimizer steps
    for name in (a.only.split(",") if a.only else [*VARIANTS, "more_sft"]):
        d = os.path.join(a.out, name)
        if name == "more_sft":
            if res.get(name, {}).get("steps") != a.steps:
                t = _cli(["sft", "--recipe", "more_sft_suite_chain", "--task", TASK, "--task-kw", "seed=1", "--out", d,
                          "--quiet", "--no-resume", "--set", f"init={base}", "--set", f"stages.0.steps={a.steps}",
                          *sum((["--set", x] for x in dev), [])], d + ".log", a.threads)
                res[name] = {"steps": a.steps, "seconds": t, **_score(os.path.join(d, "final"), a.n_eval, a.device)}
        else:
            _orl(a, res, name, d, [f"steps={a.steps}", f"seed={a.seed}", *ORL_SETS, *off, *VARIANTS[name], *dev], start)
        save()
        print(name, {k: v for k, v in res[name].items() if k not in ("eval", "guard", "sets")}, flush=True)

    print(f"\n{a.steps} optimizer steps each from the same start (ORL: orl_suite_chain, LR 5e-5 decaying linearly to "
          f"10 %); held-out: {a.n_eval} problems, threshold 0.9\n")
    print("| model | held-out acc % | TPF | held-out acc % at steps 10 / 20 / 30 | reward step 1 -> min -> last 5 | "
          "verified / step | pathway vs model update / step | AEC loss | KL unresolved | anchor share |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print(f"| weak base | {100 * b['accuracy']:.1f} | {b['tpf']:.2f} | | | | | | | |")

    def f(x, p=3):
        return "-" if x is None else f"{x:.{p}f}"

    for name in [*VARIANTS, "more_sft"]:
        r = res.get(name)
        if not r:
            continue
        if name == "more_sft":
            print(f"| more SFT ({a.steps} steps, batch 64) | {100 * r['accuracy']:.1f} | {r['tpf']:.2f} | | | | | | | |")
            continue
        ev = " / ".join(f"{100 * r['eval'][k][0]:.1f}" if k in r["eval"] else "-" for k in ("10", "20", "30"))
        print(f"| {name} ({' '.join(VARIANTS[name]) or 'recipe'}) | {100 * r['accuracy']:.1f} | {r['tpf']:.2f} | {ev} | "
              f"{r['reward_first']:.2f} -> {r['reward_min']:.2f} -> {r['reward_last5']:.2f} | {r['verified_mean']:.1f} | "
              f"{f(r['update_pathway'], 5)} vs {f(r['update_model'], 5)} | {f(r['loss_aec'], 4)} | "
              f"{f(r['kl_unresolved'])} | {f(r['anchor_frac'], 2)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
