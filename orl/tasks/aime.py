"""AIME (American Invitational Mathematics Examination): loading, prompt and its single verifier.

Data: no installable package ships AIME, and there is no single canonical release file, so the
loader reads a LOCAL JSON or JSONL file in the public Hugging Face layout (one record per
problem with ``problem`` and an integer ``answer`` in 0..999; ``id`` optional; capitalised keys
``Problem``/``Answer``/``ID`` as in some releases are accepted). Default location:
``$ORL_DATA/aime/aime.jsonl``. Because nothing is recorded for it, the user pins the file by
passing its SHA256 (``AIME(sha256=...)``); the first attempt without one prints the hash to pin.

Verification is `orl.tasks.mathcheck.math_score` against the integer answer.

Does not own: which AIME year is evaluated (the file decides), chat templates, pools.
"""
from __future__ import annotations

from pathlib import Path

from orl.tasks.base import Problem
from orl.tasks.datafile import DataFile, check_file, local_data_root, read_records
from orl.tasks.mathcheck import BOXED_INSTRUCTION, math_score


def _get(row: dict, key: str):
    for k in (key, key.capitalize(), key.upper()):
        if k in row:
            return row[k]
    return None


class AIME:
    """AIME task over a local file; ``sha256`` pins it (required: nothing is recorded)."""

    name = "aime"

    def __init__(self, path: str | None = None, sha256: str | None = None, timeout_s: int = 5):
        self.path = path
        self.sha256 = sha256
        self.timeout_s = timeout_s

    def data_file(self, split: str = "test") -> DataFile:
        if split != "test":
            raise ValueError(f"AIME has only the split 'test', not {split!r}")
        path = Path(self.path) if self.path else local_data_root() / "aime" / "aime.jsonl"
        return DataFile(path, None, (
            "No package ships AIME: export a release (records with problem and integer answer, "
            "e.g. a Hugging Face AIME 2024 set) to JSONL at this path, set $ORL_DATA, or pass path=..."
        ))

    def problems(self, split: str = "test") -> list[Problem]:
        path = check_file(self.data_file(split), self.sha256)
        out = []
        for i, row in enumerate(read_records(path)):
            problem, answer = _get(row, "problem"), _get(row, "answer")
            if problem is None or answer is None:
                raise ValueError(f"{path}: record {i} lacks problem/answer (has {', '.join(sorted(row))})")
            try:
                value = int(str(answer).strip())
            except ValueError:
                raise ValueError(f"{path}: record {i} has non-integer answer {answer!r}") from None
            if not 0 <= value <= 999:
                raise ValueError(f"{path}: record {i} answer {value} is outside AIME's 0..999")
            pid = _get(row, "id")
            out.append(Problem(
                id=f"aime/{pid if pid is not None else i}",
                prompt=f"{str(problem).strip()}\n{BOXED_INSTRUCTION}",
                answer=str(value),
            ))
        return out

    def verify(self, problem: Problem, completion: str) -> float:
        return math_score(problem.answer, completion, self.timeout_s)
