"""Checkpoint files in the Hugging Face layout: safetensors (single or sharded + index) and config.json.

Owns: reading, validation (missing / unexpected / misshaped keys are all listed in one error
and nothing is loaded), atomic writes (a directory is written beside the target and renamed, exchanged
in one rename with an existing one).
Does not own: formats and key maps (`orl.model.checkpoint.formats` and its modules), tokenizers (saved by the caller next to the weights), optimizer state (`orl.train.checkpoint`).
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile

import torch
from safetensors.torch import load_file, save_file

from ..config import ModelConfig
from ..transformer import Transformer, build_model
from .formats import CheckpointError, family_format, format_of
from .native import config_to_hf

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


def config_from_hf(d: dict) -> ModelConfig:
    """Our config from a config.json dict, by its registered format (`formats.format_of`)."""
    return format_of(d).config_from(d)


def _to_ours(cfg: ModelConfig, state: dict) -> dict:
    fmt = family_format(cfg.family)
    return fmt.to_ours(cfg, state) if fmt.to_ours is not None else dict(state)


def read_state_dict(path: str) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint directory (single file or sharded with an index)."""
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
        return state
    if os.path.exists(single):
        return _load(single)
    raise CheckpointError(f"no {SINGLE} or {INDEX} in {path}; is this a checkpoint directory?")


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


def load_pretrained(path: str, dtype: torch.dtype = torch.float32, device: str = "cpu") -> Transformer:
    """Build the model described by ``path/config.json`` and load its weights."""
    cfg_path = os.path.join(path, "config.json")
    if not os.path.exists(cfg_path):
        raise CheckpointError(f"{cfg_path} not found; pass a directory written by `orl sft`/`save_pretrained`, "
                              "a Hugging Face Qwen3/SDAR/DiffusionGemma checkpoint, or a named size")
    with open(cfg_path) as f:
        try:
            cfg = config_from_hf(json.load(f))
        except json.JSONDecodeError as e:
            raise CheckpointError(f"{cfg_path} is not valid JSON: {e}") from e
    model = build_model(cfg, seed=None, dtype=torch.float32, device="cpu")
    load_state(model, _to_ours(cfg, read_state_dict(path)), where=path)
    return model.to(device=device, dtype=dtype)


def save_pretrained(model: Transformer, path: str, max_shard_bytes: int | None = None,
                    extra_files: dict[str, str] | None = None, tokenizer=None) -> None:
    """Write config.json + safetensors (sharded with an index when over ``max_shard_bytes``)
    atomically: into a temporary sibling directory, then renamed over ``path``."""
    parent = os.path.dirname(os.path.abspath(path)) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tmp-", dir=parent)
    try:
        state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
        if model.config.tie_embeddings:
            state.pop("lm_head.weight", None)
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
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(config_to_hf(model.config), f, indent=2)
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
