"""Qwen3 / SDAR checkpoints (transformers ``Qwen3ForCausalLM`` names are ours: identity key map).

Owns the translation of a Qwen3 / SDAR ``config.json`` into `ModelConfig` (family "sdar", no
residual pathway: `orl convert scrp` adds one). Parity of the layers with transformers' Qwen3 is
tests/test_parity_qwen3.py.
"""
from __future__ import annotations

from ..config import ModelConfig
from .formats import Format, register


def config_from_qwen3(d: dict) -> ModelConfig:
    return ModelConfig(
        family="sdar", vocab_size=d["vocab_size"], hidden_size=d["hidden_size"],
        num_layers=d["num_hidden_layers"], num_heads=d["num_attention_heads"],
        num_kv_heads=d.get("num_key_value_heads", d["num_attention_heads"]),
        head_dim=d.get("head_dim") or d["hidden_size"] // d["num_attention_heads"],
        intermediate_size=d["intermediate_size"],
        rope_theta=float((d.get("rope_parameters") or {}).get("rope_theta", d.get("rope_theta", 1e6))),
        rms_eps=d.get("rms_norm_eps", 1e-6), max_position=d.get("max_position_embeddings", 40960),
        tie_embeddings=d.get("tie_word_embeddings", True), attention_bias=d.get("attention_bias", False),
        mask_token_id=d.get("mask_token_id", 151669), block_size=d.get("block_size", 4), pathway="none")


QWEN3 = register(Format("qwen3", config_from_qwen3), "qwen3", "sdar")
