"""Building blocks of the one transformer: norms, RoPE, attention, dense and routed MLPs.

Owns the per-layer numerics for every family. Module attribute names mirror the Hugging Face
Qwen3 checkpoints (`self_attn.q_proj`, `mlp.gate_proj`, ...) so that Qwen3/SDAR weights load by
name; other families are mapped in `orl.model.checkpoint`.
Does not own: masks (built by `orl.model.masks` and passed in), the KV cache layout
(`orl.model.cache`), the residual pathway (`orl.model.pathway`).

Shapes: B batch, T new tokens, S visible keys (cache + new), D hidden, H heads, V vocab.
"""
from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig


class RMSNorm(nn.Module):
    """y = x / rms(x) * (offset + w), computed in float32 (Qwen3 and Gemma convention)."""

    def __init__(self, dim: int, eps: float, offset: float = 0.0, with_scale: bool = True):
        super().__init__()
        self.eps, self.offset = eps, offset
        self.weight = nn.Parameter(torch.ones(dim) if offset == 0.0 else torch.zeros(dim)) if with_scale else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.weight is not None:
            y = y * (self.offset + self.weight.float())
        return y.to(x.dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, rotary_dim: int | None = None,
                 dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin (B, T, head_dim) for absolute ``positions`` (B, T).

    ``rotary_dim`` < head_dim gives partial rotation in the "proportional" form (HF Gemma 4
    ``rope_type="proportional"``): frequencies are spaced as for the full head_dim,
    inv_freq[i] = theta^(-2i/head_dim), and only the first rotary_dim/2 pairs rotate (the others get
    frequency 0, i.e. cos 1, sin 0). With rotate-half that rotates dims [0, n) and [hd/2, hd/2 + n),
    n = rotary_dim/2 -- not the first rotary_dim contiguous dims (NeoX partial rotary).
    """
    rotary_dim = head_dim if rotary_dim is None else rotary_dim
    exponent = torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim
    inv_freq = 1.0 / (theta ** exponent)
    inv_freq[rotary_dim // 2:] = 0.0
    freqs = positions.float()[..., None] * inv_freq  # (B, T, hd/2)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, H, T, hd) rotated with rotate-half convention; cos/sin (B, T, hd)."""
    cos, sin = cos[:, None], sin[:, None]
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Attention(nn.Module):
    """GQA attention with optional QK-norm (and scale-free V-norm), over cache + new tokens.

    Head dim and KV heads come from the layer's type (`ModelConfig.layer_head_dim`); a "K = V"
    layer (Gemma 4 full attention) has no v_proj and takes V from the raw k_proj output, before
    k_norm and RoPE.
    """

    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.cfg, self.layer_idx = cfg, layer_idx
        D, H = cfg.hidden_size, cfg.num_heads
        self.Hkv, self.hd = Hkv, hd = cfg.layer_kv_heads(layer_idx), cfg.layer_head_dim(layer_idx)
        self.q_proj = nn.Linear(D, H * hd, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(D, Hkv * hd, bias=cfg.attention_bias)
        self.v_proj = None if cfg.layer_k_eq_v(layer_idx) else nn.Linear(D, Hkv * hd, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(H * hd, D, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(hd, cfg.rms_eps, cfg.norm_offset)
            self.k_norm = RMSNorm(hd, cfg.rms_eps, cfg.norm_offset)
        self.v_norm = RMSNorm(hd, cfg.rms_eps, with_scale=False) if cfg.v_norm else None
        self.scale = cfg.attn_scale if cfg.attn_scale is not None else hd ** -0.5

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor,
                cache=None, store_kv: bool = False) -> torch.Tensor:
        """x (B, T, D); cos/sin (B, T, hd); mask (B|1, T, S) bool, True = visible, or a FlexAttention
        BlockMask or an `orl.kernels.staircase.StaircaseMask` of the same visibility (no cache);
        returns (B, T, D)."""
        B, T, _ = x.shape
        H, Hkv, hd = self.cfg.num_heads, self.Hkv, self.hd
        q = self.q_proj(x).view(B, T, H, hd)
        k = self.k_proj(x).view(B, T, Hkv, hd)
        v = k if self.v_proj is None else self.v_proj(x).view(B, T, Hkv, hd)
        if self.cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.v_norm is not None:
            v = self.v_norm(v)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            k, v = cache.update(self.layer_idx, k, v, store=store_kv)
        if isinstance(mask, torch.Tensor):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None], scale=self.scale,
                                                 enable_gqa=H != Hkv)
        elif type(mask).__name__ == "StaircaseMask":  # `orl.kernels.staircase`: Triton, invisible tiles skipped
            from ..kernels.staircase import staircase_attention  # noqa: PLC0415
            dev = q.device.type  # one dtype for the kernel: autocast's (as SDPA would cast), else q's
            dt = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else q.dtype
            out = staircase_attention(q.to(dt), k.to(dt), v.to(dt), mask, self.scale)
        else:  # a FlexAttention BlockMask (`orl.model.masks.staircase_block_mask`): invisible tiles skipped
            out = _flex(q.device.type)(q, k, v, block_mask=mask, scale=self.scale, enable_gqa=H != Hkv)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, H * hd))


@functools.cache
def _flex(device_type: str):
    """FlexAttention, compiled once for CUDA tensors (eager FlexAttention materialises every score;
    compiled, it runs one fused kernel that skips the BlockMask's empty tiles; shapes turn dynamic on
    a second T). On the CPU (forward only: tests) the eager function."""
    from torch.nn.attention.flex_attention import flex_attention  # noqa: PLC0415
    return torch.compile(flex_attention) if device_type == "cuda" else flex_attention


def _act(name: str):
    if name == "silu":
        return F.silu
    if name == "gelu_tanh":
        return lambda x: F.gelu(x, approximate="tanh")
    raise ValueError(f"unknown hidden_act {name!r}; use 'silu' or 'gelu_tanh'")


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)): SwiGLU (silu) or GeGLU (gelu_tanh)."""

    def __init__(self, dim: int, inter: int, act: str):
        super().__init__()
        self.gate_proj = nn.Linear(dim, inter, bias=False)
        self.up_proj = nn.Linear(dim, inter, bias=False)
        self.down_proj = nn.Linear(inter, dim, bias=False)
        self.act = _act(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


def group_limited_route(logits: torch.Tensor, k: int, *, score: str = "sigmoid", bias: torch.Tensor | None = None,
                        groups: int = 1, topk_groups: int = 1, norm: bool = True,
                        scaling: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The LLaDA-2.x / DeepSeek-V3 ("noaux_tc") gate on router logits (N, E): weights (N, k) in the
    logits' dtype and expert ids (N, k), in descending order of the choice.

      s      = sigmoid(logits)  (``score`` "softmax": softmax(logits))
      c      = s + bias                                  bias (E,): the choice only, never the weights
      group  = sum of the two best c of each of ``groups`` equal groups; all but the best
               ``topk_groups`` groups are masked out (c = -inf)
      ids    = top-k of c;  w = s[ids], / (sum + 1e-20) if ``norm``, x ``scaling``
    """
    N, E = logits.shape
    s = torch.sigmoid(logits) if score == "sigmoid" else torch.softmax(logits, dim=-1)
    c = s if bias is None else s + bias.to(s.dtype)
    if topk_groups < groups:
        per = E // groups
        top = c.view(N, groups, per).topk(min(2, per), dim=-1).values.sum(-1)  # (N, groups)
        keep = torch.zeros_like(top, dtype=torch.bool).scatter_(1, top.topk(topk_groups, dim=-1).indices, True)
        c = c.masked_fill(~keep.repeat_interleave(per, dim=1), float("-inf"))
    idx = c.topk(k, dim=-1).indices
    w = s.gather(1, idx)
    if norm:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    if scaling != 1.0:
        w = w * scaling
    return w, idx


class MoE(nn.Module):
    """Routed experts (softmax top-k router with optional renormalisation, or LLaDA-2.x's gate) plus
    shared experts.

    Expert weights are stacked: ``gate_up_proj`` (E, 2I, D) with rows [gate; up], ``down_proj``
    (E, D, I). Tokens are grouped per selected expert, so compute scales with the experts a batch
    actually touches. With ``cfg.router_scale`` (Gemma 4) the router input is normalised without
    weight, times ``router_scale`` (D,) and D^-1/2, and the renormalised top-k weights are
    multiplied by ``per_expert_scale`` (E,); the caller passes the raw residual as ``router_input``.
    A config with another router rule (``cfg.router_plain`` False: LLaDA-2.x's sigmoid gate, its
    ``expert_bias`` (E,) buffer, group-limited choice, scaling) routes by `group_limited_route` on
    logits computed in float32 (at least: float64 stays), as the published gate does.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        D, I, E = cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts
        self.top_k, self.norm_topk = cfg.num_experts_per_tok, cfg.router_norm_topk
        self.gate = nn.Linear(D, E, bias=False)
        self.gate_up_proj = nn.Parameter(torch.empty(E, 2 * I, D))
        self.down_proj = nn.Parameter(torch.empty(E, D, I))
        nn.init.normal_(self.gate_up_proj, std=D ** -0.5)
        nn.init.normal_(self.down_proj, std=I ** -0.5)
        self.act = _act(cfg.hidden_act)
        self.shared_experts = (GatedMLP(D, I * cfg.num_shared_experts, cfg.hidden_act)
                               if cfg.num_shared_experts else None)
        self.gemma = cfg.router_scale
        if self.gemma:
            self.router_norm = RMSNorm(D, cfg.rms_eps, with_scale=False)
            self.router_scale = nn.Parameter(torch.ones(D))
            self.per_expert_scale = nn.Parameter(torch.ones(E))
        self.plain = cfg.router_plain
        self.rule = dict(score=cfg.router_score, groups=cfg.router_groups, topk_groups=cfg.router_topk_groups,
                         norm=cfg.router_norm_topk, scaling=cfg.router_scaling)
        # a buffer, not a parameter: the published gate adjusts it outside the gradient (aux-loss-free balancing)
        self.register_buffer("expert_bias", torch.zeros(E) if cfg.router_bias else None)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (N, D) -> expert weights (N, k) float32 (float64 for a float64 model with a non-plain
        router) and expert ids (N, k)."""
        if not self.plain:
            dt = torch.promote_types(x.dtype, torch.float32)
            logits = F.linear(x.to(dt), self.gate.weight.to(dt))
            return group_limited_route(logits, self.top_k, bias=self.expert_bias, **self.rule)
        if self.gemma:
            x = self.router_norm(x) * self.router_scale * x.shape[-1] ** -0.5
        probs = torch.softmax(self.gate(x).float(), dim=-1)
        w, idx = probs.topk(self.top_k, dim=-1)  # (N, k)
        if self.norm_topk:
            w = w / w.sum(-1, keepdim=True)
        if self.gemma:
            w = w * self.per_expert_scale[idx]
        return w, idx

    def forward(self, x: torch.Tensor, router_input: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T, D) expert input; router_input (B, T, D) (None: x). Returns (B, T, D).

        The (token, expert) assignments are sorted by expert once (stable: within an expert, tokens
        keep their order), so each expert's rows are one contiguous slice. On CUDA in bfloat16 the
        slices run as grouped GEMMs (``torch._grouped_mm``, forward and backward: 3 launches a layer
        instead of 3 per touched expert, no host sync); elsewhere one GEMM pair per touched expert
        (one host sync a layer for the counts). Either way the weighted outputs are summed into the
        tokens in one ``index_add_``, in ascending expert order per token as before.
        """
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        w, idx = self.route(x2 if router_input is None else router_input.reshape(-1, shape[-1]))
        k = idx.shape[-1]
        order = idx.reshape(-1).argsort(stable=True)
        token = order // k
        xs = x2[token]  # (N k, D): assignments grouped by expert
        counts = torch.bincount(idx.reshape(-1), minlength=self.gate_up_proj.shape[0])
        cdt = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else x.dtype
        if _grouped_mm_ok(xs, cdt):
            offs = counts.cumsum(0).to(torch.int32)
            xs = xs.to(cdt)
            g, u = torch._grouped_mm(xs, self.gate_up_proj.to(cdt).transpose(-2, -1), offs=offs).chunk(2, dim=-1)
            y = torch._grouped_mm(self.act(g) * u, self.down_proj.to(cdt).transpose(-2, -1), offs=offs)
        else:
            parts, start = [], 0
            for e, n in enumerate(counts.tolist()):
                if n:
                    g, u = F.linear(xs[start:start + n], self.gate_up_proj[e]).chunk(2, dim=-1)
                    parts.append(F.linear(self.act(g) * u, self.down_proj[e]))
                    start += n
            y = torch.cat(parts) if parts else xs.new_zeros(0, shape[-1])
        ws = w.reshape(-1)[order, None]
        # Gemma 4 weighs in float32 and casts the product (HF); LLaDA path casts w first
        y = (y * ws).to(y.dtype) if self.gemma else y * ws.to(y.dtype)
        out = torch.zeros_like(x2).index_add_(0, token, y.to(x2.dtype))  # under autocast y is bf16, the stream float32
        if self.shared_experts is not None:
            out = out + self.shared_experts(x2)
        return out.view(shape)


def _grouped_mm_ok(xs: torch.Tensor, dtype: torch.dtype) -> bool:
    """Grouped GEMMs: CUDA, bfloat16, and a torch that has them (their CPU backward fails on an
    empty group, so the CPU keeps the per-expert loop)."""
    return (xs.is_cuda and dtype == torch.bfloat16 and hasattr(torch, "_grouped_mm")
            and os.environ.get("ORL_MOE_GROUPED", "1") != "0")


class DecoderLayer(nn.Module):
    """Pre-norm block; optional Gemma sandwich norms, Gemma-4 parallel dense MLP + experts, and a
    per-layer scalar on the whole stream. Gemma 4 (docs/diffusiongemma-spec.md 4):
      h = h + n_pa(attn(n_in(h)))
      h = h + n_pf(n_pf1(mlp(n_pre(h))) + n_pf2(experts(n_pre2(h), router(h))))
      h = h * s        s = ``layer_scalar`` (clean / encoder mode) or ``canvas_layer_scalar``
                       (canvas / decoder mode, where ``canvas`` is True); HF keeps one per mode.
    """

    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.cfg = cfg
        self.self_attn = Attention(cfg, layer_idx)
        moe = cfg.is_moe and layer_idx >= cfg.first_dense_layers
        self.parallel = moe and cfg.parallel_dense_mlp
        if self.parallel:
            self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act)
            self.moe = MoE(cfg)
        else:
            self.mlp = MoE(cfg) if moe else GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act)
        norm = lambda: RMSNorm(cfg.hidden_size, cfg.rms_eps, cfg.norm_offset)  # noqa: E731
        self.input_layernorm, self.post_attention_layernorm = norm(), norm()
        if cfg.sandwich_norm:
            self.pre_feedforward_layernorm, self.post_feedforward_layernorm = norm(), norm()
        if self.parallel:
            self.post_feedforward_layernorm_1 = norm()
            self.pre_feedforward_layernorm_2, self.post_feedforward_layernorm_2 = norm(), norm()
        if cfg.layer_scalar:
            self.register_buffer("layer_scalar", torch.ones(1))
            self.register_buffer("canvas_layer_scalar", torch.ones(1))

    def forward(self, x, cos, sin, mask, cache=None, store_kv=False, canvas=None):
        """x (B, T, D); canvas (B, T) bool or None: tokens in canvas (decoder) mode."""
        if self.cfg.sandwich_norm:  # Gemma: norm -> attn -> norm -> add; norm -> mlp -> norm -> add
            x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), cos, sin, mask, cache, store_kv))
            if self.parallel:  # both branches read the same residual x; the router reads it raw
                m1 = self.post_feedforward_layernorm_1(self.mlp(self.pre_feedforward_layernorm(x)))
                m2 = self.post_feedforward_layernorm_2(self.moe(self.pre_feedforward_layernorm_2(x), router_input=x))
                x = x + self.post_feedforward_layernorm(m1 + m2)
            else:
                x = x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
        else:
            x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache, store_kv)
            x = x + self.mlp(self.post_attention_layernorm(x))
        if self.cfg.layer_scalar:
            if canvas is None:
                return x * self.layer_scalar
            return x * torch.where(canvas[..., None], self.canvas_layer_scalar, self.layer_scalar)
        return x


def init_weights(module: nn.Module, std: float = 0.02) -> None:
    """Normal(0, std) for linear/embedding weights, zeros for biases (HF convention)."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=std)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)


def soft_cap(x: torch.Tensor, cap: float | None) -> torch.Tensor:
    """cap * tanh(x / cap) in float32 (HF Gemma casts the logits first); identity for cap None."""
    return x if cap is None else torch.tanh(x.float() / cap) * cap


__all__ = ["RMSNorm", "Attention", "GatedMLP", "MoE", "group_limited_route", "DecoderLayer", "rope_cos_sin",
           "apply_rope", "init_weights", "soft_cap"]
