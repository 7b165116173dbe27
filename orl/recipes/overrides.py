"""``--set key.path=value`` overrides: the one parser of the `orl` commands.

`apply_overrides` sets fields of a config dataclass (walking dataclass fields, dict keys and list
indices; unknown fields raise with the list of known ones); `parse_sets` turns the same strings into
a flat dict of keyword arguments (`orl generate` / `orl serve` decoding fields). Values parse as
Python literals when they parse (``0.8``, ``[1, 2]``, ``False``), ``true``/``false``/``none`` in any
case as bool/None, anything else stays a string.
"""
from __future__ import annotations

import ast
import dataclasses


def parse_value(raw: str):
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        low = raw.strip().lower()
        if low in ("true", "false"):
            return low == "true"
        if low in ("none", "null"):
            return None
        return raw


def split_set(item: str) -> tuple[str, str]:
    """``"a.b=1"`` -> ("a.b", "1"); a clear error for anything without a key and an ``=``."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
    return key.strip(), raw


def parse_sets(items: list[str]) -> dict:
    """``["threshold=0.8", "use_cache=False"]`` -> {"threshold": 0.8, "use_cache": False}."""
    return {k: parse_value(raw) for k, raw in map(split_set, items or [])}


def apply_overrides(cfg, sets: list[str]):
    """Apply ``key.path=value`` strings to ``cfg`` in place; returns cfg. Unknown keys raise."""
    for item in sets or []:
        path, raw = split_set(item)
        keys = path.split(".")
        obj = cfg
        for k in keys[:-1]:
            obj = _child(obj, k, path)
        last = keys[-1]
        value = parse_value(raw)
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
