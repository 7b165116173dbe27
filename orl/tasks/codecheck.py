"""Taking the code out of a completion: shared by HumanEval and MBPP.

`extract_code` takes the code out of a completion (a fenced block if there is one, else the
text itself, without MBPP's ``[BEGIN]``/``[DONE]`` markers); `defines` says whether code defines
a function. The tasks hand the code to `orl.eval.sandbox.run_tests`; this file does not know their
schemas.

Does not own: running code or judging it (`orl.eval.sandbox`), process pools (`orl.eval.pool`).
"""
from __future__ import annotations

import re


_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)(?:```|\Z)", re.S)


def extract_code(completion: str, entry_point: str | None = None) -> str:
    """The code in ``completion``: the first fenced block defining ``entry_point`` (else the
    first fenced block; an unclosed last fence counts), else the whole text."""
    blocks = [body for lang, body in _FENCE.findall(completion)
              if lang.lower() in ("", "python", "py", "python3")]
    if not blocks:
        return completion.replace("[BEGIN]", "").replace("[DONE]", "")
    if entry_point:
        for body in blocks:
            if defines(body, entry_point):
                return body
    return blocks[0]


def defines(code: str, name: str) -> bool:
    """Whether ``code`` defines a top-level function ``name``."""
    return re.search(rf"^(?:async\s+)?def\s+{re.escape(name)}\s*\(", code, re.M) is not None
