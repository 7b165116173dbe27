"""Does a suite family's base sit where the release's bases sit, and does its frontier bend?

    python benchmarks/suite_calibrate.py --family carry_mul --out runs/calib/carry_mul [--n-eval 500] \
        [--set stages.0.steps=300 --set stages.1.steps=200] [--set-orl eval_decode.block_size=16] \
        [--thresholds 0.3,0.5,0.7,0.8,0.9,0.95] [--threads 2]

SFTs the family's base with its recipe (``suite_sft_<family>``, resumed from ``--out/sft`` if there;
``--set`` changes the SFT config, task knobs included: ``--set task_kwargs.digits=5``), then decodes
the first ``--n-eval`` held-out problems with the family's evaluation decoder (``orl_suite_<family>``'s
``eval_decode``; ``--set-orl`` changes that recipe) at each threshold of the sweep, and prints strict
accuracy (every written step right: the task's ``verify``), final-answer accuracy (``verify_final``),
TPF and the strict verifier's fault classes. The targets (the issue's): at the reference threshold
0.9 the base has TPF 1.5-3 and strict accuracy 60-95 %, and the threshold that doubles its TPF costs
at least 10 points of strict accuracy (read off the sweep by linear interpolation in TPF; when no
threshold of the sweep reaches twice the TPF, the threshold cannot buy the doubling: that counts as
bending, and is reported as such, which matters only for a base in range -- one near the TPF cap of
one denoising step a block fails the range instead). Writes ``--out/calibration.json``.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import itertools
import json
import os
import platform
import time

import torch

TARGET_TPF = (1.5, 3.0)
TARGET_ACC = (0.60, 0.95)
MIN_DROP_POINTS = 10.0


def verdict(rows: list[dict], ref: float = 0.9) -> dict:
    """The targets checked on sweep ``rows`` ({"threshold", "strict", "tpf"}); pure, for the table."""
    base = next(r for r in rows if abs(r["threshold"] - ref) < 1e-9)
    in_range = TARGET_TPF[0] <= base["tpf"] <= TARGET_TPF[1] and TARGET_ACC[0] <= base["strict"] <= TARGET_ACC[1]
    target = 2 * base["tpf"]
    pts = sorted((r["tpf"], r["strict"], r["threshold"]) for r in rows)
    out = {"threshold": ref, "tpf": base["tpf"], "strict": base["strict"], "base_in_range": in_range,
           "tpf_target": target, "max_tpf": pts[-1][0], "max_tpf_threshold": pts[-1][2],
           "drop_at_max_tpf_points": 100 * (base["strict"] - pts[-1][1])}
    if pts[-1][0] < target:
        out.update(reached=False, strict_at_target=None, drop_points=None, bends=True)
        return out
    for (t0, a0, _), (t1, a1, _) in itertools.pairwise(pts):
        if t0 <= target <= t1:
            acc = a0 if t1 == t0 else a0 + (a1 - a0) * (target - t0) / (t1 - t0)
            break
    drop = 100 * (base["strict"] - acc)
    nearest = min(rows, key=lambda r: abs(r["tpf"] - target))
    out.update(reached=True, strict_at_target=acc, drop_points=drop, nearest_threshold=nearest["threshold"],
               bends=drop >= MIN_DROP_POINTS)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--family", required=True)
    ap.add_argument("--out", default=None, help="default runs/calib/<family>")
    ap.add_argument("--n-eval", type=int, default=500)
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="override of the SFT recipe (e.g. stages.0.steps=300, task_kwargs.digits=5)")
    ap.add_argument("--set-orl", dest="sets_orl", action="append", default=[], metavar="KEY=VALUE",
                    help="override of the ORL recipe, whose eval_decode is the decoder (e.g. eval_decode.block_size=8)")
    ap.add_argument("--thresholds", default="0.3,0.5,0.7,0.8,0.9,0.95")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="where the sweep decodes ('cuda' on a GPU; the SFT's: --set device=cuda)")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    from transformers import AutoTokenizer

    from orl.eval.heldout import encode_prompt, evaluate
    from orl.model import load_pretrained
    from orl.recipes import apply_overrides, get_recipe
    from orl.recipes.suite import FAMILIES
    from orl.tasks.registry import get_task
    from orl.train.sft import train_sft

    if a.family not in FAMILIES:
        raise SystemExit(f"unknown family {a.family!r}; choose one of {', '.join(FAMILIES)}")
    out = a.out or os.path.join("runs", "calib", a.family)
    thresholds = sorted({float(x) for x in a.thresholds.split(",")} | {0.9})
    t0 = time.time()
    sft = apply_overrides(get_recipe(f"suite_sft_{a.family}", out=os.path.join(out, "sft")), a.sets)
    print(f"SFT {sft.task} {sft.task_kwargs}: {sft.total_steps} steps -> {sft.out}", flush=True)
    base_dir = train_sft(sft, resume=True, quiet=a.quiet)
    t_sft = time.time() - t0
    task = get_task(sft.task, **sft.task_kwargs)
    orl = apply_overrides(get_recipe(f"orl_suite_{a.family}", init=base_dir, out=os.path.join(out, "orl")),
                          a.sets_orl)
    model = load_pretrained(base_dir, device=a.device).eval()
    tok = AutoTokenizer.from_pretrained(base_dir)
    problems = task.problems("test")[:a.n_eval]
    need = max(len(tok.encode(task.solution(p), add_special_tokens=False)) + 1 for p in problems)
    if need > orl.eval_decode.max_new_tokens:
        raise SystemExit(f"the longest gold response needs {need} tokens with its EOS, more than the decoder's "
                         f"max_new_tokens={orl.eval_decode.max_new_tokens}: add --set-orl "
                         f"eval_decode.max_new_tokens={-(-need // 16) * 16}")
    by_id = {p.id: p for p in problems}
    rows = []
    for th in thresholds:
        dcfg = dataclasses.replace(orl.eval_decode, threshold=th)
        r = evaluate(model, tok, task, problems, dcfg, batch_size=a.batch_size)
        recs = r["records"]
        faults = collections.Counter(task.diagnose(by_id[x["id"]], x["completion"]) for x in recs)
        rows.append({"threshold": th, "strict": r["accuracy"],
                     "final": sum(task.verify_final(by_id[x["id"]], x["completion"]) for x in recs) / len(recs),
                     "tpf": r["tpf"], "tpf_no_commit": r["tpf_no_commit"], "steps_per_block": r["steps_per_block"],
                     "n": r["n"], "seconds": r["seconds"], "faults": dict(faults.most_common()),
                     "examples": [x["completion"] for x in recs[:3]]})
        print(f"  threshold {th:.2f}: strict {100 * r['accuracy']:.1f} %  TPF {r['tpf']:.2f}  ({r['seconds']:.0f} s)",
              flush=True)
    v = verdict(rows)
    prompt_len = max(len(encode_prompt(tok, p.prompt)) for p in problems)
    print(f"\n{a.family} {sft.task_kwargs}, SFT {sft.total_steps} steps ({sft.size}), n = {len(problems)}, "
          f"decoder {orl.eval_decode.rule} K={orl.eval_decode.block_size} max_new_tokens="
          f"{orl.eval_decode.max_new_tokens}, prompts <= {prompt_len} and responses <= {need} tokens\n")
    print("| threshold | strict % | final-only % | TPF | TPF no commit | steps/block | faults (strict) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        faults = ", ".join(f"{k} {n}" for k, n in r["faults"].items())
        print(f"| {r['threshold']:.2f} | {100 * r['strict']:.1f} | {100 * r['final']:.1f} | {r['tpf']:.2f} | "
              f"{r['tpf_no_commit']:.2f} | {r['steps_per_block']:.2f} | {faults} |")
    print(f"\nbase at 0.9: TPF {v['tpf']:.2f} (target {TARGET_TPF[0]}-{TARGET_TPF[1]}), strict "
          f"{100 * v['strict']:.1f} % (target {100 * TARGET_ACC[0]:.0f}-{100 * TARGET_ACC[1]:.0f} %): "
          f"{'in range' if v['base_in_range'] else 'OUT OF RANGE'}")
    if v["reached"]:
        print(f"2x TPF ({v['tpf_target']:.2f}, nearest threshold {v['nearest_threshold']:.2f}): strict "
              f"{100 * v['strict_at_target']:.1f} %, a drop of {v['drop_points']:.1f} points (target >= "
              f"{MIN_DROP_POINTS:.0f}): {'bends' if v['bends'] else 'DOES NOT BEND'}")
    else:
        print(f"2x TPF ({v['tpf_target']:.2f}) not reached by any threshold of the sweep (max {v['max_tpf']:.2f} at "
              f"{v['max_tpf_threshold']:.2f}, {v['drop_at_max_tpf_points']:.1f} points below 0.9): the threshold cannot "
              f"buy the doubling -- counted as bending only when the base is in range (a base near the "
              f"one-step-a-block TPF cap is out of range anyway)")
    ok = v["base_in_range"] and v["bends"]
    print(f"meets the targets: {'yes' if ok else 'no'}; {(time.time() - t0) / 60:.1f} min (SFT {t_sft / 60:.1f})")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "calibration.json"), "w") as f:
        json.dump({"family": a.family, "task": sft.task, "task_kwargs": sft.task_kwargs, "sft_steps": sft.total_steps,
                   "size": sft.size, "sets": a.sets, "sets_orl": a.sets_orl, "decode": orl.eval_decode.to_dict(),
                   "n_eval": len(problems), "rows": rows, "verdict": v, "meets": ok, "seconds": time.time() - t0,
                   "machine": f"{platform.machine()} {os.cpu_count()} cpu, torch {torch.__version__}"}, f, indent=2)


if __name__ == "__main__":
    main()
