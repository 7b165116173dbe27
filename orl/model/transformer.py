"""The one transformer of every family: embeddings (+ residual pathway), decoder layers, LM head.

Owns the forward pass from token ids, positions and a visibility mask to logits, with an optional
static KV cache. It knows nothing of training, decoding or HTTP (docs/STYLE.md convention 5): callers
pass the mask (built by `orl.model.masks`), the residual input z and where it applies.
Prediction is not shifted: the hidden state at position i predicts the token at i (SDAR; 1.2).
DiffusionGemma's encoder (causal, writes the cache) and decoder (bidirectional canvas, reads it)
are this one model under two masks (docs/diffusiongemma-spec.md 6).
Shapes: B batch, T new tokens, S visible keys, D hidden, V vocab.
"""
from __future__ import annotations

import torch
from torch import nn

from .cache import KVCache
from .config import ModelConfig
from .layers import DecoderLayer, RMSNorm, init_weights, rope_cos_sin, soft_cap
from .pathway import ResidualPathway, combine


def _scale(c: float, dtype: torch.dtype) -> torch.Tensor:
    """The embedding scale as HF Gemma applies it: a float32 scalar cast to the weights' dtype
    (so sqrt(3072) = 55.43 becomes 55.5 in bf16)."""
    return torch.tensor(c, dtype=torch.float32).to(dtype)


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
        # activation checkpointing per layer (a memory setting of whoever trains the model, off by default)
        self.checkpoint_layers = False
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
            e = e * _scale(self.config.embed_scale, e.dtype)
        return combine(e, self.config, self.residual_pathway, residual, residual_where, residual_weight)

    def soft_embed(self, probs: torch.Tensor) -> torch.Tensor:
        """z = c * probs @ E: the pre-adapter soft embedding (B, T, D) of probs (B, T, V)."""
        E = self.model.embed_tokens.weight
        z = probs.to(E.dtype) @ E
        return z * _scale(self.config.embed_scale, z.dtype) if self.config.embed_scale != 1.0 else z

    # ----------------------------------------------------------------- forward
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                residual: torch.Tensor | None = None, residual_where: torch.Tensor | None = None,
                residual_weight: torch.Tensor | None = None, cache: KVCache | None = None,
                store_kv: bool = False, inputs_embeds: torch.Tensor | None = None,
                return_hidden: bool = False) -> torch.Tensor:
        """Logits (B, T, V); with ``return_hidden`` the final-normed hidden states (B, T, D) instead,
        for a caller that needs logits at a few positions only (``head`` of a gather of them).

        tokens (B, T) int64; positions (B, T) or (T,) absolute positions; mask (B|1, T, S) or (T, S)
        bool, True = visible, S = cache.length + T with a cache else T; residual (B, T, D) z;
        residual_where (B, T) bool; residual_weight (B, T) (rcd). ``store_kv`` writes the new
        tokens' keys/values into ``cache`` (the commit pass).
        Per layer type ("full" / "sliding") the head dim, RoPE and mask differ: sliding layers see
        ``sliding_window_mask(mask)``. With ``config.layer_scalar`` the positions in
        ``residual_where`` are in canvas (decoder) mode and use each layer's canvas scalar; the
        DiffusionGemma decoder passes the whole canvas there (``pathway_where="canvas"``).
        """
        cfg = self.config
        B, T = tokens.shape
        if positions.dim() == 1:
            positions = positions[None].expand(B, T)
        if not isinstance(mask, torch.Tensor):  # a FlexAttention BlockMask (packed replay)
            if cache is not None or "sliding" in cfg.layer_types:
                raise NotImplementedError("a BlockMask serves full-attention layers without a cache (packed "
                                          "replay); pass a dense bool mask for cached or sliding-window forwards")
        elif mask.dim() == 2:
            mask = mask[None]
        if int(positions.max()) >= cfg.max_position:
            raise ValueError(f"position {int(positions.max())} exceeds max_position {cfg.max_position}; "
                             "shorten the prompt or max_new_tokens")
        h = inputs_embeds if inputs_embeds is not None else self.embed(tokens, residual, residual_where,
                                                                         residual_weight)
        dtype = h.dtype
        kinds = sorted(set(cfg.layer_types))
        rope = {k: rope_cos_sin(positions, *cfg.layer_rope(k), dtype=dtype) for k in kinds}
        masks = {"full": mask}
        if "sliding" in kinds:
            kpos = cache.key_positions(positions) if cache is not None else positions
            masks["sliding"] = sliding_window_mask(mask, positions, kpos, cfg.sliding_window)
        canvas = residual_where if cfg.layer_scalar else None
        ckpt = self.checkpoint_layers and torch.is_grad_enabled() and cache is None
        for layer, kind in zip(self.model.layers, cfg.layer_types):
            if ckpt:  # keep only each layer's input; recompute its activations in the backward
                h = torch.utils.checkpoint.checkpoint(layer, h, *rope[kind], masks[kind], None, False, canvas,
                                                      use_reentrant=False)
            else:
                h = layer(h, *rope[kind], masks[kind], cache, store_kv, canvas)
        if cache is not None and store_kv:
            cache.advance(positions)
        h = self.model.norm(h)
        return h if return_hidden else self.head(h)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Logits (..., V) of final-normed hidden states (..., D): the LM head and the soft cap."""
        return soft_cap(self.lm_head(h), self.config.final_logit_softcap)

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        p = self.model.embed_tokens.weight
        cfg = self.config
        n = cfg.num_layers
        return KVCache(n, batch, [cfg.layer_kv_heads(i) for i in range(n)], max_len,
                       [cfg.layer_head_dim(i) for i in range(n)], p.dtype, p.device)


def sliding_window_mask(mask: torch.Tensor, qpos: torch.Tensor, kpos: torch.Tensor, window: int) -> torch.Tensor:
    """Visibility of sliding-window layers: ``mask`` restricted to keys at positions > a(q) - W.

    mask (B|1, T, S) bool, whose last T columns are the T query tokens themselves; qpos (B, T),
    kpos (B, S) absolute positions. a(q) is the first position of q's *group*: the new tokens that
    q sees and that see q (q itself for causal text; the whole canvas for a canvas query). So
      causal / committed text:   q - W < k <= q        (HF Gemma sliding window, encoder)
      canvas (bidirectional):    every canvas key, plus the W - 1 prefix keys before the canvas
    which is what HF DiffusionGemma's decoder sees with its dynamic sliding cache (W - 1 tokens
    kept; docs/diffusiongemma-spec.md 6.2), independent of the query's place in the canvas.
    Derived from positions and the layout's mask, so cached, uncached and packed layouts agree.
    """
    T = qpos.shape[1]
    new = mask[..., -T:]
    mutual = new & new.transpose(-1, -2)  # (B|1, T, T)
    big = torch.iinfo(qpos.dtype).max
    anchor = torch.where(mutual, qpos[:, None, :], torch.full_like(qpos[:, None, :], big)).amin(-1)  # (B, T)
    anchor = torch.minimum(anchor, qpos)  # a query that does not see itself: plain causal window
    return mask & (kpos[:, None, :] > anchor[:, :, None] - window)


def build_model(cfg: ModelConfig, seed: int | None = 0, dtype: torch.dtype = torch.float32,
                device: str | torch.device = "cpu") -> Transformer:
    """A randomly initialised model (deterministic for a given seed). The initialisation draws from
    torch's CPU stream seeded with ``seed`` inside ``fork_rng``, so the caller's global RNG state is
    left as it was (``seed=None``: drawn from, and advancing, the global stream)."""
    if seed is None:
        with torch.device(device):
            return Transformer(cfg).to(dtype)
    dev = torch.device(device)
    cuda = [dev.index if dev.index is not None else torch.cuda.current_device()] if dev.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(seed)
        with torch.device(device):
            model = Transformer(cfg)
    return model.to(dtype)
