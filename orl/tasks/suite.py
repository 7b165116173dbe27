"""The embedded task suite: generated tasks whose written work is a chain, each step needing the last.

Why it exists: on `arith` (orl.tasks.arith) the base model has little sequential dependency left
to resolve (at a low decoder threshold it commits most of a block per forward and stays accurate),
and its verifier reads only the final ``#answer``. Each family here writes its work as a chain of
steps in which a step's values follow from the previous step's *written* values, chosen to be hard
for a small model to read off the prompt in one forward (whether the base's accuracy-TPF frontier
then bends is measured, not assumed: benchmarks/suite_calibrate.py); its strict verifier checks
every step.

Families (defaults sized for the demo's `small` model and the character tokenizer: prompts of 6-18
characters, responses of 29-43 characters, i.e. two (string) or three 16-token blocks with the EOS):

  carry_add  ``4567+7898=`` -> ``7+8+0=15;6+9+1=16;5+8+1=14;4+7+1=12;#12465``: long addition, least
             significant digit first; each step adds the column's digits and the carry (the tens of
             the previous step's sum).
  carry_mul  ``567*8=`` -> ``7*8=56+0=56;6*8=48+5=53;5*8=40+5=45;#4536``: a number times one digit,
             the same way, each column's product written before its carry is added; the carry can be
             0-8, so it is uncertain far more often than in addition.
  chain      ``26;+9;*2;+2;/2;/3=`` -> ``26+9=35;35*2=70;70+2=72;72/2=36;36/3=12;#12``: one-digit
             operations applied left to right, each line the previous result transformed (values
             kept in 0..max_value, divisions exact).
  string     ``282800019=`` -> ``23;85;25;80;02;04;07;15;93;#3``: a running state machine
             over a digit string: for each input digit x, write x and the new state y = T[x][previous
             y] (state 0 before the first); T is a fixed random table of permutations (``rule="perm"``:
             no algebraic shortcut, each state needs the previous one) or addition mod 10
             (``rule="sum"``: a running digit sum, probably easier to sum ahead, as arith's sums were).

Common contract (as `arith`): problem i of a split is a function of (seed, split, i) only; the
held-out split holds exactly the prompts whose stable hash falls in bucket 0 of 10 and the train
stream never yields one, so train and held-out never share a problem. ``verify`` is the strict
score, the one ORL rewards and the headline of evaluation use: the response must be the whole
chain, every step right and consistent with the prompt and the step before it, and the final
answer right (for the deterministic formats here that is the gold solution, whitespace aside).
``verify_final`` reads only the first ``#<int>``, as `arith` does, so evaluation can report both;
``diagnose`` names the first thing that is wrong (for failure tables).

Does not own: tokenization, decoding, recipes (orl/recipes/suite.py), the calibration of the
defaults against the base model (benchmarks/suite_calibrate.py).
"""
from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass, field

from .base import Problem

_FINAL = re.compile(r"#\s*(-?\d+)")
_INT = re.compile(r"-?\d+")
_WS = re.compile(r"\s+")


def held_out(prompt: str) -> bool:
    """True when ``prompt`` belongs to the held-out split (bucket 0 of 10 of its SHA-256)."""
    return hashlib.sha256(prompt.encode()).digest()[0] % 10 == 0


def split_work(completion: str) -> tuple[list[str], str] | None:
    """``"a;b;#7"`` -> (["a", "b"], "7"); None unless the text (whitespace removed) is lines then ``#<int>``."""
    parts = _WS.sub("", completion).split(";")
    if len(parts) < 2 or not parts[-1].startswith("#") or not _INT.fullmatch(parts[-1][1:]):
        return None
    return parts[:-1], parts[-1][1:]


def final_correct(problem: Problem, completion: str) -> float:
    """The final-answer score: the first ``#<int>`` equals the answer (the work is not read)."""
    m = _FINAL.findall(completion)
    return 1.0 if m and int(m[0]) == int(problem.answer) else 0.0


class _Generated:
    """Deterministic train stream and held-out split over a family's ``_draw(rng) -> Problem``.

    Subclasses are dataclasses with ``seed``, ``n_test`` and ``name`` fields and a ``diagnose``.
    """

    seed: int
    n_test: int
    name: str

    def _draw(self, rng: random.Random, pid: str) -> Problem:
        raise NotImplementedError

    def sample(self, split: str, index: int) -> Problem:
        """Problem ``index`` of ``split`` (an infinite stream for "train")."""
        want_test = split == "test"
        rng = random.Random(f"{self.seed}:{split}:{index}")
        while True:
            p = self._draw(rng, f"{self.name}-{split}-{index}")
            if held_out(p.prompt) == want_test:
                return p

    def problems(self, split: str) -> list[Problem]:
        """``n_test`` distinct held-out problems ("test"), or the first 10 x n_test of the train stream."""
        if split == "train":
            return [self.sample(split, i) for i in range(10 * self.n_test)]
        if split != "test":
            raise ValueError(f"{self.name} has splits 'train' and 'test', not {split!r}")
        rng, seen, out = random.Random(f"{self.seed}:test"), set(), []
        for _ in range(100 * self.n_test + 10_000):
            p = self._draw(rng, f"{self.name}-test-{len(out)}")
            if held_out(p.prompt) and p.prompt not in seen:
                seen.add(p.prompt)
                out.append(p)
                if len(out) == self.n_test:
                    return out
        raise ValueError(f"{self}: found only {len(out)} distinct held-out problems, fewer than n_test="
                         f"{self.n_test}; make the problems larger (more digits, steps or length)")

    def verify(self, problem: Problem, completion: str) -> float:
        """The strict score: 1.0 only if every written step and the final answer are right."""
        return 1.0 if self.diagnose(problem, completion) == "ok" else 0.0

    def verify_final(self, problem: Problem, completion: str) -> float:
        """The final-answer score (reported beside the strict one; never a reward)."""
        return final_correct(problem, completion)

    def diagnose(self, problem: Problem, completion: str) -> str:
        raise NotImplementedError


# ---------------------------------------------------------------- long addition / multiplication
@dataclass
class CarryTask(_Generated):
    """Column arithmetic with the carries written out, least significant digit first.

    ``op="+"``: ``terms`` numbers of ``digits`` digits (default 4); a step is ``a+b+k=s``, the column's
    digits and the carry k in. ``op="*"``: one ``digits``-digit number (default 3) times one digit m in
    2..9; a step is ``a*m=p+k=s``, the column's product, then the carry added. In both the carry in is
    the previous step's ``s // 10`` (0 at the first column) and the answer is the last ``s`` followed
    by the units of the earlier ones. (The product is written apart from the carry because the fused
    step ``a*m+k=s`` was too hard for the `small` model: after a 600-step SFT it got 83 % of first
    columns, k = 0, but about 30 % of the others; see benchmarks/suite_calibrate.py.)
    """

    op: str = "+"
    terms: int = 2                 # "+" only
    digits: int | None = None      # None -> 4 for "+", 3 for "*"
    seed: int = 0
    n_test: int = 500
    name: str = ""                 # "" -> carry_add / carry_mul

    def __post_init__(self) -> None:
        if self.op not in ("+", "*"):
            raise ValueError(f"carry op must be '+' or '*', got {self.op!r}")
        self.digits = self.digits or (4 if self.op == "+" else 3)
        if self.digits < 1 or (self.op == "+" and self.terms < 2):
            raise ValueError(f"carry needs digits >= 1 and (for '+') terms >= 2, got digits={self.digits}, "
                             f"terms={self.terms}")
        self.name = self.name or ("carry_add" if self.op == "+" else "carry_mul")

    def _draw(self, rng: random.Random, pid: str) -> Problem:
        lo, hi = 10 ** (self.digits - 1), 10 ** self.digits - 1
        if self.op == "+":
            ops = [rng.randint(lo, hi) for _ in range(self.terms)]
            answer = sum(ops)
        else:
            ops = [rng.randint(lo, hi), rng.randint(2, 9)]
            answer = ops[0] * ops[1]
        return Problem(id=pid, prompt=self.op.join(map(str, ops)) + "=", answer=answer, meta={"operands": ops})

    def columns(self, problem: Problem) -> list[tuple[str, int]]:
        """Per column, least significant first: the expression text (``a+b`` or ``a*m``) and its value."""
        ops = problem.meta["operands"]
        if self.op == "+":
            cols = [[int(str(x)[-1 - i]) for x in ops] for i in range(self.digits)]
            return [("+".join(map(str, c)), sum(c)) for c in cols]
        a, m = str(ops[0]), ops[1]
        return [(f"{a[-1 - i]}*{m}", int(a[-1 - i]) * m) for i in range(self.digits)]

    def solution(self, problem: Problem) -> str:
        lines, carry = [], 0
        for expr, value in self.columns(problem):
            s = value + carry
            lines.append(f"{expr}+{carry}={s}" if self.op == "+" else f"{expr}={value}+{carry}={s}")
            carry = s // 10
        return ";".join(lines) + f";#{problem.answer}"

    def diagnose(self, problem: Problem, completion: str) -> str:
        """"ok", or the first fault: "malformed", "steps" (count), "operands" (a column's digits),
        "product" (``*`` only), "carry" (not the previous written sum's tens), "sum", "final"."""
        work = split_work(completion)
        if work is None:
            return "malformed"
        lines, final = work
        cols = self.columns(problem)
        if len(lines) != len(cols):
            return "steps"
        carry = 0
        for line, (expr, value) in zip(lines, cols):
            parts = line.split("=")
            if len(parts) != (2 if self.op == "+" else 3):
                return "malformed"
            if self.op == "+":
                (head, plus, k), p = parts[0].rpartition("+"), str(value)
            else:
                head, (p, plus, k) = parts[0], parts[1].partition("+")
            s = parts[-1]
            if not (plus and p.isdigit() and k.isdigit() and s.isdigit()):
                return "malformed"
            if head != expr:
                return "operands"
            if int(p) != value:
                return "product"
            if int(k) != carry:
                return "carry"
            if int(s) != value + carry:
                return "sum"
            carry = int(s) // 10
        return "ok" if int(final) == int(problem.answer) else "final"


# ---------------------------------------------------------------- multi-step arithmetic
_APPLY = {"+": lambda v, k: v + k, "-": lambda v, k: v - k, "*": lambda v, k: v * k, "/": lambda v, k: v // k}


@dataclass
class ChainTask(_Generated):
    """A start value and ``steps`` one-digit operations applied left to right.

    Every intermediate value stays in 0..``max_value`` and every division is exact, so each line is
    ``v<op>k=r`` with small integers and the next line starts from r. An operation is drawn uniformly
    among those that keep to these rules, then its operand uniformly among the allowed ones.
    """

    steps: int = 5
    max_value: int = 99
    seed: int = 0
    n_test: int = 500
    name: str = "chain"
    ops: str = "+-*/"              # the operations drawn from; "+" alone: a running sum (start <= max_value - 9 steps)

    def __post_init__(self) -> None:
        if self.steps < 1 or self.max_value < 10:
            raise ValueError(f"chain needs steps >= 1 and max_value >= 10, got steps={self.steps}, "
                             f"max_value={self.max_value}")
        if not self.ops or set(self.ops) - set("+-*/") or self._start_max() < 10:
            raise ValueError(f"chain ops must be a non-empty subset of '+-*/' (got {self.ops!r}), and with ops "
                             f"'+' alone max_value >= 10 + 9 * steps (got max_value={self.max_value}, steps={self.steps})")

    def _start_max(self) -> int:
        """The largest start value: max_value, or (only "+": every step can add 9) max_value - 9 steps."""
        return self.max_value if set(self.ops) - {"+"} else self.max_value - 9 * self.steps

    def _choices(self, v: int) -> dict[str, list[int]]:
        c = {"+": list(range(1, min(9, self.max_value - v) + 1)), "-": list(range(1, min(9, v) + 1)),
             "*": [k for k in range(2, 10) if v >= 1 and v * k <= self.max_value],
             "/": [k for k in range(2, 10) if v >= 1 and v % k == 0]}
        return {op: ks for op, ks in c.items() if ks and op in self.ops}

    def _draw(self, rng: random.Random, pid: str) -> Problem:
        v = start = rng.randint(10, self._start_max())
        ops = []
        for _ in range(self.steps):
            c = self._choices(v)
            op = rng.choice(sorted(c))
            k = rng.choice(c[op])
            ops.append((op, k))
            v = _APPLY[op](v, k)
        prompt = f"{start};" + ";".join(f"{op}{k}" for op, k in ops) + "="
        return Problem(id=pid, prompt=prompt, answer=v, meta={"start": start, "ops": [list(o) for o in ops]})

    def solution(self, problem: Problem) -> str:
        v, lines = problem.meta["start"], []
        for op, k in problem.meta["ops"]:
            r = _APPLY[op](v, k)
            lines.append(f"{v}{op}{k}={r}")
            v = r
        return ";".join(lines) + f";#{v}"

    def diagnose(self, problem: Problem, completion: str) -> str:
        """"ok", or the first fault: "malformed", "steps", "chain" (a line does not start from the
        previous written result), "operation" (not the prompt's), "value" (wrong result), "final"."""
        work = split_work(completion)
        if work is None:
            return "malformed"
        lines, final = work
        if len(lines) != len(problem.meta["ops"]):
            return "steps"
        prev = problem.meta["start"]
        for line, (op, k) in zip(lines, problem.meta["ops"]):
            m = re.fullmatch(r"(\d+)([-+*/])(\d+)=(\d+)", line)
            if m is None:
                return "malformed"
            v, o, kk, r = int(m[1]), m[2], int(m[3]), int(m[4])
            if v != prev:
                return "chain"
            if (o, kk) != (op, k):
                return "operation"
            if r != _APPLY[op](v, k):
                return "value"
            prev = r
        return "ok" if int(final) == int(problem.answer) else "final"


# ---------------------------------------------------------------- running state machine over a string
@dataclass
class StringTask(_Generated):
    """A digit string of ``length`` read by a 10-state machine: write each input digit and the state after it.

    ``rule="perm"``: state' = T[x][state] with T[x] a permutation of 0..9 drawn from ``table_seed``
    (bijective steps: no information is lost and nothing but the previous state predicts the next);
    ``rule="sum"``: state' = (state + x) mod 10. The answer is the last state.
    """

    length: int = 9
    rule: str = "perm"
    table_seed: int = 0
    seed: int = 0
    n_test: int = 500
    name: str = "string"
    table: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.length < 1 or self.rule not in ("perm", "sum"):
            raise ValueError(f"string needs length >= 1 and rule 'perm' or 'sum', got length={self.length}, "
                             f"rule={self.rule!r}")
        if self.rule == "sum":
            self.table = tuple(tuple((x + y) % 10 for y in range(10)) for x in range(10))
        else:
            rng, rows = random.Random(f"automaton:{self.table_seed}"), []
            for _ in range(10):
                row = list(range(10))
                rng.shuffle(row)
                rows.append(tuple(row))
            self.table = tuple(rows)

    def _draw(self, rng: random.Random, pid: str) -> Problem:
        xs = "".join(str(rng.randint(0, 9)) for _ in range(self.length))
        return Problem(id=pid, prompt=xs + "=", answer=self.states(xs)[-1], meta={"input": xs})

    def states(self, xs: str) -> list[int]:
        out, y = [], 0
        for x in xs:
            y = self.table[int(x)][y]
            out.append(y)
        return out

    def solution(self, problem: Problem) -> str:
        xs = problem.meta["input"]
        return ";".join(f"{x}{y}" for x, y in zip(xs, self.states(xs))) + f";#{problem.answer}"

    def diagnose(self, problem: Problem, completion: str) -> str:
        """"ok", or the first fault: "malformed", "steps", "copy" (an input digit miswritten), "state"
        (not T[x][previous written state]), "final". Strict = exact match of the whole output."""
        work = split_work(completion)
        if work is None:
            return "malformed"
        lines, final = work
        xs = problem.meta["input"]
        if len(lines) != len(xs):
            return "steps"
        y = 0
        for line, x in zip(lines, xs):
            if len(line) != 2 or not line.isdigit():
                return "malformed"
            if line[0] != x:
                return "copy"
            if int(line[1]) != self.table[int(x)][y]:
                return "state"
            y = int(line[1])
        return "ok" if int(final) == int(problem.answer) else "final"


# ---------------------------------------------------------------- a chain written in many phrasings
_WORD = {"+": "plus", "-": "minus", "*": "times", "/": "over"}
_VERB = {"+": ("add", "to"), "-": ("take", "from"), "*": ("multiply", "by"), "/": ("divide", "by")}
_SEPS = ("; ", ", then ", ". Next, ", ", so ")          # between two steps
_FINAL_SEPS = ("; ", ". ", ", so ")                     # before the answer
_SPLIT = re.compile(r";|,then|\.Next,|,so|\.")          # any separator, whitespace removed ("." last)
_P_SYMBOL = re.compile(r"(\d+)([-+*/])(\d+)=(\d+)")
_P_WORD = re.compile(r"(\d+)(plus|minus|times|over)(\d+)(?:is|gives|makes)(\d+)")
_P_VERB = re.compile(r"(add|take|multiply|divide)(\d+)(to|from|by)(\d+)(?::|gives)(\d+)")
_P_FINAL = re.compile(r"(?:theansweris)?#(\d+)")


@dataclass
class WordChainTask(ChainTask):
    """`chain`'s problems, each step written in one of several equally valid phrasings drawn at random.

    ``26;+9;*2;-5=`` -> ``26+9=35, then 2 times 35 is 70. Next, take 5 from 70: 65; the answer is #65``.
    Per step, uniformly: ``v<op>k=r``; ``k<op>v=r`` (``+`` and ``*`` only); ``v plus|minus|times|over k
    is|gives|makes r``; ``add k to v`` / ``take k from v`` / ``multiply v by k`` / ``divide v by k``, then
    ``: r`` or `` gives r``; steps joined by ``; `` / ``, then `` / ``. Next, `` / ``, so ``; the answer
    after ``; `` / ``. `` / ``, so ``, as ``#r`` or ``the answer is #r``. The phrasing is drawn per problem
    (deterministic in its id), so a model trained on the data cannot know how a step will be written
    until the text picks one: the uncertainty that keeps a threshold decoder of a real diffusion LM at
    2-3 tokens per forward on GSM8K-style answers, which `chain` (one phrasing) lacks. The values still
    chain: each step starts from the previous written result. ``phrasing="one"`` writes every step as
    ``chain`` does (``v<op>k=r``, ``; ``): the same problems with the ambiguity removed, a control.

    The strict verifier reads the text with whitespace removed and accepts every phrasing above, in any
    mix: each step must be the prompt's operation on the previous written result (operands in either
    order for ``+`` and ``*``) with the right value, and the answer the last result.
    """

    steps: int = 8
    max_value: int = 50
    phrasing: str = "many"     # "many": the forms above at random; "one": chain's single form
    name: str = "wordchain"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.phrasing not in ("many", "one"):
            raise ValueError(f"wordchain phrasing must be 'many' or 'one', got {self.phrasing!r}")

    @staticmethod
    def phrase(v: int, op: str, k: int, r: int, rng: random.Random) -> str:
        """One step ``v op k = r`` in a phrasing drawn from ``rng`` (each form equally likely)."""
        forms = [f"{v}{op}{k}={r}", f"{v} {_WORD[op]} {k} {rng.choice(('is', 'gives', 'makes'))} {r}"]
        verb, prep = _VERB[op]
        a, b = (k, v) if op in "+-" else (v, k)
        forms.append(f"{verb} {a} {prep} {b}{rng.choice((': ', ' gives '))}{r}")
        if op in "+*":
            forms.append(f"{k}{op}{v}={r}")
        return rng.choice(forms)

    def solution(self, problem: Problem) -> str:
        """A worked solution as the SFT data teaches it: a phrasing per step drawn from the problem id."""
        if self.phrasing == "one":
            return super().solution(problem)
        rng = random.Random(f"phrasing:{problem.id}")
        v, text = problem.meta["start"], ""
        for i, (op, k) in enumerate(problem.meta["ops"]):
            r = _APPLY[op](v, k)
            text += (rng.choice(_SEPS) if i else "") + self.phrase(v, op, k, r, rng)
            v = r
        return text + rng.choice(_FINAL_SEPS) + rng.choice(("", "the answer is ")) + f"#{v}"

    @staticmethod
    def read_step(piece: str) -> tuple[tuple[int, int], str, int] | None:
        """A step's text (whitespace removed) -> ((first operand, second operand), op, result), the
        operands as written, with ``add k to v`` / ``take k from v`` put back as (v, k); None if no form."""
        if m := _P_SYMBOL.fullmatch(piece):
            return (int(m[1]), int(m[3])), m[2], int(m[4])
        if m := _P_WORD.fullmatch(piece):
            return (int(m[1]), int(m[3])), {w: o for o, w in _WORD.items()}[m[2]], int(m[4])
        if m := _P_VERB.fullmatch(piece):
            op = {v[0]: o for o, v in _VERB.items()}[m[1]]
            if m[3] != _VERB[op][1]:
                return None
            a, b = int(m[2]), int(m[4])
            return ((b, a) if op in "+-" else (a, b)), op, int(m[5])
        return None

    def diagnose(self, problem: Problem, completion: str) -> str:
        """"ok", or the first fault: "malformed" (a piece in no phrasing), "steps", "chain" (a step does
        not start from the previous written result), "operation" (not the prompt's), "value", "final"."""
        pieces = _SPLIT.split(_WS.sub("", completion))
        final = _P_FINAL.fullmatch(pieces[-1])
        if len(pieces) < 2 or final is None:
            return "malformed"
        steps = [self.read_step(x) for x in pieces[:-1]]
        if any(s is None for s in steps):
            return "malformed"
        if len(steps) != len(problem.meta["ops"]):
            return "steps"
        prev = problem.meta["start"]
        for ((a, b), o, r), (op, k) in zip(steps, problem.meta["ops"]):
            if o != op:
                return "operation"
            if (a, b) != (prev, k) and not (op in "+*" and (b, a) == (prev, k)):
                return "chain" if prev not in (a, b) else "operation"
            if r != _APPLY[op](prev, k):
                return "value"
            prev = r
        return "ok" if int(final[1]) == int(problem.answer) else "final"


def make_task(family: str, **kw) -> _Generated:
    """A suite task by family name: carry_add, carry_mul, chain, string or wordchain (the suite's arith family is
    `orl.tasks.arith.ArithTask(strict=True)`; `orl.tasks.registry.get_task` builds every family)."""
    makers = {"carry_add": lambda: CarryTask(op="+", **kw), "carry_mul": lambda: CarryTask(op="*", **kw),
              "chain": lambda: ChainTask(**kw), "string": lambda: StringTask(**kw),
              "wordchain": lambda: WordChainTask(**kw)}
    if family not in makers:
        raise ValueError(f"unknown suite family {family!r}; choose one of {sorted(makers)}")
    return makers[family]()
