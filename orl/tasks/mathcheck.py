"""Math answer checking with math-verify: the one comparison behind GSM8K, MATH-500 and AIME.

`math_score(gold, completion)` is the single math verifier; the task files call it from their
`verify`, so training rewards and evaluation use the same code (docs/STYLE.md convention 6).

Configuration: the gold answer is wrapped in ``\\boxed{}`` and parsed as LaTeX or a plain
expression; the prediction is parsed with boxed answers first (``boxed_match_priority=0``, as
math-verify advises for rewards), then LaTeX anywhere, then the last plain expression (which is
how ``#### 72``, ``The answer is 72.0`` and ``1,234`` are read). We keep math-verify's default
normalization (``malformed_operators=True``, ``nits=True``), deviating from math-verify's advice
for rewards (turn both off): with them off, ``\\boxed{\\frac43}`` and ``\\frac 34`` (8 of MATH-500's
own gold answers, a form models copy) no longer match. ``verify(gold, pred)`` is called gold
first: the comparison is deliberately asymmetric.

Our one normalisation before parsing (`normalise`): an escaped dollar ``\\$`` -- a currency sign,
as in ``The answer is \\$18.`` -- is removed from the prediction. math-verify reads nothing from
``\\$18`` (it takes the ``$`` for an unclosed math delimiter), so a right answer scored 0.

Timeouts: math-verify enforces them with ``signal.alarm``, which only works in the main thread.
`math_score` uses them there (the main thread of an `orl.eval.pool` worker, where training rewards
and evaluation call it) and runs without them in other threads, where the caller must bound time
itself (the process pool kills a worker that overruns).

Does not own: answer extraction rules of single tasks (the task files), process pools.
"""
from __future__ import annotations

import re
import threading
from functools import lru_cache

# a backslash-escaped "$" (not one after an escaped backslash "\\\\", a LaTeX line break)
_ESCAPED_DOLLAR = re.compile(r"(?<!\\)((?:\\\\)*)\\\$")


@lru_cache(maxsize=1)
def _configs() -> tuple:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    gold = (LatexExtractionConfig(), ExprExtractionConfig())
    pred = (LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig())
    return gold, pred


def _timeout(timeout_s: int) -> int | None:
    """math-verify's signal-based timeout where it works (main thread), else None (no alarm)."""
    return timeout_s if threading.current_thread() is threading.main_thread() else None


@lru_cache(maxsize=16384)
def _parse_gold(gold: str, timeout: int | None) -> list:
    # Memoization of a pure function (the same gold is checked against G rollouts); the cached
    # lists are only read by `verify`, never mutated.
    from math_verify import parse

    return parse("\\boxed{" + gold + "}", extraction_config=_configs()[0], parsing_timeout=timeout)


def normalise(completion: str) -> str:
    """The prediction as math-verify should read it: escaped dollars (currency) removed."""
    return _ESCAPED_DOLLAR.sub(r"\1", completion) if "$" in completion else completion


def math_score(gold: str, completion: str, timeout_s: int = 5) -> float:
    """1.0 if the final answer in ``completion`` equals ``gold`` (a LaTeX or plain answer)."""
    from math_verify import parse, verify

    timeout = _timeout(timeout_s)
    gold_parsed = _parse_gold(str(gold), timeout)
    if not gold_parsed or not completion:
        return 0.0
    pred = parse(normalise(completion), extraction_config=_configs()[1], parsing_timeout=timeout)
    if not pred:
        return 0.0
    return 1.0 if verify(gold_parsed, pred, timeout_seconds=timeout) else 0.0


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (braces balanced), ``\\fbox{...}`` or ``\\boxed x``."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = start + (len("\\boxed") if text.startswith("\\boxed", start) else len("\\fbox"))
    if text.startswith(" ", i):  # "\boxed 2" (no braces): one token
        token = text[i:].split()[0].split("$")[0] if text[i:].strip() else ""
        return token or None
    if not text.startswith("{", i):
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1:j]
    return None


BOXED_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
