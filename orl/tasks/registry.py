"""Task names -> task objects, and user tasks given as ``module:function``.

Owns: the table of built-in task names and `load_custom_task`, which imports a user's module,
calls the named function and validates what it returns with `orl.tasks.base.check_task`.
Task modules are imported only when their task is requested, so importing the registry is cheap.

Does not own: the tasks themselves (one file each next to this one), task-specific options
(passed through as keyword arguments, e.g. ``path=`` and ``sha256=`` for local data files).
"""
from __future__ import annotations

import importlib
from typing import Any

from orl.tasks.base import Task, check_task

# name -> (module, class, fixed keyword arguments)
BUILTIN: dict[str, tuple[str, str, dict[str, Any]]] = {
    "arith": ("orl.tasks.arith", "ArithTask", {}),
    "gsm8k": ("orl.tasks.gsm8k", "GSM8K", {}),
    "math500": ("orl.tasks.math500", "MATH500", {}),
    "humaneval": ("orl.tasks.humaneval", "HumanEval", {}),
    "mbpp": ("orl.tasks.mbpp", "MBPP", {"variant": "full"}),
    "mbpp-sanitized": ("orl.tasks.mbpp", "MBPP", {"variant": "sanitized"}),
    "mmlu-pro": ("orl.tasks.mmlu_pro", "MMLUPro", {}),
    "aime": ("orl.tasks.aime", "AIME", {}),
    "carry_add": ("orl.tasks.suite", "CarryTask", {"op": "+"}),
    "carry_mul": ("orl.tasks.suite", "CarryTask", {"op": "*"}),
    "chain": ("orl.tasks.suite", "ChainTask", {}),
    "string": ("orl.tasks.suite", "StringTask", {}),
}


def task_names() -> list[str]:
    return sorted(BUILTIN)


def get_task(name: str, **kwargs: Any) -> Task:
    """A built-in task by name, or a user task when ``name`` looks like ``module:function``."""
    if ":" in name:
        return load_custom_task(name, **kwargs)
    if name not in BUILTIN:
        raise ValueError(
            f"unknown task {name!r}; built-in tasks are {', '.join(task_names())}, "
            "or give your own as 'module:function' (a function returning a task object)"
        )
    module, cls, fixed = BUILTIN[name]
    return check_task(getattr(importlib.import_module(module), cls)(**fixed, **kwargs))


def load_custom_task(spec: str, **kwargs: Any) -> Task:
    """Import ``module`` from ``"module:function"``, call ``function(**kwargs)``, validate the task."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"custom task {spec!r} must look like 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ImportError(
            f"cannot import module {module_name!r} for custom task {spec!r}: {e}. Is it on "
            "PYTHONPATH (or installed), and are its own imports available?"
        ) from e
    try:
        factory = getattr(module, attr)
    except AttributeError:
        names = ", ".join(n for n in dir(module) if not n.startswith("_"))
        raise AttributeError(f"module {module_name!r} has no attribute {attr!r} (it has: {names})") from None
    if not callable(factory):
        raise TypeError(f"{spec} is {type(factory).__name__}, expected a function returning a task")
    task = factory(**kwargs)
    try:
        return check_task(task)
    except TypeError as e:
        raise TypeError(f"{spec}() returned an invalid task: {e}") from None
