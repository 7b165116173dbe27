"""The engine's forward, for every family: baked weights and a graph-safe pass over a static KV cache.

Owns two things:
  * ``bake``: a `Transformer`'s weights in one dtype, laid out for inference -- Q, K and V
    concatenated into one matrix per layer (K = V layers have no V rows) and gate/up into one, so
    each is a single matmul; the tied LM head shares the embedding (no copy). Mixture-of-experts
    layers carry `orl.engine.moe.MoEWeights` and run `orl.engine.moe.moe_mlp` (grouped Triton
    kernels on CUDA, the PyTorch twin elsewhere).
  * ``forward``: new tokens at a device-side offset ``start`` (a (1,) int64 tensor), their keys and
    values written into the static cache in place, attention over a fixed prefix of ``S`` cache
    slots with a length mask. Nothing here reads a device value on the host or changes shape with
    the amount cached, so the same call can be captured once in a CUDA graph and replayed for
    every block.
The families are options of one layer, as in `orl.model.layers.DecoderLayer` (mirrored op for op):
  SDAR / Qwen3      h = h + attn(n_in(h));  h = h + mlp(n_post(h))             (dense)
  LLaDA-2.1         the same with mlp = routed + shared experts from ``first_dense_layers`` on
  DiffusionGemma    h = h + n_pa(attn(n_in(h)))                                 sandwich norms, q/k/v
                    h = h + n_pf(n_pf1(mlp(n_pre(h))) + n_pf2(experts(n_pre2(h), router(h))))
                    h = h * s    s = the encoder scalar on committed rows, the canvas one on canvas rows
                    (docs/diffusiongemma-spec.md 4-7); per layer type ("sliding" / "full") the head
                    dim, KV heads and RoPE table differ, so the cache is per layer.
Visibility, per new token i (``lim`` from the runtime; ``anc`` the first slot of i's mutually
visible group relative to ``start``: i itself for committed text, the canvas start for a canvas row):
  full layers      slot j visible iff j < start + lim[i]
  sliding layers   ... and j > start + anc[i] - W
``lim`` encodes the layout: a canvas row sees everything up to the end of the canvas; a committed
block row sees its whole block (block-causal) or the slots up to itself (causal); prompt rows are
causal. This is the visibility `orl.model.masks` gives the reference decoder, and for sliding
layers `orl.model.transformer.sliding_window_mask` (tested against both).
Does not own: what is decoded (`orl.engine.runtime`, `orl.engine.rules`), CUDA graphs
(`orl.engine.graphs`), the Triton twin of this forward (`orl.kernels.layers`), the numerics of
norms/RoPE/pathway (those of `orl.model`, reused or mirrored op for op).
Shapes: T new tokens, S visible cache slots, D hidden, H heads, E experts, V vocab.
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
    one compiled graph serves every layer of a kind). Fields a family does not use are None."""

    ln1: torch.Tensor                 # (D,) input_layernorm
    qkv: torch.Tensor                 # ((H + 2 Hkv) hd, D) = [q; k; v], or ((H + Hkv) hd, D) on K = V layers
    qkv_bias: torch.Tensor | None
    q_norm: torch.Tensor | None       # (hd,)
    k_norm: torch.Tensor | None
    o: torch.Tensor                   # (D, H hd)
    ln2: torch.Tensor                 # (D,) the norm before the MLP (Gemma: pre_feedforward_layernorm)
    gate_up: torch.Tensor | None      # (2I, D) = [gate_proj; up_proj]; None in a MoE-only layer
    down: torch.Tensor | None         # (D, I)
    moe: MoEWeights | None = None     # routed (+ shared) experts
    ln_post_attn: torch.Tensor | None = None  # Gemma sandwich: post_attention_layernorm
    ln_post_ff: torch.Tensor | None = None    # Gemma sandwich: on the MLP output (both branches)
    ln_post_mlp: torch.Tensor | None = None   # Gemma-4 parallel: dense branch post-norm
    ln_pre_moe: torch.Tensor | None = None    # Gemma-4 parallel: experts branch pre-norm
    ln_post_moe: torch.Tensor | None = None   # Gemma-4 parallel: experts branch post-norm
    scalar: torch.Tensor | None = None        # (1,) layer scalar of committed (encoder) rows
    canvas_scalar: torch.Tensor | None = None  # (1,) layer scalar of canvas (decoder) rows


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
    rope: dict                        # layer kind -> (cos, sin) tables (max_len, hd of that kind)
    moe_backend: str = "torch"        # "triton" or "torch" (`orl.engine.moe.moe_mlp`), resolved at bake
    tp_reduce: object = None          # tensor parallel (`orl.engine.tp.shard`): in-place sum over ranks

    @property
    def rope_cos(self) -> torch.Tensor:
        return self.rope["full"][0]

    @property
    def rope_sin(self) -> torch.Tensor:
        return self.rope["full"][1]

    def weight_bytes(self, route_ids: list | None = None) -> int:
        """Bytes one forward reads from weights, each once: layers, final norm, LM head, the
        residual pathway (when the model has one). MoE layers count every expert, or with
        ``route_ids`` (one ids tensor per MoE layer, in order, as `forward`'s ``route_out``
        collects them) only the experts those ids touch: the floor of that forward. The embedding
        rows a forward gathers are negligible and not counted, nor a soft embedding's pass over E."""
        n = self.lm_head.numel() + self.norm.numel()
        if self.pathway is not None:
            n += sum(p.numel() for p in self.pathway.parameters())
        ids = iter(route_ids or [])
        moe = 0
        for lw in self.layers:
            n += sum(t.numel() for name, t in lw._asdict().items() if name != "moe" and t is not None)
            if lw.moe is not None:
                moe += moe_bytes(lw.moe, next(ids) if route_ids is not None else None)
        return n * self.lm_head.element_size() + moe


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


def _layer_weights(layer, cfg, cast) -> LayerWeights:
    a = layer.self_attn
    mats = [a.q_proj.weight, a.k_proj.weight] + ([] if a.v_proj is None else [a.v_proj.weight])
    bias = None
    if a.q_proj.bias is not None:
        bias = cast(torch.cat([a.q_proj.bias, a.k_proj.bias] + ([] if a.v_proj is None else [a.v_proj.bias])))
    parallel = getattr(layer, "parallel", False)
    dense = layer.mlp if not isinstance(layer.mlp, MoE) else None
    moe = layer.moe if parallel else (layer.mlp if dense is None else None)
    opt = lambda name: cast(getattr(layer, name).weight) if hasattr(layer, name) else None  # noqa: E731
    sandwich = cfg.sandwich_norm
    return LayerWeights(
        ln1=cast(layer.input_layernorm.weight), qkv=cast(torch.cat(mats)), qkv_bias=bias,
        q_norm=cast(a.q_norm.weight) if cfg.qk_norm else None, k_norm=cast(a.k_norm.weight) if cfg.qk_norm else None,
        o=cast(a.o_proj.weight),
        ln2=opt("pre_feedforward_layernorm") if sandwich else cast(layer.post_attention_layernorm.weight),
        gate_up=None if dense is None else cast(torch.cat([dense.gate_proj.weight, dense.up_proj.weight])),
        down=None if dense is None else cast(dense.down_proj.weight),
        moe=bake_moe(moe, cast) if moe is not None else None,
        ln_post_attn=cast(layer.post_attention_layernorm.weight) if sandwich else None,
        ln_post_ff=opt("post_feedforward_layernorm") if sandwich else None,
        ln_post_mlp=opt("post_feedforward_layernorm_1"), ln_pre_moe=opt("pre_feedforward_layernorm_2"),
        ln_post_moe=opt("post_feedforward_layernorm_2"),
        scalar=cast(layer.layer_scalar) if cfg.layer_scalar else None,
        canvas_scalar=cast(layer.canvas_layer_scalar) if cfg.layer_scalar else None)


@torch.no_grad()
def bake(model, dtype: torch.dtype | None = None, max_len: int = 4096, moe_backend: str = "auto") -> Baked:
    """Inference weights of ``model`` in ``dtype`` (default: the model's), on the model's device.
    Same-dtype tensors are shared with the model, not copied (the fused QKV and gate/up matrices are
    the only copies). ``moe_backend``: see `orl.engine.moe.moe_mlp` ("auto": Triton on CUDA when importable)."""
    cfg = model.config
    dtype = dtype or model.model.embed_tokens.weight.dtype
    cast = lambda t: None if t is None else t.detach().to(dtype).contiguous()  # noqa: E731
    layers = [_layer_weights(layer, cfg, cast) for layer in model.model.layers]
    embed, lm_head, pathway = bake_io(model, cast, dtype)
    pos = torch.arange(max_len, device=embed.device)[None]
    rope = {}
    for kind in sorted(set(cfg.layer_types)):
        cos, sin = rope_cos_sin(pos, *cfg.layer_rope(kind), dtype=dtype)
        rope[kind] = (cos[0], sin[0])
    return Baked(cfg, dtype, embed, lm_head, cast(model.model.norm.weight), layers, pathway, rope,
                 pick_backend(moe_backend, embed.device, dtype))


def _copy_into(dst, src) -> None:
    if isinstance(dst, torch.Tensor):
        if dst.data_ptr() != src.data_ptr():
            dst.copy_(src)
    elif dst is not None:  # a NamedTuple of tensors (LayerWeights, MoEWeights)
        for a, b in zip(dst, src):
            _copy_into(a, b)


@torch.no_grad()
def refresh(w: Baked, model) -> None:
    """Copy ``model``'s current weights into the baked ``w`` in place, one layer at a time (the
    tensors keep their addresses, so captured CUDA graphs read the new weights; the extra memory is
    one layer's). The ORL loop calls it after every update (`orl.engine.runtime.Runtime.load_weights`)."""
    if w.tp_reduce is not None:
        raise NotImplementedError("refresh a tensor-parallel runtime by building it again")
    cast = lambda t: None if t is None else t.detach().to(w.dtype).contiguous()  # noqa: E731
    for lw, layer in zip(w.layers, model.model.layers):
        _copy_into(lw, _layer_weights(layer, w.cfg, cast))
    embed, lm_head, _ = w.embed, w.lm_head, None
    _copy_into(embed, cast(model.model.embed_tokens.weight))
    if lm_head is not embed:
        _copy_into(lm_head, cast(model.lm_head.weight))
    _copy_into(w.norm, cast(model.model.norm.weight))
    if w.pathway is not None:
        w.pathway.load_state_dict({k: v.to(w.dtype) for k, v in model.residual_pathway.state_dict().items()})


class StaticKV:
    """Per-layer K/V buffers (B, Hkv_l, max_len, hd_l) for B rows, allocated once (shapes per layer
    type); which slots are valid is the caller's business (a device-side length), never this object's."""

    def __init__(self, cfg, max_len: int, dtype: torch.dtype, device, batch: int = 1):
        shapes = [(batch, cfg.layer_kv_heads(i), max_len, cfg.layer_head_dim(i)) for i in range(cfg.num_layers)]
        self.k = [torch.zeros(s, dtype=dtype, device=device) for s in shapes]
        self.v = [torch.zeros(s, dtype=dtype, device=device) for s in shapes]
        self.max_len = max_len

    def rows(self, lo: int, hi: int) -> "StaticKV":
        """A view of rows lo:hi (writes land in this cache)."""
        view = object.__new__(StaticKV)
        view.k, view.v, view.max_len = [k[lo:hi] for k in self.k], [v[lo:hi] for v in self.v], self.max_len
        return view

    def broadcast_prefix(self, n: int) -> None:
        """Copy row 0's first ``n`` slots into every other row (a prompt shared by the batch, prefilled once)."""
        for t in self.k + self.v:
            t[1:, :, :n].copy_(t[:1, :, :n].expand(t.shape[0] - 1, -1, -1, -1))

    def bytes_per_slot(self) -> int:
        """Bytes of one slot of one row."""
        return sum(2 * k.shape[1] * k.shape[3] * k.element_size() for k in self.k)


# ------------------------------------------------------------------------------ numerics
def rms_norm(x: torch.Tensor, w: torch.Tensor | None, eps: float, offset: float = 0.0) -> torch.Tensor:
    """`orl.model.layers.RMSNorm.forward`, op for op (float32 inside, cast back)."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if w is not None:
        y = y * (offset + w.float())
    return y.to(x.dtype)


def embed(w: Baked, tokens: torch.Tensor, residual=None, where=None, weight=None) -> torch.Tensor:
    """`Transformer.embed`: c * E[tokens] mixed with the residual pathway. tokens (B, T) -> (B, T, D)."""
    e = F.embedding(tokens, w.embed)
    if w.cfg.embed_scale != 1.0:
        e = e * torch.tensor(w.cfg.embed_scale, dtype=torch.float32).to(e.dtype)
    return combine(e, w.cfg, w.pathway, residual, where, weight)


def soft_embed(w: Baked, probs: torch.Tensor) -> torch.Tensor:
    """`Transformer.soft_embed`: z = c * probs @ E, probs (B, K, V) -> (B, K, D)."""
    z = probs.to(w.embed.dtype) @ w.embed
    if w.cfg.embed_scale != 1.0:
        z = z * torch.tensor(w.cfg.embed_scale, dtype=torch.float32).to(z.dtype)
    return z


def attention_biases(start, lim, anc, S: int, window: int | None, groups: dict, dtype) -> dict:
    """Additive masks per layer kind: {kind: (1, 1, groups[kind] * T, S)}, 0 where visible (module
    docstring), -inf elsewhere; rows tiled per query head sharing a KV head. ``anc`` (T,) is read
    by sliding layers only (None without any)."""
    keys = torch.arange(S, device=lim.device)[None, :]
    visible = keys < (start + lim)[:, None]                               # (T, S)
    out = {}
    for kind, g in groups.items():
        vis = visible & (keys > (start + anc)[:, None] - window) if kind == "sliding" else visible
        bias = torch.zeros(vis.shape, dtype=dtype, device=lim.device).masked_fill_(~vis, float("-inf"))
        out[kind] = bias.repeat(g, 1)[None, None]
    return out


def attention_bias(start: torch.Tensor, lim: torch.Tensor, S: int, groups: int, dtype) -> torch.Tensor:
    """The full-attention mask of `attention_biases` (1, 1, groups * T, S) (kernel tests, benchmarks)."""
    return attention_biases(start, lim, None, S, None, {"full": groups}, dtype)["full"]


def layer(x, lw: LayerWeights, cfg, cos, sin, pos, k_cache, v_cache, bias, canvas_rows=None,
          moe_backend: str = "torch", route_out: list | None = None, reduce=None):
    """One decoder layer over T new tokens of B rows (module docstring). x (B, T, D); cos/sin (1, T,
    hd); pos (T,) absolute slots written (the same for every row); k_cache/v_cache (B, Hkv, max_len,
    hd) updated in place; bias from `attention_biases` (its last dim is S, the slots attended; one
    mask for every row); canvas_rows (B, T, 1) or (1, T, 1) bool: rows in canvas (decoder) mode,
    read only by layer scalars. Mirrors `orl.model.layers.DecoderLayer`.
    ``route_out`` (eager only): a MoE layer appends its router's expert ids (T, k) to it (for
    `Baked.weight_bytes`). ``reduce`` (tensor parallel, `orl.engine.tp`): sums the row-parallel
    o / down outputs over ranks."""
    B, T = x.shape[0], x.shape[1]
    H, Hkv, hd = cfg.num_heads, k_cache.shape[1], k_cache.shape[3]
    eps, off = cfg.rms_eps, cfg.norm_offset
    h = rms_norm(x, lw.ln1, eps, off)
    proj = F.linear(h, lw.qkv, lw.qkv_bias)
    if proj.shape[-1] == (H + Hkv) * hd:  # K = V layer (Gemma-4 full attention): V is the raw k projection
        q, k = proj.split([H * hd, Hkv * hd], dim=-1)
        v = k
    else:
        q, k, v = proj.split([H * hd, Hkv * hd, Hkv * hd], dim=-1)
    q, k, v = q.view(B, T, H, hd), k.view(B, T, Hkv, hd), v.view(B, T, Hkv, hd)
    if lw.q_norm is not None:
        q, k = rms_norm(q, lw.q_norm, eps, off), rms_norm(k, lw.k_norm, eps, off)
    if cfg.v_norm:
        v = rms_norm(v, None, eps)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    k_cache.index_copy_(2, pos, k)
    v_cache.index_copy_(2, pos, v)
    S, G = bias.shape[-1], H // Hkv
    # GQA without expanding K/V: the G query heads of a KV head become G*T rows of one head
    qg = q.reshape(B, Hkv, G * T, hd)
    scale = cfg.attn_scale if cfg.attn_scale is not None else hd ** -0.5
    out = F.scaled_dot_product_attention(qg, k_cache[:, :, :S], v_cache[:, :, :S], attn_mask=bias, scale=scale)
    out = out.reshape(B, H, T, hd).transpose(1, 2).reshape(B, T, H * hd)
    y = F.linear(out, lw.o)
    if reduce is not None:
        y = reduce(y)
    if lw.ln_post_attn is not None:
        y = rms_norm(y, lw.ln_post_attn, eps, off)
    x = x + y
    h = rms_norm(x, lw.ln2, eps, off)
    y = None
    if lw.gate_up is not None:
        g, u = F.linear(h, lw.gate_up).chunk(2, dim=-1)
        act = F.silu(g) if cfg.hidden_act == "silu" else F.gelu(g, approximate="tanh")
        y = F.linear(act * u, lw.down)
        if reduce is not None:
            y = reduce(y)
    if lw.moe is not None:
        if lw.ln_pre_moe is None:  # the experts are the MLP (LLaDA): the router reads the normed stream
            if route_out is not None:
                route_out.append(route(h.reshape(-1, h.shape[-1]), lw.moe, cfg)[1])
            y = moe_mlp(h, lw.moe, cfg, backend=moe_backend)
        else:  # Gemma-4 parallel branches: both read x; the router reads it raw
            m1 = rms_norm(y, lw.ln_post_mlp, eps, off)
            if route_out is not None:
                route_out.append(route(x.reshape(-1, x.shape[-1]), lw.moe, cfg)[1])
            m2 = moe_mlp(rms_norm(x, lw.ln_pre_moe, eps, off), lw.moe, cfg, router_input=x, backend=moe_backend)
            y = m1 + rms_norm(m2, lw.ln_post_moe, eps, off)
    if lw.ln_post_ff is not None:
        y = rms_norm(y, lw.ln_post_ff, eps, off)
    x = x + y
    if lw.scalar is not None:
        x = x * (lw.scalar if canvas_rows is None else torch.where(canvas_rows, lw.canvas_scalar, lw.scalar))
    return x


def forward(w: Baked, h: torch.Tensor, start: torch.Tensor, lim: torch.Tensor, kv: StaticKV, S: int,
            logits_from: int | None = 0, layer_fn=layer, route_out: list | None = None, kernels=None,
            canvas_rows: torch.Tensor | None = None, anc: torch.Tensor | None = None,
            pad: torch.Tensor | None = None) -> torch.Tensor | None:
    """Run the layers over input embeddings h (B, T, D) placed at slots start .. start + T - 1 of
    every row (B = the cache's rows; all rows share ``start``, ``lim`` and the mask).

    start (1,) int64 device tensor; lim (T,) int64 (see module docstring); S static number of cache
    slots attended (>= start + max(lim)). Writes the T keys/values into ``kv``. Returns logits
    (1, T - logits_from, V) of rows ``logits_from:`` (softcapped float32 where the config caps;
    None: no LM head, e.g. a commit pass). ``canvas_rows`` (B, T) or (1, T) bool: canvas (decoder) rows, for
    layer scalars (None: all committed); ``anc`` (T,) int64: sliding-window anchors (needed only by
    sliding layers). ``layer_fn`` is `layer` or a compiled version of it. ``route_out``: see
    `layer` (eager only). ``kernels``: an `orl.kernels.layers.TritonKernels` runs the whole pass
    instead (opt-in fast twin, dense layers). ``pad`` (B,) int64: rows whose prompt is left-padded
    by that many slots -- their RoPE positions start after the padding and no query sees a padded
    slot but a padded query itself (so its row stays finite); None: no padding.
    """
    if kernels is not None:
        if h.shape[0] != 1:
            raise NotImplementedError("the Triton layer kernels run one row (batch 1); use kernels='torch' for batches")
        return kernels.forward(h, start, lim, kv, S, logits_from)
    cfg = w.cfg
    T = h.shape[1]
    pos = start + torch.arange(T, device=h.device)
    groups = {kind: cfg.num_heads // kv.k[i].shape[1] for i, kind in enumerate(cfg.layer_types)}
    if "sliding" in groups and anc is None:
        raise ValueError("sliding-window layers need the window anchors ``anc``")
    biases = attention_biases(start, lim, anc, S, cfg.sliding_window, groups, h.dtype)
    if pad is None:
        tabs = {k: (c.index_select(0, pos)[None], s.index_select(0, pos)[None]) for k, (c, s) in w.rope.items()}
    else:
        if "sliding" in groups:
            raise NotImplementedError("left-padded rows are not supported with sliding-window layers")
        B = h.shape[0]
        rpos = (pos[None] - pad[:, None]).clamp_min(0).reshape(-1)  # (B * T,) positions after the padding
        tabs = {k: (c.index_select(0, rpos).view(B, T, -1), s.index_select(0, rpos).view(B, T, -1))
                for k, (c, s) in w.rope.items()}
        keys = torch.arange(S, device=h.device)
        ok = (keys[None, None] >= pad[:, None, None]) | (keys[None, None] == pos[None, :, None])  # (B, T, S)
        extra_bias = torch.zeros(ok.shape, dtype=h.dtype, device=h.device).masked_fill_(~ok, float("-inf"))
        biases = {k: b + extra_bias.repeat(1, groups[k], 1)[:, None] for k, b in biases.items()}
    if layer_fn is not layer:  # compiled: S symbolic, so a new cache bucket does not recompile
        for b in biases.values():
            torch._dynamo.maybe_mark_dynamic(b, 3)
    rows = None if canvas_rows is None or not cfg.layer_scalar else canvas_rows[..., None]
    extra = {} if route_out is None else {"route_out": route_out}
    if w.tp_reduce is not None:
        extra["reduce"] = w.tp_reduce
    for i, (lw, kind) in enumerate(zip(w.layers, cfg.layer_types)):
        h = layer_fn(h, lw, cfg, *tabs[kind], pos, kv.k[i], kv.v[i], biases[kind], rows,
                     moe_backend=w.moe_backend, **extra)
    if logits_from is None:
        return None
    logits = F.linear(rms_norm(h[:, logits_from:], w.norm, cfg.rms_eps, cfg.norm_offset), w.lm_head)
    return soft_cap(logits, cfg.final_logit_softcap)
