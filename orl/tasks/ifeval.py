"""IFEval (instruction following, 541 prompts): loading, prompt and its single verifier.

Data: no installable package ships IFEval's prompts. The loader reads the public
``input_data.jsonl`` of the IFEval release (google-research, folder ``instruction_following_eval``;
the Hugging Face ``google/IFEval`` export has the same records): one JSON object a line with
``key`` (int), ``prompt``, ``instruction_id_list`` (ids such as ``punctuation:no_comma``) and
``kwargs`` (one object per id; exports that fill unused arguments with null are accepted).
Default location ``$ORL_DATA/ifeval/input_data.jsonl``. Nothing is recorded for it, so the user
pins the file by passing its SHA256 (``IFEval(sha256=...)``); the first attempt without one
prints the hash to pin, and a different hash is refused naming both.

The prompt is IFEval's prompt as it is (the instructions are part of it). Verification is
`orl.tasks.ifeval_checks.follows`: a strict and a loose verdict per instruction. The paper
reports four accuracies, all given by `metrics`:

* prompt-level strict / loose: share of prompts whose every instruction is followed;
* instruction-level strict / loose: share of all instructions followed (over every prompt's
  instructions together, so a prompt with three instructions weighs three).

``verify`` returns one of them per prompt as a reward in [0, 1], chosen by ``metric``:
``"prompt_strict"`` (default: 1.0 only when all are followed; the mean over prompts is the
prompt-level strict accuracy that tables show), ``"prompt_loose"``, or ``"instruction_strict"`` /
``"instruction_loose"`` (the fraction of this prompt's instructions followed; a denser reward for
training, whose mean over prompts is not the instruction-level accuracy -- use `metrics` for that).

Does not own: the checks (`orl.tasks.ifeval_checks`), chat templates, pools.
"""
from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from orl.tasks.base import Problem
from orl.tasks.datafile import DataFile, check_file, local_data_root, read_jsonl, require_keys
from orl.tasks.ifeval_checks import clean_kwargs, follows

METRICS = ("prompt_strict", "prompt_loose", "instruction_strict", "instruction_loose")


def evaluate(answer: dict, completion: str) -> dict[str, list[bool]]:
    """Per-instruction verdicts for one completion: ``{"strict": [...], "loose": [...]}`` in the
    order of ``answer["instruction_id_list"]``."""
    strict, loose = follows(answer["instruction_id_list"], answer["kwargs"], completion)
    return {"strict": strict, "loose": loose}


def score(answer: dict, completion: str, metric: str = "prompt_strict") -> float:
    """One prompt's reward under ``metric`` (see the module docstring)."""
    verdicts = evaluate(answer, completion)
    level, mode = metric.split("_")
    followed = verdicts[mode]
    if level == "prompt":
        return 1.0 if all(followed) else 0.0
    return sum(followed) / len(followed)


def metrics(pairs: Iterable[tuple[Problem, str]]) -> dict[str, Any]:
    """The paper's four accuracies (fractions) over (problem, completion) pairs, with the counts
    and a per-instruction-id breakdown (``by_instruction``: id -> n, strict, loose)."""
    n_prompts = n_instr = 0
    totals = dict.fromkeys(METRICS, 0)
    by_id: dict[str, dict[str, float]] = {}
    for problem, completion in pairs:
        v = evaluate(problem.answer, completion)
        n_prompts += 1
        n_instr += len(v["strict"])
        totals["prompt_strict"] += all(v["strict"])
        totals["prompt_loose"] += all(v["loose"])
        totals["instruction_strict"] += sum(v["strict"])
        totals["instruction_loose"] += sum(v["loose"])
        for iid, s, lo in zip(problem.answer["instruction_id_list"], v["strict"], v["loose"]):
            row = by_id.setdefault(iid, {"n": 0, "strict": 0, "loose": 0})
            row["n"] += 1
            row["strict"] += s
            row["loose"] += lo
    if not n_prompts:
        raise ValueError("no (problem, completion) pairs to score")
    out: dict[str, Any] = {m: totals[m] / (n_prompts if m.startswith("prompt") else n_instr) for m in METRICS}
    out.update(n_prompts=n_prompts, n_instructions=n_instr, by_instruction={
        iid: {"n": r["n"], "strict": r["strict"] / r["n"], "loose": r["loose"] / r["n"]}
        for iid, r in sorted(by_id.items())})
    return out


def metrics_from_files(prepared_dir: str | os.PathLike, generations_path: str | os.PathLike) -> dict[str, Any]:
    """`metrics` over an `orl eval` run: a prepared IFEval folder and its generations JSONL."""
    from orl.eval.jsonlog import read_log
    from orl.eval.prepare import load_prepared

    prepared = load_prepared(prepared_dir)
    problems = {p.id: p for p in prepared.problems()}
    _, generations, _, _ = read_log(generations_path)
    unknown = [g["id"] for g in generations if g["id"] not in problems]
    if unknown:
        raise ValueError(f"{generations_path} holds ids not in {prepared_dir}: {unknown[:5]}")
    return metrics((problems[g["id"]], g["completion"]) for g in generations)


class IFEval:
    """IFEval over a local ``input_data.jsonl``; ``sha256`` pins it (required: nothing is
    recorded); ``metric`` chooses what ``verify`` returns (see the module docstring)."""

    name = "ifeval"

    def __init__(self, path: str | None = None, sha256: str | None = None, metric: str = "prompt_strict"):
        if metric not in METRICS:
            raise ValueError(f"IFEval metric must be one of {', '.join(METRICS)}, not {metric!r}")
        self.path = path
        self.sha256 = sha256
        self.metric = metric

    def data_file(self, split: str = "test") -> DataFile:
        if split != "test":
            raise ValueError(f"IFEval has only the split 'test', not {split!r}")
        path = Path(self.path) if self.path else local_data_root() / "ifeval" / "input_data.jsonl"
        return DataFile(path, None, (
            "No package ships IFEval: save the public input_data.jsonl of the IFEval release "
            "(google-research, instruction_following_eval/data/) at this path, set $ORL_DATA, "
            "or pass path=..."
        ))

    def problems(self, split: str = "test") -> list[Problem]:
        path = check_file(self.data_file(split), self.sha256)
        out = []
        for i, row in enumerate(read_jsonl(path)):
            require_keys(row, ("key", "prompt", "instruction_id_list", "kwargs"), path, i)
            ids, kwargs = list(row["instruction_id_list"]), list(row["kwargs"])
            if not ids or len(ids) != len(kwargs):
                raise ValueError(f"{path}: record {i} (key {row['key']}) has {len(ids)} instruction ids "
                                 f"and {len(kwargs)} kwargs; IFEval pairs them one to one")
            try:
                cleaned = [clean_kwargs(iid, kw) for iid, kw in zip(ids, kwargs)]
            except ValueError as e:
                raise ValueError(f"{path}: record {i} (key {row['key']}): {e}") from None
            out.append(Problem(
                id=f"ifeval/{row['key']}",
                prompt=str(row["prompt"]),
                answer={"instruction_id_list": ids, "kwargs": cleaned},
                meta={"key": row["key"]},
            ))
        return out

    def verify(self, problem: Problem, completion: str) -> float:
        return score(problem.answer, completion, self.metric)
