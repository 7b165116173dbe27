"""Step 4 of evaluation: our numbers beside the published ORL numbers.

`PAPER` holds Table 1 of the ORL manuscript (docs/method.md section 4.1: accuracy % / TPF on
GSM8K, MATH-500, HumanEval, MBPP) for the three families and both roles, plus the AIME-24 and
MMLU-Pro columns of its Table 2 (section 4.2) where published (LLaDA and DiffusionGemma only).
The paper's TPF counts one cache-commit forward per block, so it is compared with our ``tpf``,
not ``tpf_no_commit``.

Does not own: computing our numbers (`orl.eval.score`), plots.
"""
from __future__ import annotations

import json
from typing import Any

FAMILIES = {"sdar": "QwenDLM (4B)", "llada": "LLaDA-2.1-mini", "dgemma": "DiffusionGemma"}
ROLES = ("base", "orl")
MAIN_TASKS = ("gsm8k", "math500", "humaneval", "mbpp")
TASK_TITLES = {"gsm8k": "GSM8K", "math500": "MATH-500", "humaneval": "HumanEval", "mbpp": "MBPP",
               "aime": "AIME-24", "mmlu-pro": "MMLU-Pro"}

# (family, role) -> task -> (accuracy %, TPF)
PAPER: dict[tuple[str, str], dict[str, tuple[float, float]]] = {
    ("sdar", "base"): {"gsm8k": (90.4, 2.4), "math500": (88.0, 2.1), "humaneval": (82.9, 1.8),
                       "mbpp": (79.2, 2.1)},
    ("sdar", "orl"): {"gsm8k": (92.4, 5.9), "math500": (92.2, 5.8), "humaneval": (89.6, 11.1),
                      "mbpp": (79.4, 8.0)},
    ("llada", "base"): {"gsm8k": (91.9, 5.6), "math500": (84.6, 8.2), "humaneval": (86.6, 11.3),
                        "mbpp": (77.5, 7.7), "aime": (50.0, 5.31), "mmlu-pro": (57.7, 3.60)},
    ("llada", "orl"): {"gsm8k": (92.0, 8.5), "math500": (87.0, 10.2), "humaneval": (89.0, 13.1),
                       "mbpp": (77.3, 10.3), "aime": (48.3, 7.77), "mmlu-pro": (58.2, 4.88)},
    ("dgemma", "base"): {"gsm8k": (95.8, 26.0), "math500": (92.3, 23.7), "humaneval": (90.9, 24.5),
                         "mbpp": (87.7, 23.1), "aime": (55.8, 18.15), "mmlu-pro": (78.6, 18.57)},
    ("dgemma", "orl"): {"gsm8k": (96.0, 30.0), "math500": (92.3, 27.4), "humaneval": (91.9, 27.9),
                        "mbpp": (88.2, 27.0), "aime": (56.3, 22.02), "mmlu-pro": (78.1, 22.60)},
}


def _fmt(x: float | None, digits: int) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def main_table(results: dict[str, dict[str, Any]], family: str,
               role: str) -> tuple[str, dict[str, Any]]:
    """Markdown and JSON comparing ``results`` (task -> `orl.eval.score` aggregate, accuracy as a
    fraction) with the paper's row for (``family``, ``role``)."""
    if (family, role) not in PAPER:
        raise ValueError(f"no published row for family={family!r}, role={role!r}; families "
                         f"{sorted(FAMILIES)}, roles {list(ROLES)}")
    paper = PAPER[(family, role)]
    tasks = list(MAIN_TASKS) + [t for t in results if t not in MAIN_TASKS]
    model = FAMILIES[family] + (" + ORL" if role == "orl" else "")
    lines = [f"**{model}**: ours vs published (accuracy %, TPF with the commit forward)", "",
             "| Task | Acc ours | Acc paper | Δ acc | TPF ours | TPF paper | n |",
             "|---|---|---|---|---|---|---|"]
    rows = {}
    for t in tasks:
        ours = results.get(t, {})
        acc = None if ours.get("accuracy") is None else 100.0 * ours["accuracy"]
        p_acc, p_tpf = paper.get(t, (None, None))
        delta = None if acc is None or p_acc is None else acc - p_acc
        rows[t] = {"ours": {"accuracy": acc, "tpf": ours.get("tpf"), "n": ours.get("n")},
                   "paper": {"accuracy": p_acc, "tpf": p_tpf},
                   "delta_accuracy": None if delta is None else round(delta, 4)}
        delta_s = "–" if delta is None else f"{delta:+.1f}"
        lines.append(f"| {TASK_TITLES.get(t, t)} | {_fmt(acc, 1)} | {_fmt(p_acc, 1)} | {delta_s} | "
                     f"{_fmt(ours.get('tpf'), 2)} | {'–' if p_tpf is None else f'{p_tpf:g}'} | "
                     f"{ours.get('n', '–')} |")
    data = {"family": family, "role": role, "model": model, "tasks": rows}
    return "\n".join(lines) + "\n", json.loads(json.dumps(data))
