"""The registry of checkpoint formats: which ``config.json`` becomes which `ModelConfig`, and how
its tensor names map onto ours.

A format is registered by its module (``orl`` in `native`, ``qwen3`` / ``sdar`` in `qwen3`,
``diffusion_gemma`` in `dgemma`); `orl.model.checkpoint.files` looks formats up here and never
imports a format module itself, so no format module and the file code import each other.
Does not own: reading or writing files (`files`), the key maps themselves (the format modules).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the message lists every problem and the fix."""


@dataclass(frozen=True)
class Format:
    """One checkpoint format. ``config_from(d)`` -> `ModelConfig` from the config.json dict;
    ``to_ours(cfg, state)`` -> the state dict under our parameter names (identity by default)."""

    name: str
    config_from: Callable
    to_ours: Callable | None = None


FORMATS: dict[str, Format] = {}  # model_type -> Format ("orl": a config with our own block)


def register(fmt: Format, *model_types: str) -> Format:
    for mt in model_types or (fmt.name,):
        FORMATS[mt] = fmt
    return fmt


def format_of(d: dict) -> Format:
    """The format of a config.json dict: our own block when present, else its ``model_type``."""
    if "orl" in d:
        return FORMATS["orl"]
    mt = d.get("model_type")
    if mt not in FORMATS:
        raise CheckpointError(f"unsupported model_type {mt!r} in config.json; supported: "
                              f"{', '.join(sorted(k for k in FORMATS if k != 'orl'))}, or a config saved by orl "
                              "(with an 'orl' block)")
    return FORMATS[mt]


def family_format(family: str) -> Format:
    """The format whose key map a model of ``family`` was loaded with (our names when none)."""
    for fmt in FORMATS.values():
        if getattr(fmt, "name", None) == family and fmt.to_ours is not None:
            return fmt
    return FORMATS["orl"]
