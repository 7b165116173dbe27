"""Task names -> task objects, and user tasks given as ``module:function``.

Owns: the table of built-in task names and `load_custom_task`, which imports a user's module,
calls the named function and validates what it returns with `orl.tasks.base.check_task`, and
`task_parameter`: whether a task takes an option (more SFT's fresh stream needs a ``seed``).
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
    "gpqa-diamond": ("orl.tasks.gpqa", "GPQA", {"variant": "diamond"}),
    "livecodebench": ("orl.tasks.livecodebench", "LiveCodeBench", {}),
    "ifeval": ("orl.tasks.ifeval", "IFEval", {}),
    "carry_add": ("orl.tasks.suite", "CarryTask", {"op": "+"}),
    "carry_mul": ("orl.tasks.suite", "CarryTask", {"op": "*"}),
    "chain": ("orl.tasks.suite", "ChainTask", {}),
    "string": ("orl.tasks.suite", "StringTask", {}),
    "wordchain": ("orl.tasks.suite", "WordChainTask", {}),
}


def task_names() -> list[str]:
    return sorted(BUILTIN)


def get_task(name: str, **kwargs: Any) -> Task:
    """The task ``name`` names, with options ``kwargs``:

    - a built-in task (`task_names`), e.g. ``"arith"``;
    - a data file, ``"data.jsonl"`` (or ``.json``, ``.jsonl.gz``): prompt/answer records checked by a
      named verifier, ``verifier="exact" | "math" | "code"`` (`orl.tasks.jsonl.JsonlTask`);
    - a user's task, ``"module:function"`` or ``"path/to/file.py:function"`` (`load_custom_task`).
    """
    if name.endswith((".jsonl", ".json", ".jsonl.gz")):
        from orl.tasks.jsonl import JsonlTask  # noqa: PLC0415
        return check_task(JsonlTask(name, **kwargs))
    if ":" in name:
        return load_custom_task(name, **kwargs)
    if name not in BUILTIN:
        raise ValueError(
            f"unknown task {name!r}; built-in tasks are {', '.join(task_names())}, "
            "or give your own as 'module:function' or 'path/to/file.py:function' (a function returning a "
            "task object), or a data file 'data.jsonl' of prompt/answer records with a verifier"
        )
    module, cls, fixed = BUILTIN[name]
    return check_task(getattr(importlib.import_module(module), cls)(**fixed, **kwargs))


def task_parameter(name: str, option: str):
    """The `inspect.Parameter` of option ``option`` (e.g. ``"seed"``) that task ``name`` takes by name, in
    its constructor (a built-in task, a data file) or its function (a user's task: its module is imported);
    None when it takes no such option (a ``**kwargs`` catch-all is not counted: the option may mean
    nothing to it) or the name is unknown. The built-ins' fixed options are not theirs to take."""
    import inspect  # noqa: PLC0415
    if name.endswith((".jsonl", ".json", ".jsonl.gz")):
        from orl.tasks.jsonl import JsonlTask  # noqa: PLC0415
        fn, fixed = JsonlTask, {"path": name}
    elif ":" in name:
        fn, fixed = _custom_factory(name), {}
    elif name in BUILTIN:
        module, cls, fixed = BUILTIN[name]
        fn = getattr(importlib.import_module(module), cls)
    else:
        return None
    try:
        p = inspect.signature(fn).parameters.get(option)
    except (TypeError, ValueError):   # no signature to read (a builtin callable)
        return None
    if p is None or option in fixed or p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
        return None
    return p


def load_custom_task(spec: str, **kwargs: Any) -> Task:
    """Import the module of ``"module:function"``, call ``function(**kwargs)``, validate the task.

    ``module`` is a dotted name found on the import path (the `orl` command puts the working
    directory there, as ``python -m`` does) or the path of a ``.py`` file, whose folder then goes first
    on the import path (so the file's own sibling imports work, as when it runs as a script). Import
    failures say which name was missing and how to make it importable; options the function does
    not take are a TypeError that says where task options come from (the user, never a recipe
    written for another task)."""
    import inspect  # noqa: PLC0415
    factory = _custom_factory(spec)
    try:
        inspect.signature(factory).bind(**kwargs)
    except TypeError as e:
        raise TypeError(f"{spec} does not take the task options {kwargs} ({e}); task options come only from you: "
                        "--task-kw KEY=VALUE or --set task_kwargs.KEY=VALUE") from None
    except ValueError:  # no signature to check (a builtin): the call says it
        pass
    task = factory(**kwargs)
    try:
        return check_task(task)
    except TypeError as e:
        raise TypeError(f"{spec}() returned an invalid task: {e}") from None


def _custom_factory(spec: str):
    """The function ``"module:function"`` names, imported (`load_custom_task` says how)."""
    import os  # noqa: PLC0415
    import sys  # noqa: PLC0415

    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"custom task {spec!r} must look like 'package.module:function' or 'path/to/file.py:function'")
    where = module_name
    if module_name.endswith(".py") or "/" in module_name or os.sep in module_name:
        path = os.path.abspath(os.path.expanduser(module_name))
        if not os.path.isfile(path):
            raise FileNotFoundError(f"custom task {spec!r}: no file {path}")
        folder, module_name = os.path.split(path[:-3] if path.endswith(".py") else path)
        if not module_name.isidentifier():
            raise ValueError(f"custom task {spec!r}: {os.path.basename(path)!r} is not an importable module name "
                             "(letters, digits and _, not starting with a digit); rename the file")
        loaded = sys.modules.get(module_name)
        if loaded is not None and os.path.abspath(getattr(loaded, "__file__", "") or "") != path:
            raise ImportError(f"custom task {spec!r}: a module named {module_name!r} is already imported from "
                              f"{getattr(loaded, '__file__', None) or 'a built-in'}; rename {path}")
        if folder not in sys.path:
            sys.path.insert(0, folder)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        top = module_name.split(".")
        if e.name in [".".join(top[:i + 1]) for i in range(len(top))]:  # the module itself is not found
            raise ImportError(
                f"cannot import module {module_name!r} for custom task {spec!r}: {e}. Run orl from the folder "
                f"that holds {top[0]}.py (the working directory is importable), give the file's path "
                f"(--task path/to/{top[-1]}.py:{attr}), or put its folder on PYTHONPATH"
            ) from e
        raise ImportError(f"cannot import module {module_name!r} for custom task {spec!r}: it imports {e.name!r}, "
                          f"which is not installed ({e}); install it into this environment") from e
    except ImportError as e:
        raise ImportError(f"cannot import module {module_name!r} for custom task {spec!r}: {e}") from e
    except SyntaxError as e:
        raise ImportError(f"cannot import module {module_name!r} for custom task {spec!r}: {e.filename}:"
                          f"{e.lineno}: SyntaxError: {e.msg}") from e
    try:
        factory = getattr(module, attr)
    except AttributeError:
        names = ", ".join(n for n in dir(module) if not n.startswith("_"))
        raise AttributeError(f"module {where!r} has no attribute {attr!r} (it has: {names})") from None
    if not callable(factory):
        raise TypeError(f"{spec} is {type(factory).__name__}, expected a function returning a task")
    return factory
