"""orl's own checkpoint format: config.json with an ``orl`` block (our `ModelConfig`), tensors
under our parameter names. What `save_pretrained` writes."""
from __future__ import annotations

from ..config import ModelConfig
from .formats import Format, register


def config_to_hf(cfg: ModelConfig) -> dict:
    """config.json for ``cfg``: our block plus the usual HF fields, for tools that read them."""
    return {"architectures": ["OrlTransformer"], "model_type": "orl", "orl": cfg.to_dict(),
            "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size, "num_hidden_layers": cfg.num_layers,
            "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
            "head_dim": cfg.head_dim, "torch_dtype": "float32"}


ORL = register(Format("orl", lambda d: ModelConfig.from_dict(d["orl"])), "orl")
