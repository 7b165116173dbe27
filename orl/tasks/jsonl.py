"""A task from a data file: prompt/answer records and one named verifier (``--task data.jsonl --verifier V``).

The file is JSONL (one JSON object per line; ``.jsonl.gz`` too) or a ``.json`` array of objects.
Each record:

* ``prompt`` (required): the text the model sees;
* ``answer`` (required): the reference, read by the verifier -- for ``exact`` the text the completion
  must be, for ``math`` an answer math-verify reads (``72``, ``\\frac{3}{4}``, ``x^2+1``), for ``code``
  Python test code (asserts) that calls the function the completion must define;
* ``solution`` (optional): the worked solution `orl sft` trains on (default: the answer, for
  ``exact`` and ``math``; ``code`` needs one per record, since its answer is tests);
* ``id`` (optional): a stable id, unique in the file (default: ``line-N``, N its record number);
* ``split`` (optional): ``"train"`` or ``"test"``. Without it, a record is held out (``test``) when a
  hash of its id falls below ``held_out`` (10 % by default): deterministic and the same in every
  process, and a record keeps its split when others are added.

Verifiers, one per task (docs/STYLE.md convention 6: training rewards and evaluation call the same
`verify`):

* ``exact``: the completion, surrounding whitespace stripped, equals the answer stripped;
* ``math``: `orl.tasks.mathcheck.math_score` (the GSM8K / MATH-500 checker) of the answer and the
  completion;
* ``code``: the completion's code (a fenced block, else the text) runs in `orl.eval.sandbox`, the
  answer's asserts in its harness, as MBPP's do (`orl.tasks.mbpp.run`): every name the asserts use
  and do not define is the candidate's function of that name; an optional ``setup`` field holds
  trusted code run before the asserts (imports, helpers).

Does not own: reading files (`orl.tasks.datafile`), the checkers (`mathcheck`, `orl.eval.sandbox`).
"""
from __future__ import annotations

import hashlib
import random
from pathlib import Path

from orl.tasks.base import Problem
from orl.tasks.datafile import DataFile, read_jsonl, read_records, require_keys

VERIFIERS = ("exact", "math", "code")


class JsonlTask:
    """Prompt/answer records from ``path``, checked by ``verifier`` (see the module docstring).
    ``held_out``: the share of records without a ``split`` field that form the ``test`` split;
    ``seed``: the order `sample` walks the train records in (reshuffled every pass)."""

    def __init__(self, path: str, verifier: str = "exact", held_out: float = 0.1, seed: int = 0,
                 sandbox: dict | None = None):
        if verifier not in VERIFIERS:
            raise ValueError(f"verifier must be one of {', '.join(VERIFIERS)} (got {verifier!r}): exact = the "
                             "completion equals the answer, math = math-verify, code = the answer's asserts "
                             "in the sandbox")
        if not 0.0 <= held_out < 1.0:
            raise ValueError(f"held_out must be in [0, 1) (got {held_out!r})")
        self.path, self.verifier, self.held_out, self.seed = str(path), verifier, float(held_out), int(seed)
        self.sandbox = sandbox or {}
        file = Path(self.path)
        if not file.is_file():
            raise FileNotFoundError(f"task data file not found: {file.resolve()} (a JSONL of "
                                    '{"prompt": ..., "answer": ...} records, one per line)')
        base = file.name
        for suffix in (".gz", ".jsonl", ".json"):
            base = base.removesuffix(suffix)
        self.name = base or "data"
        self._splits: dict[str, list[Problem]] | None = None

    def data_file(self, split: str = "test") -> DataFile:
        """The source file, for a prepared manifest's record of what it was made from."""
        return DataFile(Path(self.path), None, "your own data file")

    def _load(self) -> dict[str, list[Problem]]:
        if self._splits is not None:
            return self._splits
        path = Path(self.path)
        rows = read_jsonl(path) if path.name.endswith((".jsonl", ".jsonl.gz")) else read_records(path)
        out: dict[str, list[Problem]] = {"train": [], "test": []}
        seen: dict[str, int] = {}
        for i, row in enumerate(rows):
            require_keys(row, ("prompt", "answer"), path, i)
            pid = str(row.get("id", f"line-{i + 1}"))
            if pid in seen:
                raise ValueError(f"{path}: records {seen[pid]} and {i} share the id {pid!r}; ids must be unique")
            seen[pid] = i
            if not isinstance(row["prompt"], str) or not row["prompt"]:
                raise ValueError(f"{path}: record {i} (id {pid!r}) has an empty or non-string prompt")
            if self.verifier == "code" and not isinstance(row["answer"], str):
                raise ValueError(f"{path}: record {i} (id {pid!r}): the code verifier's answer is Python test "
                                 f"code (asserts) as a string, got {type(row['answer']).__name__}")
            split = row.get("split") or ("test" if _hash_unit(pid) < self.held_out else "train")
            if split not in out:
                raise ValueError(f"{path}: record {i} (id {pid!r}) has split {split!r}; use 'train' or 'test'")
            meta = {k: row[k] for k in ("solution", "setup") if k in row}
            out[split].append(Problem(id=pid, prompt=row["prompt"], answer=row["answer"], meta=meta))
        self._splits = out
        return out

    def problems(self, split: str = "test") -> list[Problem]:
        splits = self._load()
        if split not in splits:
            raise ValueError(f"task {self.name!r} has the splits 'train' and 'test', not {split!r}")
        if not splits[split]:
            raise ValueError(f"{self.path} has no {split!r} records ({len(splits['train'])} train, "
                             f"{len(splits['test'])} test): mark some with \"split\": \"{split}\""
                             + (" or raise held_out" if split == "test" else ""))
        return list(splits[split])

    def sample(self, split: str, index: int) -> Problem:
        """The ``index``-th problem of an endless stream over ``split``: every pass over the records
        in its own shuffled order (a function of seed, split and pass only)."""
        probs = self.problems(split)
        epoch, i = divmod(index, len(probs))
        order = list(range(len(probs)))
        random.Random(f"{self.seed}:{split}:{epoch}").shuffle(order)
        return probs[order[i]]

    def solution(self, problem: Problem) -> str:
        if "solution" in problem.meta:
            return str(problem.meta["solution"])
        if self.verifier == "code":
            raise TypeError(f"{self.path}: record {problem.id!r} has no 'solution': the code verifier's answer is "
                            "tests, so SFT needs a worked solution (the code) in each training record")
        return str(problem.answer)

    def verify(self, problem: Problem, completion: str) -> float:
        if self.verifier == "exact":
            return 1.0 if completion.strip() == str(problem.answer).strip() else 0.0
        if self.verifier == "math":
            from orl.tasks.mathcheck import math_score  # noqa: PLC0415
            return math_score(str(problem.answer), completion)
        from orl.eval.sandbox import SandboxConfig  # noqa: PLC0415
        from orl.tasks import mbpp  # noqa: PLC0415
        answer = {"test_list": [problem.answer], "test_imports": [],
                  "test_setup_code": str(problem.meta.get("setup", ""))}
        return 1.0 if mbpp.run(answer, completion, SandboxConfig(**self.sandbox)).passed else 0.0


def _hash_unit(text: str) -> float:
    """A number in [0, 1) fixed by ``text`` (not Python's salted hash: the same in every process)."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big") / 2.0 ** 64
