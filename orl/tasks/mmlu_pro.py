"""MMLU-Pro (10-option multiple choice): loading, prompt and its single verifier.

Data: no installable package ships MMLU-Pro; the public release is a Hugging Face dataset with
records ``question_id, question, options (list of up to 10 strings), answer (letter A-J),
answer_index, category``. The loader reads a LOCAL JSON or JSONL export of that schema, default
``$ORL_DATA/mmlu-pro/{split}.jsonl`` (splits "test", "validation"). No canonical file hash exists
for an export, so the user pins it by passing ``sha256=...``.

Verification extracts one option letter: the last ``\\boxed{...}`` first, then MMLU-Pro's own
patterns ("answer is (X)", "Answer: X"); no math-verify involved (letters are not math).

Does not own: few-shot chain-of-thought prompts (zero-shot here), chat templates, pools.
"""
from __future__ import annotations

import re
from pathlib import Path

from orl.tasks.base import Problem
from orl.tasks.datafile import DataFile, check_file, local_data_root, read_records, require_keys
from orl.tasks.mathcheck import last_boxed

LETTERS = "ABCDEFGHIJ"
_BOXED_LETTER = re.compile(r"^\s*(?:\\text\{)?\s*\(?([A-J])\)?(?:[\s.:)}]|$)")
_ANSWER_IS = re.compile(r"answer is:?\s*\(?\$?(?:\\text\{)?([A-J])\b")
_ANSWER_COLON = re.compile(r"[Aa]nswer:\s*\(?([A-J])\b")


def extract_letter(completion: str) -> str | None:
    """The option letter a completion commits to, or None."""
    boxed = last_boxed(completion)
    if boxed is not None:
        m = _BOXED_LETTER.match(boxed)
        return m.group(1) if m else None
    for pattern in (_ANSWER_IS, _ANSWER_COLON):
        found = pattern.findall(completion)
        if found:
            return found[-1]
    return None


class MMLUPro:
    """MMLU-Pro task over a local file; ``sha256`` pins it (required: nothing is recorded)."""

    name = "mmlu-pro"

    def __init__(self, path: str | None = None, sha256: str | None = None):
        self.path = path
        self.sha256 = sha256

    def data_file(self, split: str = "test") -> DataFile:
        if split not in ("test", "validation"):
            raise ValueError(f"MMLU-Pro has splits 'test' and 'validation', not {split!r}")
        path = Path(self.path) if self.path else local_data_root() / "mmlu-pro" / f"{split}.jsonl"
        return DataFile(path, None, (
            "No package ships MMLU-Pro: export the public release's split (question, options, "
            "answer letter) to JSONL at this path, set $ORL_DATA, or pass path=..."
        ))

    def problems(self, split: str = "test") -> list[Problem]:
        path = check_file(self.data_file(split), self.sha256)
        out = []
        for i, row in enumerate(read_records(path)):
            require_keys(row, ("question", "options", "answer"), path, i)
            options = list(row["options"])
            answer = str(row["answer"]).strip().upper()
            if not 2 <= len(options) <= len(LETTERS) or answer not in LETTERS[: len(options)]:
                raise ValueError(f"{path}: record {i} has answer {answer!r} for {len(options)} options")
            category = row.get("category", "")
            lines = [
                f"The following is a multiple choice question{f' about {category}' if category else ''}. "
                "Think step by step, then put the letter of the correct option within \\boxed{}.",
                "",
                f"Question: {str(row['question']).strip()}",
                "Options:",
                *(f"{LETTERS[j]}. {opt}" for j, opt in enumerate(options)),
            ]
            out.append(Problem(
                id=f"mmlu-pro/{row.get('question_id', i)}",
                prompt="\n".join(lines),
                answer=answer,
                meta={"category": category},
            ))
        return out

    def verify(self, problem: Problem, completion: str) -> float:
        return 1.0 if extract_letter(completion) == problem.answer else 0.0
