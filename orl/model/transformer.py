"""The one transformer of every family: embeddings (+ residual pathway), decoder layers, LM head.

Owns the forward pass from token ids, positions and a visibility mask to logits, with an optional
static KV cache. It knows nothing of training, decoding or HTTP (STYLE.md convention 5): callers
pass the mask (built by `orl.model.masks`), the residual input z and where it applies.
Prediction is not shifted: the hidden state at position i predicts the token at i (SDAR; 1.2).
Shapes: B batch, T new tokens, S visible keys, D hidden, V vocab.
"""
from __future__ import annotations

import torch
from torch import nn

from .cache import KVCache
from .config import ModelConfig
from .layers import DecoderLayer, RMSNorm, init_weights, rope_cos_sin, soft_cap
from .pathway import ResidualPathway, combine


class Body(nn.Module):
    """Named like HF's ``model.*`` so Qwen3 checkpoints map one to one."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_eps, cfg.norm_offset)


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.model = Body(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.residual_pathway = ResidualPathway(cfg) if cfg.pathway == "mlp" else None
        init_weights(self)
        if self.residual_pathway is not None:
            self.residual_pathway.reset_output()
        if cfg.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    # ------------------------------------------------------------------ inputs
    def embed(self, tokens: torch.Tensor, residual: torch.Tensor | None = None,
              residual_where: torch.Tensor | None = None,
              residual_weight: torch.Tensor | None = None) -> torch.Tensor:
        """Input embeddings (B, T, D) of tokens (B, T) with the residual pathway applied."""
        e = self.model.embed_tokens(tokens)
        if self.config.embed_scale != 1.0:
            e = e * torch.tensor(self.config.embed_scale, dtype=e.dtype)
        return combine(e, self.config, self.residual_pathway, residual, residual_where, residual_weight)

    def soft_embed(self, probs: torch.Tensor) -> torch.Tensor:
        """z = c * probs @ E: the pre-adapter soft embedding (B, T, D) of probs (B, T, V)."""
        E = self.model.embed_tokens.weight
        z = probs.to(E.dtype) @ E
        return z * self.config.embed_scale if self.config.embed_scale != 1.0 else z

    # ----------------------------------------------------------------- forward
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                residual: torch.Tensor | None = None, residual_where: torch.Tensor | None = None,
                residual_weight: torch.Tensor | None = None, cache: KVCache | None = None,
                store_kv: bool = False, inputs_embeds: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, V).

        tokens (B, T) int64; positions (B, T) or (T,) absolute positions; mask (B|1, T, S) or (T, S)
        bool, True = visible, S = cache.length + T with a cache else T; residual (B, T, D) z;
        residual_where (B, T) bool; residual_weight (B, T) (rcd). ``store_kv`` writes the new
        tokens' keys/values into ``cache`` (the commit pass).
        """
        cfg = self.config
        B, T = tokens.shape
        if positions.dim() == 1:
            positions = positions[None].expand(B, T)
        if mask.dim() == 2:
            mask = mask[None]
        if int(positions.max()) >= cfg.max_position:
            raise ValueError(f"position {int(positions.max())} exceeds max_position {cfg.max_position}; "
                             "shorten the prompt or max_new_tokens")
        h = inputs_embeds if inputs_embeds is not None else self.embed(tokens, residual, residual_where,
                                                                         residual_weight)
        dtype = h.dtype
        cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta, dtype=dtype)
        masks = {"full": mask}
        if cfg.sliding_window and "sliding" in cfg.layer_types:
            kpos = cache.key_positions(positions) if cache is not None else positions
            d = positions[:, :, None] - kpos[:, None, :]
            masks["sliding"] = mask & (d.abs() < cfg.sliding_window)
        for layer, kind in zip(self.model.layers, cfg.layer_types):
            h = layer(h, cos, sin, masks.get(kind, mask), cache, store_kv)
        if cache is not None and store_kv:
            cache.advance(positions)
        logits = self.lm_head(self.model.norm(h))
        return soft_cap(logits, cfg.final_logit_softcap)

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        p = self.model.embed_tokens.weight
        cfg = self.config
        return KVCache(cfg.num_layers, batch, cfg.num_kv_heads, max_len, cfg.head_dim, p.dtype, p.device)


def build_model(cfg: ModelConfig, seed: int | None = 0, dtype: torch.dtype = torch.float32,
                device: str | torch.device = "cpu") -> Transformer:
    """A randomly initialised model (deterministic for a given seed)."""
    if seed is not None:
        torch.manual_seed(seed)
    with torch.device(device):
        model = Transformer(cfg)
    return model.to(dtype)
