"""Checkpoint files in the Hugging Face layout, in each family's own format (docs/formats.md).

A directory holds config.json (the family's format: Qwen3/SDAR, LLaDA-2.x or DiffusionGemma),
generation_config.json, safetensors (single or sharded + index) under the format's tensor names,
and -- only where the model has something the format cannot hold -- orl's own part: an ``orl`` block
in config.json (orl's fields, `formats.ORL_FIELDS`, that differ from what the rest of config.json
implies; transformers keeps it as an attribute and writes it back) and ``orl_extra.safetensors``
(tensors the format has no names for: the residual pathway of a Qwen3 or LLaDA-2.x model). Other
tools read the family's files and ignore ours.

Owns: reading (`load_config`, `read_tensors`, `read_state_dict`), validation (missing / unexpected /
misshaped keys are all listed in one error and nothing is loaded), atomic writes (a directory is
written beside the target and renamed, exchanged in one rename with an existing one).
Does not own: formats and key maps (`orl.model.checkpoint.formats` and its modules), tokenizers
(saved by the caller's tokenizer next to the weights), optimizer state (`orl.train.checkpoint`).
"""
from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
import tempfile

import torch
from safetensors.torch import load_file, save_file

from ..config import ModelConfig
from ..transformer import Transformer, build_model
from .formats import FORMATS, ORL_FIELDS, CheckpointError, Format, export_format, format_of, orl_fields

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
CONFIG = "config.json"
GENERATION = "generation_config.json"
ORL_BLOCK = "orl"                       # config.json key of orl's own fields (docs/formats.md)
ORL_EXTRA = "orl_extra.safetensors"     # tensors the family format has no names for


def _read_json(p: str) -> dict:
    with open(p) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise CheckpointError(f"{p} is not valid JSON: {e}") from e


def tokenizer_mask_id(path: str) -> int | None:
    """The id of the mask token the directory's tokenizer declares (``mask_token`` in
    tokenizer_config.json, looked up in tokenizer.json), or None. SDAR's own generate.py takes its
    mask id from the tokenizer the same way."""
    tc, tj = os.path.join(path, "tokenizer_config.json"), os.path.join(path, "tokenizer.json")
    if not (os.path.exists(tc) and os.path.exists(tj)):
        return None
    mask = _read_json(tc).get("mask_token")
    mask = mask.get("content") if isinstance(mask, dict) else mask
    if not mask:
        return None
    t = _read_json(tj)
    for a in t.get("added_tokens") or []:
        if a.get("content") == mask:
            return int(a["id"])
    vocab = (t.get("model") or {}).get("vocab")
    return int(vocab[mask]) if isinstance(vocab, dict) and mask in vocab else None


def config_from_hf(d: dict, mask_token_id: int | None = None, block_size: int | None = None) -> ModelConfig:
    """Our config from a config.json dict, by its registered format (`formats.format_of`); the
    diffusion fields given here replace (or supply) the config's."""
    fmt = format_of(d)
    return fmt.config_from(_with_diffusion(fmt, d, mask_token_id=mask_token_id, block_size=block_size))


def _with_diffusion(fmt: Format, d: dict, **given) -> dict:
    keys = dict(fmt.diffusion)
    for f, v in given.items():
        if v is not None and f not in keys:
            raise CheckpointError(f"a {fmt.name} checkpoint has no {f}"
                                  + (" (DiffusionGemma is uniform-noise diffusion: no mask token)"
                                     if f == "mask_token_id" else ""))
    return {**d, **{keys[f]: v for f, v in given.items() if v is not None}}


def _config_and_format(path: str, mask_token_id: int | None = None,
                       block_size: int | None = None) -> tuple[ModelConfig, Format]:
    cfg_path = os.path.join(path, CONFIG)
    if not os.path.exists(cfg_path):
        raise CheckpointError(f"{cfg_path} not found; pass a directory written by `orl sft`/`save_pretrained`, "
                              "a Hugging Face Qwen3/SDAR/LLaDA-2.x/DiffusionGemma checkpoint, or a named size")
    d = _read_json(cfg_path)
    fmt = format_of(d)
    d = _with_diffusion(fmt, d, mask_token_id=mask_token_id, block_size=block_size)
    key = dict(fmt.diffusion).get("mask_token_id")
    if key is not None and d.get(key) is None:
        m = tokenizer_mask_id(path)
        if m is not None:
            d = {**d, key: m}
    cfg = fmt.config_from(d)
    fields = d.get(ORL_BLOCK) if fmt.config_to is not None else None
    if fields:
        bad = sorted(set(fields) - ORL_FIELDS) if isinstance(fields, dict) else [repr(fields)]
        if bad:
            raise CheckpointError(f"the {ORL_BLOCK!r} block of {cfg_path} may hold only orl's own fields "
                                  f"{sorted(ORL_FIELDS)}, not {bad}: the rest belongs in config.json's own keys")
        try:
            cfg = dataclasses.replace(cfg, **fields)
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"the {ORL_BLOCK!r} block of {cfg_path}: {e}") from e
    if fmt.config_to is not None:  # a format we also write: re-saving keeps it, with its other keys
        gen = os.path.join(path, GENERATION)
        cfg = dataclasses.replace(cfg, source={CONFIG: d, GENERATION: _read_json(gen) if os.path.exists(gen) else None})
    return cfg, fmt


def load_config(path: str, mask_token_id: int | None = None, block_size: int | None = None) -> ModelConfig:
    """The `ModelConfig` of a checkpoint directory: config.json in its format, its ``orl`` block on
    top. Diffusion fields a config lacks (a plain Qwen3, a LLaDA-2.x checkpoint) come from the
    arguments, else -- the mask id only -- from the directory's tokenizer; still missing is an error."""
    return _config_and_format(path, mask_token_id, block_size)[0]


def read_tensors(path: str) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint directory under the file's names (single file or sharded with an
    index, plus ``orl_extra.safetensors``)."""
    idx, single = os.path.join(path, INDEX), os.path.join(path, SINGLE)
    if os.path.exists(idx):
        with open(idx) as f:
            weight_map = json.load(f).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{idx} has no 'weight_map'; re-save the checkpoint")
        state = {}
        for shard in sorted(set(weight_map.values())):
            sp = os.path.join(path, shard)
            if not os.path.exists(sp):
                raise CheckpointError(f"shard {sp} listed in {idx} is missing; re-download or re-save it")
            state.update(_load(sp))
        missing = sorted(set(weight_map) - set(state))
        if missing:
            raise CheckpointError(f"{idx} lists tensors absent from their shards: {missing[:20]}")
    elif os.path.exists(single):
        state = _load(single)
    else:
        raise CheckpointError(f"no {SINGLE} or {INDEX} in {path}; is this a checkpoint directory?")
    extra = os.path.join(path, ORL_EXTRA)
    if os.path.exists(extra):
        state.update(_load(extra))
    return state


def read_state_dict(path: str, cfg: ModelConfig | None = None) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint directory under our parameter names (the directory's key map
    applied; ``cfg`` defaults to `load_config(path)`)."""
    own, fmt = _config_and_format(path) if cfg is None else (cfg, format_of(_read_json(os.path.join(path, CONFIG))))
    state = read_tensors(path)
    return fmt.to_ours(cfg or own, state) if fmt.to_ours is not None else state


def _load(p: str) -> dict:
    try:
        return load_file(p)
    except Exception as e:  # safetensors raises several types for corrupt files
        raise CheckpointError(f"cannot read {p}: {e}. The file is corrupt or truncated; re-save or "
                              "re-download it") from e


def load_state(model: Transformer, state: dict[str, torch.Tensor], where: str = "checkpoint") -> None:
    """Copy ``state`` (our names) into ``model`` after validating every key and shape."""
    cfg = model.config
    ours = model.state_dict()
    if cfg.tie_embeddings:
        ours.pop("lm_head.weight", None)
        state = {k: v for k, v in state.items() if k != "lm_head.weight"}
    missing = sorted(set(ours) - set(state))
    unexpected = sorted(set(state) - set(ours))
    misshaped = sorted(f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(ours[k].shape)}"
                       for k in set(ours) & set(state) if state[k].shape != ours[k].shape)
    if missing or unexpected or misshaped:
        parts = []
        for name, items in (("missing", missing), ("unexpected", unexpected), ("misshaped", misshaped)):
            if items:
                parts.append(f"{len(items)} {name}: " + ", ".join(items[:12]) + (" ..." if len(items) > 12 else ""))
        raise CheckpointError(f"{where} does not match the model config ({cfg.family}): " + "; ".join(parts)
                              + ". Check that config.json belongs to these weights; nothing was loaded.")
    with torch.no_grad():
        for k, t in ours.items():
            t.copy_(state[k])


def load_pretrained(path: str, dtype: torch.dtype = torch.float32, device: str = "cpu", *,
                    mask_token_id: int | None = None, block_size: int | None = None) -> Transformer:
    """Build the model described by ``path``'s config (`load_config`) and load its weights.
    ``mask_token_id`` / ``block_size`` supply (or replace) the config's diffusion fields."""
    cfg, fmt = _config_and_format(path, mask_token_id, block_size)
    model = build_model(cfg, seed=None, dtype=torch.float32, device="cpu")
    state = read_tensors(path)
    load_state(model, fmt.to_ours(cfg, state) if fmt.to_ours is not None else state, where=path)
    return model.to(device=device, dtype=dtype)


def hf_files(cfg: ModelConfig, tokenizer=None) -> tuple[Format, dict, dict | None, dict]:
    """What ``cfg`` is saved as: (format, config.json, generation_config.json or None, orl's fields:
    config.json's ``orl`` block, absent when empty). Raises `CheckpointError` when the format cannot
    hold a field of ``cfg``."""
    fmt = export_format(cfg)
    src = cfg.source or {}
    if FORMATS.get((src.get(CONFIG) or {}).get("model_type")) is not fmt:  # another format's files: not ours to keep
        src = {}
    ids = None if tokenizer is None else {k: getattr(tokenizer, k, None)
                                          for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    d = fmt.config_to(cfg, src.get(CONFIG), ids)
    d.pop(ORL_BLOCK, None)  # the source's block is rewritten from cfg
    gen = fmt.generation(cfg, src.get(GENERATION), ids) if fmt.generation is not None else None
    extras = orl_fields(cfg, fmt.config_from(d))
    bad = sorted(set(extras) - ORL_FIELDS)
    if bad:
        raise CheckpointError(f"the {fmt.name} format cannot hold this {cfg.family} model's "
                              + ", ".join(f"{k}={extras[k]!r}" for k in bad)
                              + "; other tools would build a different model from its config.json")
    if extras:
        d[ORL_BLOCK] = extras
    return fmt, d, gen, extras


def save_pretrained(model: Transformer, path: str, max_shard_bytes: int | None = None,
                    extra_files: dict[str, str] | None = None, tokenizer=None) -> None:
    """Write ``model`` in its format (the one it was loaded from, else its family's; `hf_files`):
    config.json, generation_config.json, safetensors (sharded with an index when over
    ``max_shard_bytes``), orl's part where needed, the tokenizer's files; atomically: into a
    temporary sibling directory, then renamed over ``path``."""
    cfg = model.config
    fmt, hf, gen, _ = hf_files(cfg, tokenizer)
    parent = os.path.dirname(os.path.abspath(path)) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tmp-", dir=parent)
    try:
        state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
        if cfg.tie_embeddings:
            state.pop("lm_head.weight", None)
        state = fmt.from_ours(cfg, state) if fmt.from_ours is not None else state
        ours_only = {} if fmt.pathway_native else {k: state.pop(k) for k in list(state)
                                                   if k.startswith("residual_pathway.")}
        dt = next((v.dtype for v in state.values() if v.is_floating_point()), torch.float32)
        hf["torch_dtype" if "torch_dtype" in hf else "dtype"] = str(dt).removeprefix("torch.")
        shards, cur, size = [], {}, 0
        for k in sorted(state):
            nbytes = state[k].numel() * state[k].element_size()
            if max_shard_bytes and cur and size + nbytes > max_shard_bytes:
                shards.append(cur)
                cur, size = {}, 0
            cur[k], size = state[k], size + nbytes
        shards.append(cur)
        if len(shards) == 1:
            save_file(shards[0], os.path.join(tmp, SINGLE), metadata={"format": "pt"})
        else:
            weight_map = {}
            for i, sh in enumerate(shards):
                name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
                save_file(sh, os.path.join(tmp, name), metadata={"format": "pt"})
                weight_map.update({k: name for k in sh})
            total = sum(v.numel() * v.element_size() for v in state.values())
            with open(os.path.join(tmp, INDEX), "w") as f:
                json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
        if ours_only:
            save_file(ours_only, os.path.join(tmp, ORL_EXTRA), metadata={"format": "pt"})
        for name, content in ((CONFIG, hf), (GENERATION, gen)):
            if content is not None:
                with open(os.path.join(tmp, name), "w") as f:
                    json.dump(content, f, indent=2)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        for name, src in (extra_files or {}).items():
            shutil.copy(src, os.path.join(tmp, name))
        _replace_dir(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _replace_dir(tmp: str, path: str) -> None:
    """Put directory ``tmp`` at ``path``. An existing ``path`` is exchanged with ``tmp`` in one
    atomic rename (Linux renameat2 RENAME_EXCHANGE: ``path`` never stops existing, and a crash
    leaves the old or the new copy there), then the old copy, now at ``tmp``, is removed. Where
    the exchange is unavailable: two renames, with a moment where ``path`` is missing and its old
    copy is at ``path.old-.tmp-*`` (a training run's start removes such leftovers)."""
    if not os.path.exists(path):
        os.replace(tmp, path)
    elif _exchange(tmp, path):
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        old = path.rstrip("/") + ".old-" + os.path.basename(tmp)
        os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)


def _exchange(a: str, b: str) -> bool:
    """Swap two paths atomically (renameat2 with RENAME_EXCHANGE); False where the C library or the
    file system has no such rename."""
    import ctypes  # noqa: PLC0415
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EPERM):
        return False
    raise OSError(err, os.strerror(err), b)
