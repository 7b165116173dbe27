"""``--set key.path=value`` overrides: the one parser of the `orl` commands.

`set_fields` sets fields of a config dataclass, walking dataclass fields, dict keys and list
indices, and parses each value against the type the field declares: an ``int`` field takes ``3``
and refuses ``abc`` or ``2.5`` ("batch_size expects an int, got 'abc'"), ``none`` is None only
where the field is Optional (a string field keeps the word: ``loss.anchor=none``), a nested
dataclass is set field by field. Dict keys are checked too: ``model.*`` against `ModelConfig`'s
fields, ``task_kwargs.*`` against the options the config's task takes, any other dict against the
keys it already holds. Unknown keys raise with the list of known ones. `orl.recipes.apply_overrides`
(`orl.recipes.validate`) sets them and then checks the whole config's ranges and allowed values, so
a bad value fails before any work starts.
`parse_sets` turns the same strings into a flat dict of keyword arguments (`orl generate` /
`orl serve` decoding fields): typed by a dataclass's fields when one is given, else values parse
as Python literals when they parse (``0.8``, ``[1, 2]``, ``False``), ``true``/``false``/``none`` in
any case as bool/None, anything else stays a string.
Does not own: what the fields mean or their ranges (the configs; `orl.recipes.validate`).
"""
from __future__ import annotations

import ast
import dataclasses
import inspect
import math
import types
import typing

_NONE = ("none", "null")


def parse_value(raw: str):
    """A value of unknown type: a Python literal, true/false/none in any case, else the string."""
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        low = raw.strip().lower()
        if low in ("true", "false"):
            return low == "true"
        if low in _NONE:
            return None
        return raw


def describe(tp) -> str:
    """'an int', 'a float or none', 'a list of strings': the type as an error message names it."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        parts = [describe(a) for a in args if a is not type(None)]
        return " or ".join(parts) + (" or none" if type(None) in args else "")
    origin = typing.get_origin(tp) or tp
    if origin in (list, tuple):
        return "a list" + (f" of {_plural(args[0])}" if args and args[0] is not Ellipsis else "")
    if dataclasses.is_dataclass(origin):
        return f"a {origin.__name__}"
    return {int: "an int", float: "a float", bool: "a bool (true or false)", str: "a string",
            dict: "a dict"}.get(origin, getattr(origin, "__name__", str(origin)))


def _plural(tp) -> str:
    return {int: "ints", float: "floats", bool: "bools", str: "strings"}.get(tp, describe(tp))


def parse_typed(raw: str, tp, name: str):
    """``raw`` parsed as a value of annotation ``tp``; ValueError naming ``name`` when it is not one."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        if type(None) in args and raw.strip().lower() in _NONE:
            return None
        for option in (a for a in args if a is not type(None)):
            try:
                return parse_typed(raw, option, name)
            except ValueError:
                continue
        raise ValueError(f"{name} expects {describe(tp)}, got {raw!r}")
    origin = typing.get_origin(tp) or tp
    if dataclasses.is_dataclass(origin):
        first = dataclasses.fields(origin)[0].name
        raise ValueError(f"{name} is {describe(origin)}; set its fields one by one, e.g. {name}.{first}=...")
    if origin is str:
        value = parse_value(raw)
        return value if isinstance(value, str) and raw.strip()[:1] in ("'", '"') else raw.strip()
    value = parse_value(raw)
    if check_type(value, tp):
        return float(value) if origin is float else value
    if origin is bool and raw.strip() in ("0", "1"):
        return raw.strip() == "1"
    raise ValueError(f"{name} expects {describe(tp)}, got {raw!r}")


def check_type(value, tp) -> bool:
    """Whether ``value`` is a value of annotation ``tp`` (an int is a float; a bool is not an int;
    floats must be finite). Annotations this does not know (Any, callables) accept anything."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return any(check_type(value, a) for a in args)
    if tp is type(None):
        return value is None
    origin = typing.get_origin(tp) or tp
    if origin is bool:
        return isinstance(value, bool)
    if origin is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if origin is str:
        return isinstance(value, str)
    if origin in (list, tuple):
        item = args[0] if args and args[0] is not Ellipsis else typing.Any
        return isinstance(value, (list, tuple)) and all(check_type(v, item) for v in value)
    if origin is dict:
        return isinstance(value, dict)
    if dataclasses.is_dataclass(origin):
        return isinstance(value, origin)
    return True


def field_types(cls) -> dict:
    """Field name -> resolved annotation of a dataclass type (string annotations resolved)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints.get(f.name, typing.Any) for f in dataclasses.fields(cls)}


def split_set(item: str) -> tuple[str, str]:
    """``"a.b=1"`` -> ("a.b", "1"); a clear error for anything without a key and an ``=``."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
    return key.strip(), raw


def parse_sets(items: list[str], schema: type | None = None) -> dict:
    """``["threshold=0.8", "use_cache=False"]`` -> {"threshold": 0.8, "use_cache": False}. With a
    dataclass ``schema`` its fields parse by their types (others as `parse_value`: the caller may
    take more keywords than the dataclass has fields)."""
    types_ = field_types(schema) if schema is not None else {}
    return {k: parse_typed(raw, types_[k], k) if k in types_ else parse_value(raw)
            for k, raw in map(split_set, items or [])}


def set_fields(cfg, sets: list[str]):
    """Apply ``key.path=value`` strings to ``cfg`` in place; returns cfg. Unknown keys and values
    of the wrong type raise ValueError naming the field. Ranges are `orl.recipes.validate`'s
    (`orl.recipes.validate.apply_overrides` does both)."""
    for item in sets or []:
        path, raw = split_set(item)
        keys = path.split(".")
        obj, parent, parent_key = cfg, None, None
        for i, k in enumerate(keys[:-1]):
            obj, parent, parent_key = _child(obj, k, ".".join(keys[:i + 1]), parent, parent_key), obj, k
        last = keys[-1]
        if dataclasses.is_dataclass(obj):
            types_ = field_types(type(obj))
            if last not in types_:
                raise ValueError(f"--set {path}: {type(obj).__name__} has no field {last!r}; fields: {sorted(types_)}")
            setattr(obj, last, parse_typed(raw, types_[last], path))
        elif isinstance(obj, dict):
            schema = _dict_schema(parent, parent_key, obj, path)
            obj[last] = parse_typed(raw, schema[last], path) if schema is not None else parse_value(raw)
        elif isinstance(obj, list):
            i = _index(obj, last, path)
            current = obj[i]
            if dataclasses.is_dataclass(current):
                raise ValueError(f"--set {path}: item {i} is a {type(current).__name__}; set its fields one by "
                                 f"one, e.g. {path}.{dataclasses.fields(current)[0].name}=...")
            obj[i] = parse_typed(raw, type(current), path) if current is not None else parse_value(raw)
        else:
            raise ValueError(f"--set {path}: cannot set {last!r} on {type(obj).__name__}")
    return cfg


def _index(obj: list, k: str, path: str) -> int:
    try:
        i = int(k)
    except ValueError:
        raise ValueError(f"--set {path}: {k!r} is not a list index (the list has {len(obj)} items)") from None
    if not 0 <= i < len(obj):
        raise ValueError(f"--set {path}: index {i} is out of range (the list has {len(obj)} items: 0..{len(obj) - 1})")
    return i


def _child(obj, k: str, path: str, parent, parent_key):
    if dataclasses.is_dataclass(obj):
        if k not in {f.name for f in dataclasses.fields(obj)}:
            raise ValueError(f"--set {path}: {type(obj).__name__} has no field {k!r}; fields: "
                             f"{sorted(f.name for f in dataclasses.fields(obj))}")
        child = getattr(obj, k)
        if child is None:
            raise ValueError(f"--set {path}: {path} is none in this config; it has no fields to set")
        return child
    if isinstance(obj, dict):
        schema = _dict_schema(parent, parent_key, obj, path)
        tp = typing.Any if schema is None else schema[k]
        if tp is not typing.Any and (typing.get_origin(tp) or tp) is not dict:
            raise ValueError(f"--set {path}: {k!r} is {describe(tp)}, not a dict of options")
        return obj.setdefault(k, {})
    if isinstance(obj, list):
        return obj[_index(obj, k, path)]
    raise ValueError(f"--set {path}: cannot descend into {type(obj).__name__} at {k!r}")


def _dict_schema(owner, field: str | None, current: dict, path: str) -> dict | None:
    """The keys the dict ``owner.field`` may hold, each with its annotation: `ModelConfig`'s fields
    for ``model``, the task's options for ``task_kwargs``, else the keys it holds (typed by their
    values). None: any key (a user's ``module:function`` task). Raises for a key not among them."""
    key = path.rsplit(".", 1)[-1]
    schema, what = None, None
    if field == "model" and dataclasses.is_dataclass(owner):
        from ..model.config import ModelConfig  # noqa: PLC0415
        schema, what = field_types(ModelConfig), "ModelConfig"
    elif field == "task_kwargs" and dataclasses.is_dataclass(owner) and isinstance(getattr(owner, "task", None), str):
        schema = task_options(owner.task)
        if schema is None:
            return None
        what = f"task {owner.task!r}"
    if schema is None:
        schema = {k: typing.Any if v is None else type(v) for k, v in current.items()}
        what = f"{path.rsplit('.', 1)[0]} (the keys it holds)"
    if key not in schema:
        raise ValueError(f"--set {path}: {what} takes no option {key!r}; it takes: {sorted(schema) or 'none'}")
    return schema


def task_options(task: str) -> dict | None:
    """Option name -> annotation of a built-in task's constructor (its fixed options left out), or of
    a data-file task's (``data.jsonl``: `orl.tasks.jsonl.JsonlTask`, its path left out); None for a
    user's ``module:function`` task (not imported here) or an unknown name."""
    from ..tasks.registry import BUILTIN  # noqa: PLC0415
    if task.endswith((".jsonl", ".json", ".jsonl.gz")):
        module, cls_name, fixed = "orl.tasks.jsonl", "JsonlTask", {"path": task}
    elif task not in BUILTIN:
        return None
    else:
        module, cls_name, fixed = BUILTIN[task]
    import importlib  # noqa: PLC0415
    cls = getattr(importlib.import_module(module), cls_name)
    try:
        hints = typing.get_type_hints(cls if dataclasses.is_dataclass(cls) else cls.__init__)
    except (NameError, TypeError):
        hints = {}
    params = [p for p in inspect.signature(cls).parameters.values()
              if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in fixed]
    return {p.name: hints.get(p.name, typing.Any) for p in params}
