"""Recipe lookup and ``--set a.b=value`` overrides on config dataclasses.

A recipe is a Python function in the top-level ``recipes`` package returning a config dataclass
(STYLE.md convention 1). ``--set`` walks dataclass fields, dict keys and list indices; values are
parsed as JSON/Python literals when they parse, else kept as strings.
"""
from __future__ import annotations

import ast
import dataclasses
import importlib
import pkgutil


def list_recipes() -> dict[str, object]:
    import recipes  # noqa: PLC0415
    found = {}
    for info in pkgutil.iter_modules(recipes.__path__):
        mod = importlib.import_module(f"recipes.{info.name}")
        for name in dir(mod):
            fn = getattr(mod, name)
            if callable(fn) and getattr(fn, "__module__", None) == mod.__name__ and not name.startswith("_") \
                    and not isinstance(fn, type):
                found[name] = fn
    return found


def get_recipe(name: str, **kwargs):
    table = list_recipes()
    if name not in table:
        raise ValueError(f"unknown recipe {name!r}; available: {', '.join(sorted(table))}")
    return table[name](**kwargs)


def _parse(value: str):
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError):
        low = value.lower()
        if low in ("true", "false"):
            return low == "true"
        if low in ("none", "null"):
            return None
        return value


def apply_overrides(cfg, sets: list[str]):
    """Apply ``key.path=value`` strings to ``cfg`` in place; returns cfg. Unknown keys raise."""
    for item in sets or []:
        if "=" not in item:
            raise ValueError(f"--set expects key=value, got {item!r}")
        path, raw = item.split("=", 1)
        keys = path.strip().split(".")
        obj = cfg
        for k in keys[:-1]:
            obj = _child(obj, k, path)
        last = keys[-1]
        value = _parse(raw)
        current = getattr(obj, last, None) if dataclasses.is_dataclass(obj) else None
        if value is None and isinstance(current, str):
            value = raw.strip()  # a string field: "none" is a value (e.g. loss.anchor=none), not None
        if dataclasses.is_dataclass(obj):
            if last not in {f.name for f in dataclasses.fields(obj)}:
                raise ValueError(f"--set {path}: {type(obj).__name__} has no field {last!r}; fields: "
                                 f"{sorted(f.name for f in dataclasses.fields(obj))}")
            setattr(obj, last, value)
        elif isinstance(obj, dict):
            obj[last] = value
        elif isinstance(obj, list):
            obj[int(last)] = value
        else:
            raise ValueError(f"--set {path}: cannot set {last!r} on {type(obj).__name__}")
    return cfg


def _child(obj, k: str, path: str):
    if dataclasses.is_dataclass(obj):
        if not hasattr(obj, k):
            raise ValueError(f"--set {path}: {type(obj).__name__} has no field {k!r}")
        return getattr(obj, k)
    if isinstance(obj, dict):
        return obj.setdefault(k, {})
    if isinstance(obj, list):
        return obj[int(k)]
    raise ValueError(f"--set {path}: cannot descend into {type(obj).__name__} at {k!r}")
