"""The task contract: problems, prompt rendering and ONE verifier per task.

A task owns its data loading, its prompt format and its single verifier. Training rewards
(ORL) and evaluation scores call the same `Task.verify`, so they cannot drift apart
(docs/STYLE.md convention 6). This module owns only the contract and its validation; the
concrete tasks live one per file next to it.

What it does not own: tokenization, decoding, isolation of untrusted code (see
`orl.eval.sandbox`), running verifiers in processes and checking what they return (see
`orl.eval.pool`, the one reward path of training and evaluation).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Protocol, runtime_checkable


@dataclass(frozen=True)
class Problem:
    """One problem: a stable id, the rendered user-facing prompt text and the reference answer."""

    id: str
    prompt: str
    answer: Any
    meta: dict = field(default_factory=dict)


@runtime_checkable
class Task(Protocol):
    """What every task (built-in or user-supplied via ``--task module:function``) provides.

    - ``name``: short identifier used in file names and tables.
    - ``problems(split)``: a deterministic list of problems for ``split`` (e.g. "train", "test").
    - ``verify(problem, completion)``: 1.0 if the completion solves the problem else 0.0 (a
      float in [0, 1]; a bool or the int 0 or 1 also do). Any other value (NaN, 2.0, None, ...),
      an exception or a hang is a verifier error that `orl.eval.pool.rewards` reports with the
      task and problem named. Must be a pure function of its arguments (no global state); it runs
      in `orl.eval.pool` worker processes for training rewards and evaluation alike; code tasks
      run untrusted code only through ``orl.eval.sandbox``.
    """

    name: str

    def problems(self, split: str) -> list[Problem]: ...

    def verify(self, problem: Problem, completion: str) -> float: ...


def check_task(task: Any) -> Task:
    """Validate a task object before any rollout; raise ``TypeError`` naming what is missing."""
    missing = [a for a in ("name", "problems", "verify") if not hasattr(task, a)]
    if missing:
        raise TypeError(
            f"task object {task!r} lacks {', '.join(missing)}; a task needs a `name` string, "
            "`problems(split) -> list[Problem]` and `verify(problem, completion) -> float` "
            "(see orl/tasks/base.py and examples/custom_task.py)"
        )
    if not isinstance(task.name, str) or not task.name:
        raise TypeError(f"task.name must be a non-empty string, got {task.name!r}")
    for attr in ("problems", "verify"):
        if not callable(getattr(task, attr)):
            raise TypeError(f"task.{attr} must be callable, got {getattr(task, attr)!r}")
    return task


def check_problems(problems: Iterable[Any], where: str) -> list[Problem]:
    """Validate a problem list returned by a task; raise ``TypeError``/``ValueError`` with the index."""
    out = list(problems)
    if not out:
        raise ValueError(f"{where} returned no problems")
    seen = set()
    for i, p in enumerate(out):
        if not isinstance(p, Problem):
            raise TypeError(f"{where}[{i}] is {type(p).__name__}, expected orl.tasks.Problem")
        if not isinstance(p.prompt, str) or not p.prompt:
            raise ValueError(f"{where}[{i}] (id={p.id!r}) has an empty or non-string prompt")
        if p.id in seen:
            raise ValueError(f"{where}[{i}] repeats problem id {p.id!r}; ids must be unique")
        seen.add(p.id)
    return out
