"""GPQA (graduate-level 4-option multiple choice; Diamond: 198 questions): loading, prompt, verifier.

Data: no installable package ships GPQA, and its terms ask that it not be shared in plain text:
the release is a password-protected zip (Rein et al., 2023; also the gated Hugging Face dataset
``Idavidrein/gpqa``). The loader reads the CSV you extract from it, by default
``$ORL_DATA/gpqa/gpqa_diamond.csv`` (``variant="main"`` / ``"extended"`` read ``gpqa_main.csv``
/ ``gpqa_extended.csv``). Columns used: ``Question``, ``Correct Answer``, ``Incorrect Answer 1``
to ``3``, and, when present, ``Record ID``, ``High-level domain`` and ``Subdomain``; the other
columns are ignored. Nothing is recorded for the file, so the user pins it by passing its SHA256
(``GPQA(sha256=...)``); the first attempt without one prints the hash to pin.

The options are shuffled, since the file always lists the correct answer first. The order is a
pure function of ``seed`` and the question's Record ID (its text when there is none), computed
with SHA-256 and not with Python's ``random``, so it is the same on every machine, Python version
and row order (`choice_order`), and every problem records it: ``meta["order"]`` names the source
column of options A-D and ``meta["seed"]`` the seed. The seed is a task option, so `orl eval`
writes it into the prepared manifest.

Verification extracts one option letter as MMLU-Pro does (`orl.tasks.mmlu_pro.extract_letter`:
the last ``\\boxed{...}``, then "answer is (X)", then "Answer: X").

Does not own: few-shot or chain-of-thought prompt variants, chat templates, pools.
"""
from __future__ import annotations

import csv
import hashlib
from pathlib import Path

from orl.tasks.base import Problem
from orl.tasks.datafile import DataFile, check_file, local_data_root, require_keys
from orl.tasks.mmlu_pro import extract_letter

LETTERS = "ABCD"
SOURCES = ("Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")
VARIANTS = ("diamond", "main", "extended")


def choice_order(seed: int, key: str) -> list[int]:
    """Which of `SOURCES` is option A, B, C, D: a permutation of 0..3 (0 is the correct answer),
    ordered by SHA-256 of ``(seed, key, source)``: uniform, and the same everywhere."""
    def rank(i: int) -> bytes:
        return hashlib.sha256(f"gpqa/{seed}/{key}/{i}".encode()).digest()
    return sorted(range(len(SOURCES)), key=rank)


def read_csv(path: Path) -> list[dict[str, str]]:
    """The rows of a CSV file with a header line (a UTF-8 byte-order mark is ignored)."""
    with open(path, encoding="utf-8-sig", newline="") as f:
        return list(csv.DictReader(f))


class GPQA:
    """GPQA over a local CSV; ``sha256`` pins it (required); ``seed`` sets the option shuffle."""

    def __init__(self, variant: str = "diamond", path: str | None = None, sha256: str | None = None,
                 seed: int = 0):
        if variant not in VARIANTS:
            raise ValueError(f"GPQA variant must be one of {', '.join(VARIANTS)}, not {variant!r}")
        self.variant = variant
        self.name = f"gpqa-{variant}"
        self.path = path
        self.sha256 = sha256
        self.seed = int(seed)

    def data_file(self, split: str = "test") -> DataFile:
        if split != "test":
            raise ValueError(f"GPQA has only the split 'test', not {split!r}")
        path = Path(self.path) if self.path else local_data_root() / "gpqa" / f"gpqa_{self.variant}.csv"
        return DataFile(path, None, (
            f"No package ships GPQA (its terms rule out plain-text copies): extract gpqa_{self.variant}.csv "
            "from the release's password-protected zip (or export the gated Hugging Face dataset "
            "Idavidrein/gpqa) to this path, set $ORL_DATA, or pass path=..."
        ))

    def problems(self, split: str = "test") -> list[Problem]:
        path = check_file(self.data_file(split), self.sha256)
        out = []
        for i, row in enumerate(read_csv(path)):
            require_keys(row, ("Question", *SOURCES), path, i)
            texts = [str(row[s]).strip() for s in SOURCES]
            question = str(row["Question"]).strip()
            if not question or not all(texts):
                raise ValueError(f"{path}: record {i} has an empty question or option")
            rid = (row.get("Record ID") or "").strip()
            order = choice_order(self.seed, rid or question)
            domain = (row.get("High-level domain") or "").strip()
            lines = [
                (f"The following is a multiple choice question{f' about {domain}' if domain else ''}. "
                 "Think step by step, then put the letter of the correct option within \\boxed{}."),
                "",
                f"Question: {question}",
                "Options:",
                *(f"{LETTERS[j]}. {texts[src]}" for j, src in enumerate(order)),
            ]
            out.append(Problem(
                id=f"{self.name}/{rid or i}",
                prompt="\n".join(lines),
                answer=LETTERS[order.index(0)],
                meta={"seed": self.seed, "order": [SOURCES[src] for src in order], "domain": domain,
                      "subdomain": (row.get("Subdomain") or "").strip()},
            ))
        return out

    def verify(self, problem: Problem, completion: str) -> float:
        return 1.0 if extract_letter(completion) == problem.answer else 0.0
