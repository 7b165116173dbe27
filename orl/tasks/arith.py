"""The embedded default task: multi-term addition with carries, written out step by step.

Prompt ``7+8+9+6=``; response ``7+8=15;15+9=24;24+6=30;#30`` (defaults: four one-digit terms),
or, for a fraction ``shuffle`` of the problems (default 1/4), the same sums in another order of the
terms. Each partial sum depends on the previous one and each digit of a sum on the carries below
it, and the worked text has a dominant style (prompt order) with variations, as real SFT data has:
a model trained on it is unsure which style a response takes until it commits one, so its decoder
commits few tokens per forward -- the room ORL needs to show a gain. (All orders shuffled,
``shuffle=1``, makes the ambiguity symmetric and far harder to resolve; docs/LOG.md.)

Deterministic generator: problem i of a split is a function of (seed, split, i) only. The
held-out split holds exactly the operand tuples whose stable hash falls in bucket 0 of 10; the
train split never yields one of them, so train and held-out never share a problem.
The default verifier reads the first ``#<int>`` and compares it with the true sum; the worked
steps are not graded (a right answer with a wrong intermediate line still counts, as for GSM8K).
``strict=True`` (the embedded suite's ``arith`` family, orl/recipes/suite.py) grades the work:
every line ``a+b=c`` a right sum, each line continuing from the previous sum, the prompt's terms
each used once (in any order: every order the SFT data teaches is right), and the final answer the
last sum; ``verify_final`` is then the lenient score, reported beside it.
"""
from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass

from .base import Problem
from .suite import split_work

_FINAL = re.compile(r"#\s*(-?\d+)")
_LINE = re.compile(r"(\d+)\+(\d+)=(\d+)")


@dataclass
class ArithTask:
    """``terms`` operands of ``digits`` digits each (leading digit non-zero)."""

    terms: int = 4
    digits: int = 1
    seed: int = 0
    n_test: int = 500
    shuffle: float = 0.25         # fraction of worked solutions that add the terms in a random order
                                  # instead of the prompt's (True = 1.0; see `solution`)
    strict: bool = False          # verify the worked steps too (`diagnose`), not only the final answer
    name: str = "arith"

    def __post_init__(self) -> None:
        if self.terms < 2 or self.digits < 1:
            raise ValueError(f"arith needs terms >= 2 and digits >= 1, got terms={self.terms}, digits={self.digits}")
        if not 0 <= float(self.shuffle) <= 1:
            raise ValueError(f"arith shuffle is a fraction of problems in [0, 1], got {self.shuffle}")

    # ---------------------------------------------------------------- generation
    def _operands(self, rng: random.Random) -> tuple[int, ...]:
        lo, hi = 10 ** (self.digits - 1), 10 ** self.digits - 1
        return tuple(rng.randint(lo, hi) for _ in range(self.terms))

    @staticmethod
    def _held_out(ops: tuple[int, ...]) -> bool:
        h = hashlib.sha256(",".join(map(str, ops)).encode()).digest()
        return h[0] % 10 == 0

    def make(self, ops: tuple[int, ...], pid: str) -> Problem:
        return Problem(id=pid, prompt="+".join(map(str, ops)) + "=", answer=sum(ops), meta={"operands": list(ops)})

    def sample(self, split: str, index: int) -> Problem:
        """Problem ``index`` of ``split`` (an infinite stream for "train")."""
        want_test = split == "test"
        rng = random.Random(f"{self.seed}:{split}:{index}")
        while True:
            ops = self._operands(rng)
            if self._held_out(ops) == want_test:
                return self.make(ops, f"{self.name}-{split}-{index}")

    def problems(self, split: str) -> list[Problem]:
        """``n_test`` distinct held-out problems ("test"), or the first 10 x n_test of the train stream."""
        if split == "train":
            return [self.sample(split, i) for i in range(10 * self.n_test)]
        if split != "test":
            raise ValueError(f"arith has splits 'train' and 'test', not {split!r}")
        rng, seen, out = random.Random(f"{self.seed}:test"), set(), []
        space = (9 * 10 ** (self.digits - 1)) ** self.terms
        if space // 10 < self.n_test:
            raise ValueError(f"terms={self.terms}, digits={self.digits} hold about {space // 10} held-out problems, "
                             f"fewer than n_test={self.n_test}; use more terms or digits")
        while len(out) < self.n_test:
            ops = self._operands(rng)
            if self._held_out(ops) and ops not in seen:
                seen.add(ops)
                out.append(self.make(ops, f"{self.name}-test-{len(out)}"))
        return out

    # ---------------------------------------------------------------- solution and verifier
    def solution(self, problem: Problem) -> str:
        """The worked solution the SFT data teaches. With ``shuffle`` the terms are added in an order
        drawn per problem (deterministic in the problem id): many different worked solutions are
        correct, as in real data, so a model trained on them is uncertain about the order until it
        commits to one -- the ambiguity that limits how many tokens its decoder can commit at once."""
        ops = list(problem.meta["operands"])
        rng = random.Random(f"order:{problem.id}")
        p = float(self.shuffle)
        if p >= 1 or (p > 0 and rng.random() < p):
            rng.shuffle(ops)
        lines, acc = [], ops[0]
        for x in ops[1:]:
            lines.append(f"{acc}+{x}={acc + x}")
            acc += x
        return ";".join(lines) + f";#{acc}"

    def verify(self, problem: Problem, completion: str) -> float:
        if self.strict:
            return 1.0 if self.diagnose(problem, completion) == "ok" else 0.0
        return self.verify_final(problem, completion)

    def verify_final(self, problem: Problem, completion: str) -> float:
        """The final-answer score: the first ``#<int>`` equals the sum (the work is not read)."""
        m = _FINAL.findall(completion)
        return 1.0 if m and int(m[0]) == int(problem.answer) else 0.0

    def diagnose(self, problem: Problem, completion: str) -> str:
        """The strict verifier's verdict: "ok", or the first fault of "malformed" (not lines ``a+b=c``
        then ``#<int>``), "sum" (a line's sum is wrong), "chain" (a line does not start from the
        previous sum), "operands" (the terms added are not the prompt's, each once), "final" (the
        answer is not the last sum)."""
        work = split_work(completion)
        lines = [_LINE.fullmatch(x) for x in work[0]] if work else []
        if not work or not all(lines):
            return "malformed"
        nums = [tuple(map(int, m.groups())) for m in lines]
        if any(a + b != c for a, b, c in nums):
            return "sum"
        if any(nums[i][0] != nums[i - 1][2] for i in range(1, len(nums))):
            return "chain"
        if sorted([nums[0][0], *(b for _, b, _ in nums)]) != sorted(problem.meta["operands"]):
            return "operands"
        if int(work[1]) != nums[-1][2]:
            return "final"
        return "ok"


def make_task(**kw) -> ArithTask:
    return ArithTask(**kw)
