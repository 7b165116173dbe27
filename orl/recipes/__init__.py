"""Recipes: full runs as Python functions returning config dataclasses (docs/STYLE.md convention 1),
one module per task (`arith`: SFT of the demo's base; `orl_arith`: ORL on it; `suite`: both for each
family of the embedded task suite), and their lookup: `get_recipe` with the config type a command runs
refuses a recipe of another type (an ORL recipe given to ``orl sft``) with the command that runs it.

Variants call a base recipe and change fields; the command line changes more with ``--set``
(`orl.recipes.overrides`, re-exported here), and `orl.recipes.validate` checks every field's type, range
and allowed values before a run starts.
"""
from __future__ import annotations

import importlib
import pkgutil

from .overrides import parse_sets, parse_value  # noqa: F401 (the one --set parser)
from .validate import apply_overrides, validate  # noqa: F401 (--set, then every config's ranges checked)


def list_recipes() -> dict[str, object]:
    found = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name in ("overrides", "validate"):  # the --set parser and the range table, not recipes
            continue
        mod = importlib.import_module(f"{__name__}.{info.name}")
        for name in dir(mod):
            fn = getattr(mod, name)
            # a recipe is a public function that returns a config (a helper such as suite.task_of is not)
            if callable(fn) and getattr(fn, "__module__", None) == mod.__name__ and not name.startswith("_") \
                    and not isinstance(fn, type) and recipe_kind(fn) in KINDS:
                found[name] = fn
    return found


# config type name -> (what a recipe of it is, how to run recipe {name})
KINDS = {"SFTConfig": ("an SFT recipe", "run it with `orl sft --recipe {name}`"),
         "ORLConfig": ("an ORL recipe", "run it with `orl train --recipe {name}`"),
         "RFTConfig": ("an RFT baseline recipe", "run it with `orl train --method rft --recipe {name}`")}


def recipe_kind(fn) -> str | None:
    """The name of the config type a recipe function returns, from its return annotation."""
    import typing  # noqa: PLC0415
    try:
        ret = typing.get_type_hints(fn).get("return")
    except (NameError, TypeError):
        return None
    return getattr(ret, "__name__", None)


def get_recipe(name: str, kind: type | tuple[type, ...] | None = None, **kwargs):
    """The config recipe ``name`` returns (called with ``kwargs``). ``kind``: the config type (or
    types) the caller runs; a recipe of another type (an ORL recipe given to ``orl sft``) is a
    ValueError naming the command that runs it and the recipes of ``kind``, raised before the recipe
    is called."""
    table = list_recipes()
    if name not in table:
        import difflib  # noqa: PLC0415
        close = difflib.get_close_matches(name, table, n=1)
        raise ValueError(f"unknown recipe {name!r}{f' (did you mean {close[0]!r}?)' if close else ''}; "
                         f"available: {', '.join(sorted(table))}")
    kinds = kind if isinstance(kind, tuple) else (kind,) if kind is not None else ()
    wanted = [k.__name__ for k in kinds]
    if kinds:
        got = recipe_kind(table[name])
        if got is not None and got not in wanted:
            what, how = KINDS.get(got, (f"a {got} recipe", "it runs elsewhere"))
            want = [KINDS.get(k, (f"a {k} recipe",))[0] for k in wanted]
            mine = sorted(n for n, fn in table.items() if recipe_kind(fn) in wanted)
            plural = " and ".join(f"{w.split(' ', 1)[1]}s" for w in want)
            raise ValueError(f"recipe {name!r} is {what} ({got}), not {' or '.join(want)}: {how.format(name=name)}; "
                             f"{plural} are {', '.join(mine)}")
    cfg = table[name](**kwargs)
    if kinds and not isinstance(cfg, kinds):
        raise ValueError(f"recipe {name!r} returned a {type(cfg).__name__}, expected a {' or a '.join(wanted)}")
    return cfg
