"""The engine's forward: baked weights and a graph-safe pass over a static KV cache.

Owns two things:
  * ``bake``: a `Transformer`'s weights in one dtype, laid out for inference -- Q, K and V
    concatenated into one (H + 2 Hkv) hd x D matrix and gate/up into one 2I x D matrix, so each
    is a single matmul; the tied LM head shares the embedding (no copy). Mixture-of-experts
    layers (those from ``cfg.first_dense_layers`` on) carry `orl.engine.moe.MoEWeights` instead
    of a dense MLP and run `orl.engine.moe.moe_mlp` (grouped Triton kernel on CUDA).
  * ``forward``: new tokens at a device-side offset ``start`` (a (1,) int64 tensor), their keys and
    values written into the static cache in place, attention over a fixed prefix of ``S`` cache
    slots with a length mask. Nothing here reads a device value on the host or changes shape with
    the amount cached, so the same call can be captured once in a CUDA graph and replayed for
    every block.
Visibility is one rule: new token i sees cache slot j iff j < start + lim[i]. ``lim`` encodes the
layout: a canvas row sees everything up to the end of the canvas; a committed block row sees its
whole block (block-causal) or the slots up to itself (causal); prompt rows are causal. This is the
same visibility as `orl.model.masks` gives the reference decoder (tested against it).
Does not own: what is decoded (`orl.engine.runtime`), CUDA graphs (`orl.engine.graphs`), the
numerics of norms/RoPE/pathway (those of `orl.model`, reused or mirrored op for op).
Shapes: T new tokens, S visible cache slots, D hidden, H heads, V vocab.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..model.layers import MoE, apply_rope, rope_cos_sin, soft_cap
from ..model.pathway import combine
from .moe import MoEWeights, bake_moe, moe_bytes, moe_mlp, pick_backend, route


class LayerWeights(NamedTuple):
    """One layer's inference weights (a NamedTuple, so torch.compile sees plain tensor inputs and
    one compiled graph serves every layer)."""

    ln1: torch.Tensor                 # (D,) input_layernorm
    qkv: torch.Tensor                 # ((H + 2 Hkv) hd, D) = [q_proj; k_proj; v_proj]
    qkv_bias: torch.Tensor | None
    q_norm: torch.Tensor | None       # (hd,)
    k_norm: torch.Tensor | None
    o: torch.Tensor                   # (D, H hd)
    ln2: torch.Tensor                 # (D,) post_attention_layernorm
    gate_up: torch.Tensor | None      # (2I, D) = [gate_proj; up_proj]; None in a MoE layer
    down: torch.Tensor | None         # (D, I)
    moe: MoEWeights | None = None     # routed + shared experts of a MoE layer


@dataclass
class Baked:
    """Inference weights of one model (see module docstring); ``pathway`` is a cast copy of the
    model's residual pathway module (its numerics are `orl.model.pathway`'s)."""

    cfg: object
    dtype: torch.dtype
    embed: torch.Tensor               # (V, D)
    lm_head: torch.Tensor             # (V, D), the same tensor as ``embed`` when tied
    norm: torch.Tensor                # (D,)
    layers: list[LayerWeights]
    pathway: torch.nn.Module | None
    rope_cos: torch.Tensor            # (max_len, hd) table, rows = absolute positions
    rope_sin: torch.Tensor
    moe_backend: str = "torch"        # "triton" or "torch" (`orl.engine.moe.moe_mlp`), resolved at bake
    tp_reduce: object = None          # tensor parallel (`orl.engine.tp.shard`): in-place sum over ranks

    def weight_bytes(self, route_ids: list | None = None) -> int:
        """Bytes one forward reads from weights (layers + final norm + LM head; the embedding rows
        a forward gathers are negligible and not counted). MoE layers count every expert, or with
        ``route_ids`` (one ids tensor per MoE layer, in order, as `forward`'s ``route_out``
        collects them) only the experts those ids touch: the floor of that forward."""
        n = self.lm_head.numel() + self.norm.numel()
        ids = iter(route_ids or [])
        moe = 0
        for lw in self.layers:
            n += sum(t.numel() for t in (lw.ln1, lw.qkv, lw.o, lw.ln2, lw.gate_up, lw.down,
                                         lw.qkv_bias, lw.q_norm, lw.k_norm) if t is not None)
            if lw.moe is not None:
                moe += moe_bytes(lw.moe, next(ids) if route_ids is not None else None)
        return n * self.lm_head.element_size() + moe


def check_supported(cfg) -> None:
    """Refuse configurations the engine does not run yet, saying what to use instead."""
    bad = []
    if "sliding" in cfg.layer_types:
        bad.append("sliding-window layers")
    if cfg.sandwich_norm or cfg.layer_scalar or cfg.full_k_eq_v or cfg.parallel_dense_mlp:
        bad.append("Gemma-4 layer options (sandwich norms, layer scalars, K = V)")
    if cfg.full_head_dim or cfg.full_num_kv_heads or cfg.full_rope_theta is not None:
        bad.append("per-layer-type attention shapes")
    if cfg.noise != "mask":
        bad.append("uniform-state noise")
    if bad:
        raise NotImplementedError("the engine runtime supports dense mask-diffusion models (SDAR / Qwen3 shape); "
                                  f"this config has {', '.join(bad)}. Decode it with orl.decode.decode instead.")


def bake_io(model, cast, dtype: torch.dtype):
    """(embed, lm_head, pathway) of ``model`` for inference: the tied LM head shares the embedding
    (no copy); the residual pathway is a cast copy of the model's module (None without one)."""
    embed = cast(model.model.embed_tokens.weight)
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    lm_head = embed if tied else cast(model.lm_head.weight)
    pathway = None
    if model.residual_pathway is not None:
        pathway = copy.deepcopy(model.residual_pathway).to(dtype).eval()
    return embed, lm_head, pathway


@torch.no_grad()
def bake(model, dtype: torch.dtype | None = None, max_len: int = 4096, moe_backend: str = "auto") -> Baked:
    """Inference weights of ``model`` in ``dtype`` (default: the model's), on the model's device.
    ``moe_backend``: see `orl.engine.moe.moe_mlp` ("auto": Triton on CUDA when importable)."""
    cfg = model.config
    check_supported(cfg)
    dtype = dtype or model.model.embed_tokens.weight.dtype
    cast = lambda t: None if t is None else t.detach().to(dtype).contiguous()  # noqa: E731
    layers = []
    for layer in model.model.layers:
        a, m = layer.self_attn, layer.mlp
        bias = None
        if a.q_proj.bias is not None:
            bias = cast(torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]))
        moe = m if isinstance(m, MoE) else None
        layers.append(LayerWeights(
            ln1=cast(layer.input_layernorm.weight),
            qkv=cast(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])), qkv_bias=bias,
            q_norm=cast(a.q_norm.weight) if cfg.qk_norm else None,
            k_norm=cast(a.k_norm.weight) if cfg.qk_norm else None,
            o=cast(a.o_proj.weight), ln2=cast(layer.post_attention_layernorm.weight),
            gate_up=None if moe else cast(torch.cat([m.gate_proj.weight, m.up_proj.weight])),
            down=None if moe else cast(m.down_proj.weight), moe=bake_moe(moe, cast) if moe else None))
    embed, lm_head, pathway = bake_io(model, cast, dtype)
    pos = torch.arange(max_len, device=embed.device)[None]
    cos, sin = rope_cos_sin(pos, *cfg.layer_rope("full"), dtype=dtype)
    return Baked(cfg, dtype, embed, lm_head, cast(model.model.norm.weight), layers, pathway, cos[0], sin[0],
                 pick_backend(moe_backend, embed.device))


class StaticKV:
    """Per-layer K/V buffers (1, Hkv, max_len, hd), allocated once; which slots are valid is the
    caller's business (a device-side length), never this object's."""

    def __init__(self, cfg, max_len: int, dtype: torch.dtype, device):
        shape = (1, cfg.num_kv_heads, max_len, cfg.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_layers)]
        self.max_len = max_len

    def bytes_per_slot(self) -> int:
        k = self.k[0]
        return 2 * len(self.k) * k.shape[1] * k.shape[3] * k.element_size()


# ------------------------------------------------------------------------------ numerics
def rms_norm(x: torch.Tensor, w: torch.Tensor | None, eps: float, offset: float = 0.0) -> torch.Tensor:
    """`orl.model.layers.RMSNorm.forward`, op for op (float32 inside, cast back)."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if w is not None:
        y = y * (offset + w.float())
    return y.to(x.dtype)


def embed(w: Baked, tokens: torch.Tensor, residual=None, where=None, weight=None) -> torch.Tensor:
    """`Transformer.embed`: c * E[tokens] mixed with the residual pathway. tokens (1, T) -> (1, T, D)."""
    e = F.embedding(tokens, w.embed)
    if w.cfg.embed_scale != 1.0:
        e = e * torch.tensor(w.cfg.embed_scale, dtype=torch.float32).to(e.dtype)
    return combine(e, w.cfg, w.pathway, residual, where, weight)


def soft_embed(w: Baked, probs: torch.Tensor) -> torch.Tensor:
    """`Transformer.soft_embed`: z = c * probs @ E, probs (1, K, V) -> (1, K, D)."""
    z = probs.to(w.embed.dtype) @ w.embed
    if w.cfg.embed_scale != 1.0:
        z = z * torch.tensor(w.cfg.embed_scale, dtype=torch.float32).to(z.dtype)
    return z


def attention_bias(start: torch.Tensor, lim: torch.Tensor, S: int, groups: int, dtype) -> torch.Tensor:
    """Additive mask (1, 1, groups * T, S): 0 where slot j < start + lim[i], -inf elsewhere,
    its T rows tiled ``groups`` times (query heads sharing one KV head are stacked as rows)."""
    keys = torch.arange(S, device=lim.device)
    visible = keys[None, :] < (start + lim)[:, None]                      # (T, S)
    bias = torch.zeros(visible.shape, dtype=dtype, device=lim.device).masked_fill_(~visible, float("-inf"))
    return bias.repeat(groups, 1)[None, None]


def layer(x, lw: LayerWeights, cfg, cos, sin, pos, k_cache, v_cache, bias, moe_backend: str = "torch",
          route_out: list | None = None, reduce=None):
    """One pre-norm decoder layer over T new tokens. x (1, T, D); cos/sin (1, T, hd); pos (T,)
    absolute slots written; k_cache/v_cache (1, Hkv, max_len, hd) updated in place; bias from
    `attention_bias` (its last dim is S, the slots attended). Mirrors
    `orl.model.layers.DecoderLayer` (dense or MoE, non-sandwich). ``route_out`` (eager only): a
    MoE layer appends its router's expert ids (T, k) to it (for `Baked.weight_bytes`). ``reduce``
    (tensor parallel, `orl.engine.tp`): sums the row-parallel o / down outputs over ranks."""
    T, S = x.shape[1], bias.shape[-1]
    H, Hkv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    h = rms_norm(x, lw.ln1, cfg.rms_eps, cfg.norm_offset)
    q, k, v = F.linear(h, lw.qkv, lw.qkv_bias).split([H * hd, Hkv * hd, Hkv * hd], dim=-1)
    q, k, v = q.view(1, T, H, hd), k.view(1, T, Hkv, hd), v.view(1, T, Hkv, hd)
    if lw.q_norm is not None:
        q, k = rms_norm(q, lw.q_norm, cfg.rms_eps, cfg.norm_offset), rms_norm(k, lw.k_norm, cfg.rms_eps, cfg.norm_offset)
    if cfg.v_norm:
        v = rms_norm(v, None, cfg.rms_eps)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    k_cache.index_copy_(2, pos, k)
    v_cache.index_copy_(2, pos, v)
    G = H // Hkv
    # GQA without expanding K/V: the G query heads of a KV head become G*T rows of one head
    qg = q.reshape(1, Hkv, G * T, hd)
    scale = cfg.attn_scale if cfg.attn_scale is not None else hd ** -0.5
    out = F.scaled_dot_product_attention(qg, k_cache[:, :, :S], v_cache[:, :, :S], attn_mask=bias, scale=scale)
    out = out.reshape(1, H, T, hd).transpose(1, 2).reshape(1, T, H * hd)
    y = F.linear(out, lw.o)
    x = x + (y if reduce is None else reduce(y))
    h = rms_norm(x, lw.ln2, cfg.rms_eps, cfg.norm_offset)
    if lw.moe is not None:
        if route_out is not None:
            route_out.append(route(h.reshape(-1, h.shape[-1]), lw.moe, cfg)[1])
        return x + moe_mlp(h, lw.moe, cfg, backend=moe_backend)
    g, u = F.linear(h, lw.gate_up).chunk(2, dim=-1)
    act = F.silu(g) if cfg.hidden_act == "silu" else F.gelu(g, approximate="tanh")
    y = F.linear(act * u, lw.down)
    return x + (y if reduce is None else reduce(y))


def forward(w: Baked, h: torch.Tensor, start: torch.Tensor, lim: torch.Tensor, kv: StaticKV, S: int,
            logits_from: int | None = 0, layer_fn=layer, route_out: list | None = None,
            kernels=None) -> torch.Tensor | None:
    """Run the layers over input embeddings h (1, T, D) placed at slots start .. start + T - 1.

    start (1,) int64 device tensor; lim (T,) int64 (see module docstring); S static number of cache
    slots attended (>= start + max(lim)). Writes the T keys/values into ``kv``. Returns logits
    (1, T - logits_from, V) of rows ``logits_from:`` (None: no LM head, e.g. a commit pass).
    ``layer_fn`` is `layer` or a compiled version of it. ``route_out``: see `layer` (eager only).
    ``kernels``: an `orl.engine.kernels.TritonKernels` runs the whole pass instead (opt-in fast twin).
    """
    if kernels is not None:
        return kernels.forward(h, start, lim, kv, S, logits_from)
    cfg = w.cfg
    T = h.shape[1]
    pos = start + torch.arange(T, device=h.device)
    cos, sin = w.rope_cos.index_select(0, pos)[None], w.rope_sin.index_select(0, pos)[None]
    bias = attention_bias(start, lim, S, cfg.num_heads // cfg.num_kv_heads, h.dtype)
    if layer_fn is not layer:  # compiled: S symbolic, so a new cache bucket does not recompile
        torch._dynamo.maybe_mark_dynamic(bias, 3)
    for i, lw in enumerate(w.layers):
        extra = {} if route_out is None else {"route_out": route_out}
        if w.tp_reduce is not None:
            extra["reduce"] = w.tp_reduce
        h = layer_fn(h, lw, cfg, cos, sin, pos, kv.k[i], kv.v[i], bias, moe_backend=w.moe_backend, **extra)
    if logits_from is None:
        return None
    logits = F.linear(rms_norm(h[:, logits_from:], w.norm, cfg.rms_eps, cfg.norm_offset), w.lm_head)
    return soft_cap(logits, cfg.final_logit_softcap)
