"""The engine's DiffusionGemma forward: baked weights and a graph-safe pass over a static KV cache.

The DiffusionGemma twin of `orl.engine.forward` (same contract: new tokens at a device-side offset
``start``, keys/values written in place, attention over a fixed prefix of ``S`` slots, nothing read
back on the host), for the Gemma-4 layer of `orl.model.layers.DecoderLayer` with every option of
`orl.model.config.DGEMMA_OPTIONS` (docs/diffusiongemma-spec.md 4-7), mirrored op for op:

  h = h + n_pa(attn(n_in(h)))                  sandwich norms; attention scale 1.0; q/k norms;
                                               weightless v-norm; full layers: V = raw k_proj(x)
  h = h + n_pf(n_pf1(mlp(n_pre(h))) + n_pf2(experts(n_pre2(h), router(h))))
  h = h * s                                    s = the encoder scalar on committed rows, the
                                               canvas (decoder) scalar on canvas rows
Per layer type ("sliding" / "full") the head dim, KV heads and RoPE table differ, so the cache
is per layer and there is one attention bias per type. Visibility, per new token i (``lim`` as in
`orl.engine.forward`; ``anc`` is the first slot of i's mutually visible group, relative to
``start``: i itself for committed text, the canvas start for a canvas row):
  full layers      slot j visible iff j < start + lim[i]
  sliding layers   ... and j > start + anc[i] - W
which is `orl.model.transformer.sliding_window_mask` (encoder: q - W < k <= q; canvas: the whole
canvas plus the last W - 1 cached tokens, HF's dynamic sliding cache).
Weights: Q, K(, V) concatenated into one matrix per layer (K = V layers have no V rows), dense
gate/up into one; the experts are `orl.engine.moe`'s (``bake_moe`` / ``moe_mlp`` with the raw
residual as router input: grouped Triton kernels on CUDA, the PyTorch twin on CPU).
Does not own: decoding (`orl.engine.dgemma`), embeddings and the pathway (`orl.engine.forward`'s
``embed`` / ``soft_embed``, shared), CUDA graphs (`orl.engine.graphs`).
Shapes: T new tokens, S attended cache slots, D hidden, H heads, E experts, V vocab.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..model.layers import apply_rope, rope_cos_sin, soft_cap
from .forward import bake_io, rms_norm
from .moe import MoEWeights, bake_moe, moe_bytes, moe_mlp, pick_backend, route


class DGLayerWeights(NamedTuple):
    ln_in: torch.Tensor               # (D,) input_layernorm
    qkv: torch.Tensor                 # ((H + 2 Hkv) hd, D), or ((H + Hkv) hd, D) on K = V layers
    q_norm: torch.Tensor              # (hd,)
    k_norm: torch.Tensor
    o: torch.Tensor                   # (D, H hd)
    ln_post_attn: torch.Tensor
    ln_pre_ff: torch.Tensor           # dense MLP branch
    gate_up: torch.Tensor             # (2F, D)
    down: torch.Tensor                # (D, F)
    ln_post_ff1: torch.Tensor
    ln_pre_ff2: torch.Tensor          # experts branch
    moe: MoEWeights                   # routed experts (no shared expert: the dense MLP is separate)
    ln_post_ff2: torch.Tensor
    ln_post_ff: torch.Tensor          # on the sum of both branches
    scalar: torch.Tensor              # (1,) encoder (committed text) layer scalar
    canvas_scalar: torch.Tensor       # (1,) decoder (canvas) layer scalar


@dataclass
class DGBaked:
    """Inference weights of a DiffusionGemma model; ``embed``/``pathway``/``cfg`` have the meaning
    of `orl.engine.forward.Baked`, so its ``embed`` and ``soft_embed`` serve both."""

    cfg: object
    dtype: torch.dtype
    embed: torch.Tensor               # (V, D)
    lm_head: torch.Tensor             # (V, D), ``embed`` itself when tied
    norm: torch.Tensor
    layers: list[DGLayerWeights]
    pathway: torch.nn.Module | None
    rope: dict                        # kind -> (cos, sin) tables (max_len, hd of that kind)
    moe_backend: str                  # "triton" or "torch" (`orl.engine.moe.moe_mlp`), resolved at bake

    def weight_bytes(self, route_ids: list | None = None) -> int:
        """Bytes of weights one round reads, each once: layers, final norm, LM head, the
        self-conditioning pathway; MoE layers count every expert, or with ``route_ids`` (one (T, k)
        tensor per layer, from `forward`'s ``route_out``) only the experts routed to. The embedding
        rows gathered are negligible; the soft embedding's second pass over E is not counted."""
        n = self.lm_head.numel() + self.norm.numel()
        if self.pathway is not None:
            n += sum(p.numel() for p in self.pathway.parameters())
        size = self.lm_head.element_size()
        for i, lw in enumerate(self.layers):
            n += sum(t.numel() for name, t in lw._asdict().items() if name != "moe")
            n += moe_bytes(lw.moe, None if route_ids is None else route_ids[i]) // size
        return n * size


@torch.no_grad()
def bake(model, dtype: torch.dtype | None = None, max_len: int = 4096, moe_backend: str = "auto") -> DGBaked:
    """Inference weights of a DiffusionGemma-configured `Transformer` in ``dtype`` (default: the
    model's), on its device. Same-dtype tensors are shared with the model, not copied (the fused
    QKV and gate/up matrices are the only copies)."""
    cfg = model.config
    if cfg.noise != "uniform" or not (cfg.sandwich_norm and cfg.parallel_dense_mlp and cfg.layer_scalar):
        raise NotImplementedError("orl.engine.dgemma_forward runs DiffusionGemma-configured models "
                                  "(config.DGEMMA_OPTIONS); use orl.engine.forward for the others")
    if cfg.first_dense_layers or not cfg.qk_norm or not cfg.v_norm or cfg.attention_bias:
        raise NotImplementedError("DiffusionGemma layers are all MoE with q/k/v norms and no biases")
    dtype = dtype or model.model.embed_tokens.weight.dtype
    cast = lambda t: None if t is None else t.detach().to(dtype).contiguous()  # noqa: E731
    layers = []
    for layer in model.model.layers:
        a = layer.self_attn
        mats = [a.q_proj.weight, a.k_proj.weight] + ([] if a.v_proj is None else [a.v_proj.weight])
        layers.append(DGLayerWeights(
            ln_in=cast(layer.input_layernorm.weight), qkv=cast(torch.cat(mats)), q_norm=cast(a.q_norm.weight),
            k_norm=cast(a.k_norm.weight), o=cast(a.o_proj.weight),
            ln_post_attn=cast(layer.post_attention_layernorm.weight),
            ln_pre_ff=cast(layer.pre_feedforward_layernorm.weight),
            gate_up=cast(torch.cat([layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight])),
            down=cast(layer.mlp.down_proj.weight), ln_post_ff1=cast(layer.post_feedforward_layernorm_1.weight),
            ln_pre_ff2=cast(layer.pre_feedforward_layernorm_2.weight), moe=bake_moe(layer.moe, cast),
            ln_post_ff2=cast(layer.post_feedforward_layernorm_2.weight),
            ln_post_ff=cast(layer.post_feedforward_layernorm.weight),
            scalar=cast(layer.layer_scalar), canvas_scalar=cast(layer.canvas_layer_scalar)))
    embed, lm_head, pathway = bake_io(model, cast, dtype)
    pos = torch.arange(max_len, device=embed.device)[None]
    rope = {}
    for kind in sorted(set(cfg.layer_types)):
        cos, sin = rope_cos_sin(pos, *cfg.layer_rope(kind), dtype=dtype)
        rope[kind] = (cos[0], sin[0])
    return DGBaked(cfg, dtype, embed, lm_head, cast(model.model.norm.weight), layers, pathway, rope,
                   pick_backend(moe_backend, embed.device))


class DGStaticKV:
    """Per-layer K/V buffers (1, Hkv_l, max_len, hd_l), allocated once (shapes per layer type)."""

    def __init__(self, cfg, max_len: int, dtype: torch.dtype, device):
        shapes = [(1, cfg.layer_kv_heads(i), max_len, cfg.layer_head_dim(i)) for i in range(cfg.num_layers)]
        self.k = [torch.zeros(s, dtype=dtype, device=device) for s in shapes]
        self.v = [torch.zeros(s, dtype=dtype, device=device) for s in shapes]
        self.max_len = max_len

    def bytes_per_slot(self) -> int:
        return sum(2 * k.shape[1] * k.shape[3] * k.element_size() for k in self.k)


def attention_biases(start, lim, anc, S: int, window: int | None, groups: dict, dtype) -> dict:
    """Additive masks per layer kind: {kind: (1, 1, groups[kind] * T, S)}, 0 where visible (module
    docstring), -inf elsewhere; rows tiled per query head sharing a KV head."""
    keys = torch.arange(S, device=lim.device)[None, :]
    visible = keys < (start + lim)[:, None]                               # (T, S)
    out = {}
    for kind, g in groups.items():
        vis = visible & (keys > (start + anc)[:, None] - window) if kind == "sliding" else visible
        bias = torch.zeros(vis.shape, dtype=dtype, device=lim.device).masked_fill_(~vis, float("-inf"))
        out[kind] = bias.repeat(g, 1)[None, None]
    return out


def layer(x, lw: DGLayerWeights, cfg, k_eq_v: bool, cos, sin, pos, k_cache, v_cache, bias, canvas_rows,
          moe_backend: str = "auto", route_out: list | None = None):
    """One Gemma-4 decoder layer over T new tokens (module docstring). x (1, T, D); cos/sin
    (1, T, hd); pos (T,) slots written; caches (1, Hkv, max_len, hd) updated in place; bias from
    `attention_biases`; canvas_rows (1, T, 1) bool: rows in canvas (decoder) mode. ``route_out``
    (eager only): the router's expert ids (T, k) are appended to it."""
    T = x.shape[1]
    H, hd, Hkv = cfg.num_heads, lw.q_norm.shape[0], k_cache.shape[1]
    eps, off = cfg.rms_eps, cfg.norm_offset
    h = rms_norm(x, lw.ln_in, eps, off)
    proj = F.linear(h, lw.qkv)
    if k_eq_v:
        q, k = proj.split([H * hd, Hkv * hd], dim=-1)
        v = k
    else:
        q, k, v = proj.split([H * hd, Hkv * hd, Hkv * hd], dim=-1)
    q, k, v = q.view(1, T, H, hd), k.view(1, T, Hkv, hd), v.view(1, T, Hkv, hd)
    q, k, v = rms_norm(q, lw.q_norm, eps, off), rms_norm(k, lw.k_norm, eps, off), rms_norm(v, None, eps)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    k_cache.index_copy_(2, pos, k)
    v_cache.index_copy_(2, pos, v)
    S, G = bias.shape[-1], H // Hkv
    qg = q.reshape(1, Hkv, G * T, hd)  # GQA: the G query heads of a KV head stacked as rows
    out = F.scaled_dot_product_attention(qg, k_cache[:, :, :S], v_cache[:, :, :S], attn_mask=bias,
                                         scale=cfg.attn_scale if cfg.attn_scale is not None else hd ** -0.5)
    out = out.reshape(1, H, T, hd).transpose(1, 2).reshape(1, T, H * hd)
    x = x + rms_norm(F.linear(out, lw.o), lw.ln_post_attn, eps, off)
    g, u = F.linear(rms_norm(x, lw.ln_pre_ff, eps, off), lw.gate_up).chunk(2, dim=-1)
    m1 = rms_norm(F.linear(F.gelu(g, approximate="tanh") * u, lw.down), lw.ln_post_ff1, eps, off)
    if route_out is not None:
        route_out.append(route(x.reshape(-1, x.shape[-1]), lw.moe, cfg)[1])
    m2 = moe_mlp(rms_norm(x, lw.ln_pre_ff2, eps, off), lw.moe, cfg, router_input=x, backend=moe_backend)
    m2 = rms_norm(m2, lw.ln_post_ff2, eps, off)
    x = x + rms_norm(m1 + m2, lw.ln_post_ff, eps, off)
    return x * torch.where(canvas_rows, lw.canvas_scalar, lw.scalar)


def forward(w: DGBaked, h: torch.Tensor, start: torch.Tensor, lim: torch.Tensor, anc: torch.Tensor,
            canvas_rows: torch.Tensor, kv: DGStaticKV, S: int, logits_from: int | None = 0,
            layer_fn=layer, route_out: list | None = None) -> torch.Tensor | None:
    """The layers over input embeddings h (1, T, D) at slots start .. start + T - 1.

    start (1,) int64 device tensor; lim, anc (T,) int64 (module docstring); canvas_rows (1, T) bool;
    S static number of cache slots attended. Writes the T keys/values into ``kv``. Returns softcapped
    float32 logits (1, T - logits_from, V) of rows ``logits_from:`` (None: no LM head).
    ``layer_fn``: `layer` or a compiled version; ``route_out``: see `layer` (eager only)."""
    cfg = w.cfg
    T = h.shape[1]
    pos = start + torch.arange(T, device=h.device)
    tabs = {k: (c.index_select(0, pos)[None], s.index_select(0, pos)[None]) for k, (c, s) in w.rope.items()}
    groups = {}
    for i, kind in enumerate(cfg.layer_types):
        groups[kind] = cfg.num_heads // cfg.layer_kv_heads(i)
    biases = attention_biases(start, lim, anc, S, cfg.sliding_window, groups, h.dtype)
    if layer_fn is not layer:  # compiled: S symbolic, so a new cache bucket does not recompile
        for b in biases.values():
            torch._dynamo.maybe_mark_dynamic(b, 3)
    rows = canvas_rows[..., None]
    extra = {} if route_out is None else {"route_out": route_out}
    for i, (lw, kind) in enumerate(zip(w.layers, cfg.layer_types)):
        h = layer_fn(h, lw, cfg, cfg.layer_k_eq_v(i), *tabs[kind], pos, kv.k[i], kv.v[i], biases[kind], rows,
                     w.moe_backend, **extra)
    if logits_from is None:
        return None
    logits = F.linear(rms_norm(h[:, logits_from:], w.norm, cfg.rms_eps, cfg.norm_offset), w.lm_head)
    return soft_cap(logits, cfg.final_logit_softcap)
