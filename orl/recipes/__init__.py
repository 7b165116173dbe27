"""Recipes: full runs as Python functions returning config dataclasses (docs/STYLE.md convention 1),
one module per task (`arith`: SFT of the demo's base; `orl_arith`: ORL on it; `suite`: both for each
family of the embedded task suite), and their lookup.

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
            if callable(fn) and getattr(fn, "__module__", None) == mod.__name__ and not name.startswith("_") \
                    and not isinstance(fn, type):
                found[name] = fn
    return found


def get_recipe(name: str, **kwargs):
    table = list_recipes()
    if name not in table:
        raise ValueError(f"unknown recipe {name!r}; available: {', '.join(sorted(table))}")
    return table[name](**kwargs)
