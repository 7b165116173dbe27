"""Turning a code completion into a test program and running it: shared by HumanEval and MBPP.

`extract_code` takes the code out of a completion (a fenced block if there is one, else the
text itself, without MBPP's ``[BEGIN]``/``[DONE]`` markers). `passes` runs a program through
`orl.eval.sandbox` and returns 1.0 only for a sandbox "pass". Tasks build the program; this file
does not know their schemas.

Does not own: isolation (all of it is in `orl.eval.sandbox`), process pools (`orl.eval.pool`).
"""
from __future__ import annotations

import re

from orl.eval.sandbox import SandboxConfig, run_program

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


def passes(program: str, config: SandboxConfig) -> float:
    """1.0 if the program ran to its end in the sandbox, else 0.0."""
    return 1.0 if run_program(program, config).passed else 0.0
