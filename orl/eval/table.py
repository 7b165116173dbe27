"""Step 4 of evaluation: our numbers beside the published ORL numbers.

`PAPER` holds Table 1 of the ORL manuscript (docs/method.md section 4.1: accuracy % / TPF on
GSM8K, MATH-500, HumanEval, MBPP) for the three families and both roles, plus its Table 2
(section 4.2: AIME-24, MMLU-Pro, GPQA-Diamond, LiveCodeBench v6, IFEval; `TRANSFER_TASKS`) where
published (LLaDA and DiffusionGemma only). IFEval's column is compared with our prompt-level strict
accuracy (`orl.tasks.ifeval`, the task's default reward; the paper does not say which of IFEval's
four accuracies it reports).
The paper's TPF counts one cache-commit forward per block, so it is compared with our ``tpf``,
not ``tpf_no_commit``. A row of ours is printed only from a fraction in [0, 1] over n > 0 scored
problems ("–" when nothing was scored); anything else is refused with the task named, so the
table never shows NaN or more than 100 %.

Does not own: computing our numbers (`orl.eval.score`), plots.
"""
from __future__ import annotations

import json
import math
from typing import Any

FAMILIES = {"sdar": "QwenDLM (4B)", "llada": "LLaDA-2.1-mini", "dgemma": "DiffusionGemma"}
ROLES = ("base", "orl")
MAIN_TASKS = ("gsm8k", "math500", "humaneval", "mbpp")
TASK_TITLES = {"gsm8k": "GSM8K", "math500": "MATH-500", "humaneval": "HumanEval", "mbpp": "MBPP",
               "aime": "AIME-24", "mmlu-pro": "MMLU-Pro", "gpqa-diamond": "GPQA-D",
               "livecodebench": "LCB-v6", "ifeval": "IFEval"}
# Table 2 (transfer), section 4.2: published for LLaDA and DiffusionGemma only
TRANSFER_TASKS = ("aime", "mmlu-pro", "gpqa-diamond", "livecodebench", "ifeval")

# (family, role) -> task -> (accuracy %, TPF)
PAPER: dict[tuple[str, str], dict[str, tuple[float, float]]] = {
    ("sdar", "base"): {"gsm8k": (90.4, 2.4), "math500": (88.0, 2.1), "humaneval": (82.9, 1.8),
                       "mbpp": (79.2, 2.1)},
    ("sdar", "orl"): {"gsm8k": (92.4, 5.9), "math500": (92.2, 5.8), "humaneval": (89.6, 11.1),
                      "mbpp": (79.4, 8.0)},
    ("llada", "base"): {"gsm8k": (91.9, 5.6), "math500": (84.6, 8.2), "humaneval": (86.6, 11.3),
                        "mbpp": (77.5, 7.7), "aime": (50.0, 5.31), "mmlu-pro": (57.7, 3.60),
                        "gpqa-diamond": (49.5, 3.05), "livecodebench": (28.0, 5.90), "ifeval": (84.1, 1.53)},
    ("llada", "orl"): {"gsm8k": (92.0, 8.5), "math500": (87.0, 10.2), "humaneval": (89.0, 13.1),
                       "mbpp": (77.3, 10.3), "aime": (48.3, 7.77), "mmlu-pro": (58.2, 4.88),
                       "gpqa-diamond": (46.1, 4.21), "livecodebench": (30.3, 7.43), "ifeval": (82.3, 1.74)},
    ("dgemma", "base"): {"gsm8k": (95.8, 26.0), "math500": (92.3, 23.7), "humaneval": (90.9, 24.5),
                         "mbpp": (87.7, 23.1), "aime": (55.8, 18.15), "mmlu-pro": (78.6, 18.57),
                         "gpqa-diamond": (65.7, 17.50), "livecodebench": (53.5, 19.96), "ifeval": (66.9, 9.90)},
    ("dgemma", "orl"): {"gsm8k": (96.0, 30.0), "math500": (92.3, 27.4), "humaneval": (91.9, 27.9),
                        "mbpp": (88.2, 27.0), "aime": (56.3, 22.02), "mmlu-pro": (78.1, 22.60),
                        "gpqa-diamond": (65.3, 21.27), "livecodebench": (51.4, 24.09), "ifeval": (66.9, 11.68)},
}


def _fmt(x: float | None, digits: int) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _accuracy(task: str, ours: dict[str, Any]) -> float | None:
    """``ours``' accuracy in percent, None when nothing was scored; ``ValueError`` when it is not a
    fraction in [0, 1]."""
    acc = ours.get("accuracy")
    if acc is None or ours.get("n") == 0:
        return None
    if isinstance(acc, bool) or not isinstance(acc, (int, float)) or not math.isfinite(acc) or not 0 <= acc <= 1:
        raise ValueError(f"results[{task!r}]['accuracy'] is {acc!r}, not a fraction in [0, 1] (n = "
                         f"{ours.get('n')!r}); an orl.eval.score aggregate gives one -- refusing to print it")
    return 100.0 * acc


def main_table(results: dict[str, dict[str, Any]], family: str, role: str,
               tasks: tuple[str, ...] = MAIN_TASKS) -> tuple[str, dict[str, Any]]:
    """Markdown and JSON comparing ``results`` (task -> `orl.eval.score` aggregate, accuracy as a
    fraction) with the paper's row for (``family``, ``role``): a row for each of ``tasks`` (Table
    1's by default; `TRANSFER_TASKS` for Table 2), then any other task in ``results``."""
    if (family, role) not in PAPER:
        raise ValueError(f"no published row for family={family!r}, role={role!r}; families "
                         f"{sorted(FAMILIES)}, roles {list(ROLES)}")
    paper = PAPER[(family, role)]
    tasks = list(tasks) + [t for t in results if t not in tasks]
    model = FAMILIES[family] + (" + ORL" if role == "orl" else "")
    lines = [f"**{model}**: ours vs published (accuracy %, TPF with the commit forward)", "",
             "| Task | Acc ours | Acc paper | Δ acc | TPF ours | TPF paper | n |",
             "|---|---|---|---|---|---|---|"]
    rows, notes = {}, []
    for t in tasks:
        ours = results.get(t, {})
        acc = _accuracy(t, ours)
        p_acc, p_tpf = paper.get(t, (None, None))
        delta = None if acc is None or p_acc is None else acc - p_acc
        n_skipped = ours.get("n_skipped") or 0
        rows[t] = {"ours": {"accuracy": acc, "tpf": ours.get("tpf"), "n": ours.get("n"), "n_skipped": n_skipped},
                   "paper": {"accuracy": p_acc, "tpf": p_tpf},
                   "delta_accuracy": None if delta is None else round(delta, 4)}
        delta_s = "–" if delta is None else f"{delta:+.1f}"
        n_s = f"{ours.get('n', '–')}" + (f" ({n_skipped} skipped)" if n_skipped else "")
        lines.append(f"| {TASK_TITLES.get(t, t)} | {_fmt(acc, 1)} | {_fmt(p_acc, 1)} | {delta_s} | "
                     f"{_fmt(ours.get('tpf'), 2)} | {'–' if p_tpf is None else f'{p_tpf:g}'} | {n_s} |")
        if n_skipped:
            notes.append(f"{TASK_TITLES.get(t, t)}: {n_skipped} of {n_skipped + (ours.get('n') or 0)} prompts "
                         "skipped (they do not fit the model's context with the token budget); accuracy and TPF "
                         "are over the rest")
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    data = {"family": family, "role": role, "model": model, "tasks": rows,
            "n_skipped": sum(r["ours"]["n_skipped"] for r in rows.values())}
    return "\n".join(lines) + "\n", json.loads(json.dumps(data))
