"""Qwen3 / SDAR checkpoints: transformers ``Qwen3ForCausalLM`` names are ours (identity key map).

Owns the translation between a Qwen3 / SDAR ``config.json`` and `ModelConfig` (family "sdar"), both
ways, and the ``generation_config.json`` we write. The config is a valid Qwen3 config (SDAR's is
the same fields under ``model_type: "sdar"`` with its own modeling code); the two diffusion fields,
which neither format has, are top-level keys ``mask_token_id`` and ``block_size``: transformers
keeps unknown keys as config attributes and writes them back, so they survive other tools.
(SDAR's ``generate.py`` takes both as arguments: the mask id from the tokenizer's mask token,
block_length defaulting to 4.) A causal Qwen3 without them is not a block-diffusion model: loading
it asks for them (`formats.diffusion_fields`). The residual pathway is orl's own
(config.json's ``orl`` block + ``orl_extra.safetensors``; docs/formats.md). Parity with transformers' Qwen3:
tests/test_parity_qwen3.py, tests/test_formats.py.
"""
from __future__ import annotations

from ..config import ModelConfig
from .formats import CheckpointError, Format, diffusion_fields, register

DIFFUSION = (("mask_token_id", "mask_token_id"), ("block_size", "block_size"))
_ACT_IN = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}
_ACT_OUT = {v: k for k, v in _ACT_IN.items()}


def _rope(d: dict) -> tuple[float, list[str]]:
    """(theta, problems): transformers 5 ``rope_parameters`` or the 4.x ``rope_theta`` / ``rope_scaling``."""
    rp = d.get("rope_parameters")
    if isinstance(rp, dict):
        theta, kind = rp.get("rope_theta", d.get("rope_theta", 10_000.0)), rp.get("rope_type", "default")
        scaled = kind != "default"
    else:
        theta, rs = d.get("rope_theta", 10_000.0), d.get("rope_scaling")
        scaled = rs is not None and (rs.get("rope_type") or rs.get("type")) != "default"
        kind = rs
    return float(theta), ([f"RoPE scaling {kind!r} (only plain RoPE is implemented)"] if scaled else [])


def config_from_qwen3(d: dict) -> ModelConfig:
    """Our config from a Qwen3 / SDAR config.json; absent keys take ``Qwen3Config``'s defaults."""
    n = d.get("num_hidden_layers", 32)
    theta, problems = _rope(d)
    act = d.get("hidden_act", "silu")
    if act not in _ACT_IN:
        problems.append(f"hidden_act {act!r} (silu or gelu_pytorch_tanh)")
    sliding = d.get("use_sliding_window") and d.get("max_window_layers", 28) < n
    if sliding or "sliding_attention" in (d.get("layer_types") or []):
        problems.append("sliding-window layers")
    if problems:
        raise CheckpointError("cannot express this Qwen3/SDAR config: " + "; ".join(problems))
    H = d.get("num_attention_heads", 32)
    return ModelConfig(
        family="sdar", vocab_size=d.get("vocab_size", 151_936), hidden_size=d.get("hidden_size", 4096),
        num_layers=n, num_heads=H, num_kv_heads=d.get("num_key_value_heads") or H,
        head_dim=d.get("head_dim") or 128, intermediate_size=d.get("intermediate_size", 22_016),
        rope_theta=theta, rms_eps=d.get("rms_norm_eps", 1e-6), max_position=d.get("max_position_embeddings", 32_768),
        tie_embeddings=bool(d.get("tie_word_embeddings", False)), attention_bias=bool(d.get("attention_bias", False)),
        hidden_act=_ACT_IN[act], pathway="none", **diffusion_fields(d, DIFFUSION, "Qwen3/SDAR"))


def token_ids(d: dict, ids: dict | None) -> dict:
    """``d`` with the tokenizer's bos/eos/pad ids (when a tokenizer was given) written in."""
    return {**d, **{k: v for k, v in (ids or {}).items() if v is not None}}


def config_to_qwen3(cfg: ModelConfig, source: dict | None, ids: dict | None) -> dict:
    """A Qwen3 config.json for ``cfg`` (the source's own keys kept: an SDAR config stays SDAR)."""
    if cfg.hidden_act not in _ACT_OUT:
        raise CheckpointError(f"hidden_act {cfg.hidden_act!r} has no Qwen3 name")
    n = cfg.num_layers
    d = dict(source or {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_dropout": 0.0,
                        "initializer_range": 0.02, "use_cache": True, "bos_token_id": None, "eos_token_id": None,
                        "pad_token_id": None})
    d.update(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
             num_hidden_layers=n, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
             head_dim=cfg.head_dim, hidden_act=_ACT_OUT[cfg.hidden_act], max_position_embeddings=cfg.max_position,
             rms_norm_eps=cfg.rms_eps, tie_word_embeddings=cfg.tie_embeddings, attention_bias=cfg.attention_bias,
             mask_token_id=cfg.mask_token_id, block_size=cfg.block_size)
    for k, v in dict(use_sliding_window=False, sliding_window=None, max_window_layers=n).items():
        d.setdefault(k, v)  # a source's loaded, so they say "no sliding layers" as written
    if "layer_types" in d or source is None:
        d["layer_types"] = ["full_attention"] * n
    if "rope_theta" in d or source is None:  # the transformers 4.x form (SDAR's modeling code reads it)
        d.update(rope_theta=cfg.rope_theta, rope_scaling=None)
    if "rope_parameters" in d or source is None:
        d["rope_parameters"] = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    return token_ids(d, ids)


def generation_qwen3(cfg: ModelConfig, source: dict | None, ids: dict | None) -> dict:
    """generation_config.json: the source's, or the tokenizer's bos/eos/pad ids (SDAR's generate.py
    stops at its ``eos_token_id``)."""
    return token_ids(dict(source or {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}), ids)


QWEN3 = register(Format("qwen3", config_from_qwen3, config_to=config_to_qwen3, generation=generation_qwen3,
                        family="sdar", diffusion=DIFFUSION), "qwen3", "sdar")
