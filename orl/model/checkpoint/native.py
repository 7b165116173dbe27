"""orl's former own checkpoint format, read only: config.json with ``model_type: "orl"`` and an
``orl`` block (our `ModelConfig` as a dict), tensors under our parameter names.

Checkpoints written before the family formats existed load with it; saving such a model writes
its family's format (`formats.EXPORTS`; docs/formats.md).
"""
from __future__ import annotations

from ..config import ModelConfig
from .formats import CheckpointError, Format, register


def config_from_orl(d: dict) -> ModelConfig:
    if not isinstance(d.get("orl"), dict):
        raise CheckpointError("config.json has model_type 'orl' but no 'orl' block; re-save the checkpoint")
    return ModelConfig.from_dict(d["orl"])


ORL = register(Format("orl", config_from_orl), "orl")
