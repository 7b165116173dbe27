"""The registry of checkpoint formats: which ``config.json`` becomes which `ModelConfig`, how its
tensor names map onto ours, and which format a model of each family is saved in.

A format is registered by its module: Qwen3 / SDAR (``qwen3``, ``sdar``) in `qwen3`, LLaDA-2.x
(``llada2_moe``) in `llada2`, DiffusionGemma (``diffusion_gemma``) in `dgemma`, and orl's former
own format (``orl``, read only) in `native`. `orl.model.checkpoint.files` looks formats up here and
never imports a format module itself, so no format module and the file code import each other.
docs/formats.md describes each format, its key map, and where orl's own fields live.
Does not own: reading or writing files (`files`), the key maps themselves (the format modules).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from ..config import ModelConfig


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the message lists every problem and the fix."""


@dataclass(frozen=True)
class Format:
    """One checkpoint format.

    ``config_from(d)`` -> `ModelConfig` from the config.json dict (raises `CheckpointError` for
    what our model cannot express, or for missing diffusion fields); ``to_ours(cfg, state)`` -> the
    state dict under our parameter names; ``config_to(cfg, source, ids)`` -> the config.json dict
    (``source`` the config.json it was loaded from or None, ``ids`` the tokenizer's bos/eos/pad ids);
    ``from_ours(cfg, state)`` -> the tensors under the format's names; ``generation(cfg, source,
    ids)`` -> generation_config.json (None: none is written). ``diffusion`` maps our diffusion fields
    to the config.json keys that hold them (`load_pretrained`'s overrides are written there).
    ``pathway_native``: the format has names for the residual pathway (DiffusionGemma's
    self-conditioning); otherwise our pathway tensors go to ``orl_extra.safetensors``.
    A format without ``config_to`` is read only. Key maps default to the identity.
    """

    name: str
    config_from: Callable
    to_ours: Callable | None = None
    config_to: Callable | None = None
    from_ours: Callable | None = None
    generation: Callable | None = None
    family: str | None = None
    diffusion: tuple[tuple[str, str], ...] = ()
    pathway_native: bool = False


FORMATS: dict[str, Format] = {}   # config.json model_type -> Format
EXPORTS: dict[str, Format] = {}   # family -> the format its models are saved in

# orl's own fields, which no family format has a key for: they live in config.json's ``orl`` block
# (only those that differ from what the rest of config.json implies; docs/formats.md). Any other difference between
# a model's config and its exported config.json is an error (the format cannot hold the model).
ORL_FIELDS = frozenset({"pathway", "pathway_alpha", "pathway_gamma", "pathway_intermediate",
                        "pathway_post_norm", "pathway_where", "clean_attention", "extra"})


def register(fmt: Format, *model_types: str) -> Format:
    for mt in model_types or (fmt.name,):
        FORMATS[mt] = fmt
    if fmt.family is not None and fmt.config_to is not None:
        EXPORTS[fmt.family] = fmt
    return fmt


def format_of(d: dict) -> Format:
    """The format of a config.json dict, by its ``model_type``."""
    mt = d.get("model_type")
    if mt not in FORMATS:
        raise CheckpointError(f"unsupported model_type {mt!r} in config.json; supported: "
                              f"{', '.join(sorted(FORMATS))}")
    return FORMATS[mt]


def family_format(family: str) -> Format:
    """The format a model of ``family`` is saved in."""
    return EXPORTS[family]


def export_format(cfg: ModelConfig) -> Format:
    """The format ``cfg`` is saved in: the one it was loaded from (re-saving keeps the source
    format), else its family's."""
    src = (cfg.source or {}).get("config.json")
    if src is not None:
        fmt = FORMATS.get(src.get("model_type"))
        if fmt is not None and fmt.config_to is not None and fmt.family == cfg.family:
            return fmt
    return family_format(cfg.family)


def diffusion_fields(d: dict, keys: tuple[tuple[str, str], ...], what: str) -> dict:
    """Our diffusion fields read from config.json keys ``keys`` ((field, key), ...); a missing one
    is an error naming every missing key and how to supply it (never a silent default)."""
    missing = [key for _, key in keys if d.get(key) is None]
    if missing:
        mask = "mask_token_id" in missing
        raise CheckpointError(
            f"config.json has no {' and no '.join(repr(k) for k in missing)}: this {what} checkpoint does not say "
            "how to run it as block diffusion (a causal model has neither). Supply them as top-level keys of "
            f"config.json ({', '.join(missing)}) or as load_pretrained(path, "
            f"{', '.join(f'{f}=...' for f, k in keys if k in missing)}); SDAR uses the mask token <|MASK|> = 151669 "
            "and block 4, LLaDA-2.x <|mask|> = 156895 and block 32"
            + (". A mask token declared by the directory's own tokenizer (tokenizer_config.json) is used when "
               "config.json has none" if mask else ""))
    return {field: d[key] for field, key in keys}


def orl_fields(cfg: ModelConfig, implied: ModelConfig) -> dict:
    """The fields of ``cfg`` that differ from ``implied`` (the config its exported config.json
    reads back as); they must all be orl's own (`ORL_FIELDS`)."""
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(ModelConfig)
            if f.compare and getattr(cfg, f.name) != getattr(implied, f.name)}
