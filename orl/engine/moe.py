"""The engine's mixture-of-experts MLP: routing, a grouped Triton kernel, a PyTorch twin, bytes.

Owns, for one MoE layer at batch 1:
  * ``MoEWeights`` / ``bake_moe``: an `orl.model.layers.MoE`'s weights in the engine's dtype (the
    stacked experts are used as they are, no copy when the dtype already matches; the shared
    expert's gate and up become one (2 Is, D) matrix).
  * ``moe_mlp(h, mw, cfg)``: numerically `MoE.forward` (same softmax router, top-k, renormalised
    top-k weights, Gemma-4 router scale and per-expert scale, or LLaDA-2.x's gate (sigmoid, expert
    bias, group-limited choice, scaling: `orl.model.layers.group_limited_route`, shared with the
    model), the same activation and the same order of additions: per token the routed experts in
    ascending id, then the shared expert).
    Two backends with one contract:
      "triton"  routing is one launch (``route_triton``, kernel ``orl_moe_route``; ``route`` is its
                PyTorch reference): router GEMM, softmax, top-k, renormalisation, Gemma-4 scales and
                the ascending-id order of each token's k experts (LLaDA-2.x's gate is not in the
                kernel: ``route`` in PyTorch instead, `route_kernel_covers`); then
                the T x k (token, expert) assignments are sorted by expert on the device by one
                single-program Triton kernel (``plan_triton``; ``plan`` is its PyTorch reference); a grid
                over a static maximum of ``min(E, T k)`` expert slots runs two grouped kernels
                (gate/up + activation, then down + routing weight), where a slot with no tokens
                exits before reading anything and one program reads its expert's weight tile
                once for all the slot's tokens (up to ``BLOCK_T`` of them; more tokens, as in a
                prefill, loop over the tile again); a third kernel sums each token's k outputs in
                expert order and adds the shared expert. Static shapes, no host reads: CUDA-graph
                safe. Two `torch.library` custom ops (routing, experts), so torch.compile treats each
                as one opaque call. Kernels per layer: route 1, plan 1, gate/up 1, down 1, combine 1
                (plus the shared expert's GEMMs and activation, in PyTorch).
      "torch"   gathers each assignment's expert weights (the slow twin; CPU, or no Triton).
    Under ``TRITON_INTERPRET=1`` the Triton backend also runs on CPU tensors (tests).
  * ``moe_bytes``: the weight bytes one forward reads from a MoE layer, counting only the experts
    in the given router ids (the floor of a MoE round).
Does not own: the rest of the layer (`orl.engine.forward`), the model's reference numerics
(`orl.model.layers.MoE`).
Shapes: N = T tokens, D hidden, E experts, k experts per token, I expert intermediate size.
"""
import functools
import os
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F

from ..model.layers import group_limited_route

BACKENDS = ("auto", "triton", "torch")


class MoEWeights(NamedTuple):
    """One MoE layer's inference weights (tensors only, so torch.compile sees plain inputs)."""

    router: torch.Tensor                    # (E, D) gate.weight
    gate_up: torch.Tensor                   # (E, 2I, D) rows [gate; up]
    down: torch.Tensor                      # (E, D, I)
    shared_gate_up: Optional[torch.Tensor]  # (2 Is, D) [gate_proj; up_proj] of the shared expert(s)
    shared_down: Optional[torch.Tensor]     # (D, Is)
    router_scale: Optional[torch.Tensor]    # (D,) Gemma 4 router input scale
    per_expert_scale: Optional[torch.Tensor]  # (E,) Gemma 4 scale of the top-k weights
    expert_bias: Optional[torch.Tensor] = None  # (E,) LLaDA-2.x choice bias, float32 (float64 engines: float64)


def bake_moe(moe, cast) -> MoEWeights:
    """``moe`` an `orl.model.layers.MoE`; ``cast(t)`` returns t in the engine's dtype, contiguous
    (None for None)."""
    se = moe.shared_experts
    router = cast(moe.gate.weight)
    # the choice's bias in at least float32 (a bf16 engine does not round it); shared when float32 already
    bias_dt = torch.promote_types(router.dtype, torch.float32)
    return MoEWeights(
        router=router, gate_up=cast(moe.gate_up_proj), down=cast(moe.down_proj),
        shared_gate_up=None if se is None else cast(torch.cat([se.gate_proj.weight, se.up_proj.weight])),
        shared_down=None if se is None else cast(se.down_proj.weight),
        router_scale=cast(moe.router_scale) if moe.gemma else None,
        per_expert_scale=cast(moe.per_expert_scale) if moe.gemma else None,
        expert_bias=None if moe.expert_bias is None else moe.expert_bias.detach().to(bias_dt).contiguous())


# ----------------------------------------------------------------------------- routing
def route(x: torch.Tensor, mw: MoEWeights, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """`MoE.route`, op for op: x (N, D) router input -> weights (N, k) float32, expert ids (N, k).
    Unlike `MoE.route` each row is sorted by expert id (the order the reference adds experts in).
    A non-plain router (``cfg.router_plain`` False: LLaDA-2.x's sigmoid / bias / group gate) runs
    the model's own `orl.model.layers.group_limited_route` on float32 logits, as `MoE.route`."""
    if not cfg.router_plain:
        dt = torch.promote_types(x.dtype, torch.float32)
        w, idx = group_limited_route(F.linear(x.to(dt), mw.router.to(dt)), cfg.num_experts_per_tok,
                                     score=cfg.router_score, bias=mw.expert_bias, groups=cfg.router_groups,
                                     topk_groups=cfg.router_topk_groups, norm=cfg.router_norm_topk,
                                     scaling=cfg.router_scaling)
        idx, order = idx.sort(-1)
        return w.gather(-1, order), idx
    if mw.router_scale is not None:  # Gemma 4: scale-free RMSNorm, times the scale and D^-1/2
        xf = x.float()
        x = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + cfg.rms_eps)).to(x.dtype)
        x = x * mw.router_scale * x.shape[-1] ** -0.5
    probs = torch.softmax(F.linear(x, mw.router).float(), dim=-1)
    w, idx = probs.topk(cfg.num_experts_per_tok, dim=-1)
    if cfg.router_norm_topk:
        w = w / w.sum(-1, keepdim=True)
    if mw.per_expert_scale is not None:
        w = w * mw.per_expert_scale[idx]
    idx, order = idx.sort(-1)
    return w.gather(-1, order), idx


ROUTE_BLOCK_T = 16      # tokens per program of the routing kernel (tl.dot's minimum)
ROUTE_COUNTERS = 4096   # per-device split counters of the routing kernel: token tiles of one launch
_route_counters: dict = {}


def _counters(device: torch.device) -> torch.Tensor:
    """The routing kernel's split counters on ``device``: zeroed once, left zero by every launch.
    Allocated on first use outside a CUDA-graph capture and kept; a first use inside a capture gets
    a fresh zeroed buffer (a memset captured with the graph) instead, so no kept tensor lives in a
    graph's pool. Launches on one device must not overlap (one stream, as the engine runs)."""
    c = _route_counters.get(device)
    if c is not None:
        return c
    c = torch.zeros(ROUTE_COUNTERS, dtype=torch.int32, device=device)
    if not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        _route_counters[device] = c
    return c


def route_triton(x: torch.Tensor, router: torch.Tensor, k: int, norm_topk: bool,
                 router_scale: Optional[torch.Tensor] = None, per_expert_scale: Optional[torch.Tensor] = None,
                 eps: float = 1e-6, block_e: Optional[int] = None, block_t: int = ROUTE_BLOCK_T,
                 num_warps: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """`route` in one Triton launch (`orl.kernels.moe.orl_moe_route`): x (N, D), router (E, D) ->
    weights (N, k) float32, ids (N, k) int64, each row in ascending id. ``norm_topk`` is
    ``cfg.router_norm_topk``; router_scale / per_expert_scale (both or neither) the Gemma 4 router.
    The logits are x @ router^T accumulated in float32 and rounded to x's dtype (F.linear), softmax
    and top-k in float32; of equal probabilities the lower id is taken (torch.topk's CUDA order; its
    CPU order is unspecified). Same ids as `route` unless summation order moves a logit across a
    rounding boundary at the k-th place; weights within float32 rounding (reduction order).
    ``block_e`` (power of two >= 16): experts per program; below the padded E (the default on CUDA,
    ``E_pad / 16``) the experts are split over programs and the last of a token tile routes it
    (split counters: `_counters`); the whole E_pad (the default on CPU) routes in the same program.
    Static shapes, no host reads (CUDA-graph safe)."""
    if not (x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"):
        raise RuntimeError("the Triton routing kernel needs CUDA tensors (or TRITON_INTERPRET=1); use route()")
    from ..kernels import moe as mk  # noqa: PLC0415
    x, router = x.contiguous(), router.contiguous()
    N, D = x.shape
    E = router.shape[0]
    if not 1 <= k <= E:
        raise ValueError(f"top-k {k} must be in [1, {E}]")
    gemma = router_scale is not None
    if gemma != (per_expert_scale is not None):
        raise ValueError("the Gemma 4 router needs both router_scale and per_expert_scale")
    e_pad = max(16, _pow2(E))
    tiles = _cdiv(N, block_t)
    if block_e is None:
        block_e = max(16, e_pad // 16) if x.is_cuda else e_pad
    block_e = min(block_e, e_pad)
    if tiles > ROUTE_COUNTERS:
        block_e = e_pad
    split = e_pad // block_e
    dev = x.device
    w = torch.empty(N, k, dtype=torch.float32, device=dev)
    ids = torch.empty(N, k, dtype=torch.long, device=dev)
    lg = torch.empty(tiles * block_t, e_pad, dtype=torch.float32, device=dev) if split > 1 else w
    cnt = _counters(dev) if split > 1 else ids
    fp32 = x.dtype == torch.float32
    # a router tile of <= 32 KiB per reduction step, so the pipeline's stages fit in shared memory
    bd = max(16, min(256, _pow2(D), 32768 // (block_e * x.element_size())))
    mk.orl_moe_route[(tiles, split)](
        x, router, router_scale.contiguous() if gemma else x, per_expert_scale.contiguous() if gemma else w, lg, cnt,
        w, ids, N, float(eps), float(D ** -0.5), D=D, E=E, K_TOP=k, BLOCK_T=block_t, BLOCK_E=block_e, E_PAD=e_pad,
        BLOCK_D=bd, NORM=bool(norm_topk), GEMMA=gemma, FP32=fp32, num_warps=num_warps)
    return w, ids


@torch.library.custom_op("orl::moe_route", mutates_args=())
def _moe_route_op(x: torch.Tensor, router: torch.Tensor, router_scale: Optional[torch.Tensor],
                  per_expert_scale: Optional[torch.Tensor], k: int, norm_topk: bool,
                  eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return route_triton(x, router, k, norm_topk, router_scale, per_expert_scale, eps)


@_moe_route_op.register_fake
def _(x, router, router_scale, per_expert_scale, k, norm_topk, eps):
    return x.new_empty(x.shape[0], k, dtype=torch.float32), x.new_empty(x.shape[0], k, dtype=torch.long)


def _act(g: torch.Tensor, cfg) -> torch.Tensor:
    return F.silu(g) if cfg.hidden_act == "silu" else F.gelu(g, approximate="tanh")


def _weigh(y: torch.Tensor, w: torch.Tensor, gemma: bool) -> torch.Tensor:
    """`MoE.forward`'s weighting: Gemma 4 multiplies in float32 and casts the product (HF); the
    LLaDA path casts the weight first."""
    return (y * w).to(y.dtype) if gemma else y * w.to(y.dtype)


def shared_mlp(x: torch.Tensor, mw: MoEWeights, cfg) -> torch.Tensor:
    """The shared expert (a `GatedMLP`) on x (N, D), gate and up as one matmul."""
    g, u = F.linear(x, mw.shared_gate_up).chunk(2, dim=-1)
    return F.linear(_act(g, cfg) * u, mw.shared_down)


# ----------------------------------------------------------------------------- torch twin
def experts_torch(x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, mw: MoEWeights, cfg,
                  max_elems: int = 1 << 27) -> torch.Tensor:
    """Routed experts by gathering each assignment's weights: x (N, D), ids/w (N, k) from `route`
    -> (N, D), each token's k outputs added in ascending expert id to zeros, as `MoE.forward`.
    Pairs are processed in chunks of at most ``max_elems`` gathered weight elements."""
    N, k = ids.shape
    E, I2, D = mw.gate_up.shape
    gemma = mw.router_scale is not None
    flat, xs = ids.reshape(-1), x.repeat_interleave(k, 0)       # pair p = token p // k, slot p % k
    chunk = max(1, max_elems // (I2 * D + D * I2 // 2))
    ys = []
    for a in range(0, N * k, chunk):
        e = flat[a:a + chunk]
        g, u = torch.bmm(mw.gate_up[e], xs[a:a + chunk, :, None])[..., 0].chunk(2, dim=-1)
        ys.append(torch.bmm(mw.down[e], (_act(g, cfg) * u)[..., None])[..., 0])
    y = _weigh(torch.cat(ys).view(N, k, D), w[..., None], gemma)
    out = torch.zeros_like(x)
    for j in range(k):  # the reference's index_add order: one expert after another
        out = out + y[:, j]
    return out


# ----------------------------------------------------------------------------- Triton
@functools.lru_cache(maxsize=1)
def triton_available() -> bool:
    try:
        import triton  # noqa: F401, PLC0415
    except ImportError:
        return False
    return True


def plan(ids: torch.Tensor, num_experts: int) -> dict:
    """The grouped layout of ids (N, k), on the device with static shapes: the N k assignments
    sorted by expert (stable: by token within an expert), and per slot m < min(E, N k) its first
    sorted position, count (0: inactive, always after the active ones) and expert. The readable
    reference of `plan_triton` (one launch instead of ~15 small kernels), which the engine runs."""
    N, k = ids.shape
    flat = ids.reshape(-1)
    sorted_e, order = torch.sort(flat, stable=True)            # order[s] = pair at sorted position s
    new = torch.cat([torch.ones_like(sorted_e[:1], dtype=torch.bool), sorted_e[1:] != sorted_e[:-1]])
    slot = new.long().cumsum(0) - 1
    M = min(num_experts, N * k)
    count = torch.zeros(M, dtype=torch.long, device=ids.device).scatter_add_(0, slot, torch.ones_like(slot))
    expert = torch.zeros(M, dtype=torch.long, device=ids.device).scatter_(0, slot, sorted_e)
    pos = torch.empty_like(order).scatter_(0, order, torch.arange(N * k, device=ids.device))
    return dict(order=order, tok=order // k, start=count.cumsum(0) - count, count=count, expert=expert,
                pos=pos, slots=M)


PLAN_BLOCK = 1024  # assignments the plan kernel sorts at once; more (a prefill) go in chunks


def plan_triton(ids: torch.Tensor, w: torch.Tensor, num_experts: int, block: int = PLAN_BLOCK,
                num_warps: Optional[int] = None) -> dict:
    """`plan` in one Triton launch of one program (`orl.kernels.moe.orl_moe_plan`), equal to it tensor
    for tensor (int64), plus ``wsorted``: w (N, k) flattened in sorted order, float32. Static
    shapes, no host reads (CUDA-graph safe). ``block`` (a power of two) caps the assignments
    sorted at once. On an H200 in a CUDA graph (E 256, k 8): ~3 us for N k = 256, ~8 us for 1024,
    ~17 us for 2048, against ~55-70 us for `plan` and the wsorted gather (~15 kernels)."""
    from ..kernels import moe as mk  # noqa: PLC0415
    N, k = ids.shape
    nk, M = N * k, min(num_experts, N * k)
    dev = ids.device
    order, tok, pos = (torch.empty(nk, dtype=torch.long, device=dev) for _ in range(3))
    start, count, expert = (torch.empty(M, dtype=torch.long, device=dev) for _ in range(3))
    wsorted = torch.empty(nk, dtype=torch.float32, device=dev)
    b = min(block, max(16, _pow2(nk)))
    if num_warps is None:  # the fastest measured (H200): more warps for a larger sort
        num_warps = 4 if nk <= 256 else 8 if nk <= 1024 else 16
    mk.orl_moe_plan[(1,)](ids.contiguous(), w.contiguous(), order, tok, pos, wsorted, start, count, expert, nk, M,
                          K_TOP=k, BLOCK=b, BLOCK_E=max(16, _pow2(num_experts)), ONE=nk <= b, num_warps=num_warps)
    return dict(order=order, tok=tok, start=start, count=count, expert=expert, pos=pos, slots=M, wsorted=wsorted)


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _tiles(n: int) -> tuple[int, int]:
    """(BLOCK_T, TILES): the token tile of a slot and a power-of-two number of tiles covering n."""
    bt = 16 if n <= 16 else 32 if n <= 32 else 64
    return bt, 1 << max(0, (_cdiv(n, bt) - 1).bit_length())


def experts_triton(x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, gate_up: torch.Tensor,
                   down: torch.Tensor, shared: Optional[torch.Tensor], gelu: bool, gemma: bool) -> torch.Tensor:
    """The grouped kernels (module docstring); same contract as `experts_torch` plus ``shared``
    (N, D) or None, added last."""
    if not (x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"):
        raise RuntimeError("the Triton MoE kernels need CUDA tensors (or TRITON_INTERPRET=1 for the CPU "
                           "interpreter); use backend='torch'")
    from ..kernels import moe as mk  # noqa: PLC0415 - Triton is imported on first use only
    x, gate_up, down = x.contiguous(), gate_up.contiguous(), down.contiguous()
    N, D = x.shape
    k = ids.shape[1]
    E, I2, _ = gate_up.shape
    I = I2 // 2
    p = plan_triton(ids, w, E)
    M, fp32, wsorted = p["slots"], x.dtype == torch.float32, p["wsorted"]
    bt, tiles = _tiles(N)
    h = torch.empty(N * k, I, dtype=x.dtype, device=x.device)
    y = torch.empty(N * k, D, dtype=x.dtype, device=x.device)
    out = torch.empty_like(x)
    # fp32 tiles are halved along the reduction so 3 pipeline stages fit in shared memory
    BI, BD, BN, BK = (64, 32, 64, 32) if fp32 else (64, 128, 64, 128)
    mk.orl_moe_gate_up[(M, _cdiv(I, BI))](x, gate_up, p["tok"], p["start"], p["count"], p["expert"], h, D, I,
                                          TILES=tiles, BLOCK_T=bt, BLOCK_I=BI, BLOCK_D=BD, GELU=gelu, FP32=fp32)
    mk.orl_moe_down[(M, _cdiv(D, BN))](h, down, wsorted, p["start"], p["count"], p["expert"], y, D, I,
                                       TILES=tiles, BLOCK_T=bt, BLOCK_N=BN, BLOCK_K=BK, GEMMA=gemma, FP32=fp32)
    sh = shared.contiguous() if shared is not None else out
    mk.orl_moe_combine[(N, _cdiv(D, 256))](y, p["pos"], sh, out, D, K_TOP=k, BLOCK=256, HAS_SHARED=shared is not None)
    return out


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@torch.library.custom_op("orl::moe_experts", mutates_args=())
def _moe_experts_op(x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, gate_up: torch.Tensor,
                    down: torch.Tensor, shared: Optional[torch.Tensor], gelu: bool, gemma: bool) -> torch.Tensor:
    return experts_triton(x, ids, w, gate_up, down, shared, gelu, gemma)


@_moe_experts_op.register_fake
def _(x, ids, w, gate_up, down, shared, gelu, gemma):
    return torch.empty_like(x)


# ----------------------------------------------------------------------------- the layer
def pick_backend(backend: str, device: torch.device, dtype: torch.dtype | None = None) -> str:
    """"auto": the Triton kernels on CUDA for the dtypes they take (float32, bf16, fp16), else the
    PyTorch twin; "triton" with float64 is refused with the way out."""
    if backend not in BACKENDS:
        raise ValueError(f"MoE backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "triton" if device.type == "cuda" and triton_available() and dtype != torch.float64 else "torch"
    if backend == "triton" and dtype == torch.float64:
        raise ValueError("the Triton MoE kernels take float32 / bf16 / fp16, not float64; use moe_backend='torch'")
    return backend


def route_kernel_covers(cfg) -> bool:
    """Whether the Triton routing kernel (`route_triton`) implements ``cfg``'s router: the plain
    softmax top-k router and Gemma 4's. LLaDA-2.x's gate (sigmoid, expert bias, group-limited
    choice, scaling: ``cfg.router_plain`` False) is not in the kernel; the "triton" backend then
    routes with `route` in PyTorch (~20 small kernels, static shapes, no host reads: CUDA-graph
    safe) and runs the grouped expert kernels on its ids and weights."""
    return bool(cfg.router_plain)


def moe_mlp(h: torch.Tensor, mw: MoEWeights, cfg, router_input: Optional[torch.Tensor] = None,
            backend: str = "auto") -> torch.Tensor:
    """`MoE.forward`: h (B, T, D) the (normed) expert input; router_input (B, T, D) (None: h, the
    LLaDA case; Gemma 4 routes the raw residual). Returns (B, T, D). ``backend`` "auto": Triton
    on CUDA when importable, else the PyTorch twin."""
    shape = h.shape
    x = h.reshape(-1, shape[-1])
    rx = x if router_input is None else router_input.reshape(-1, shape[-1])
    use_triton = pick_backend(backend, x.device, x.dtype) == "triton"
    if use_triton and route_kernel_covers(cfg):  # one routing kernel (`route_triton`) instead of route's ~8
        w, ids = torch.ops.orl.moe_route(rx, mw.router, mw.router_scale, mw.per_expert_scale,
                                         cfg.num_experts_per_tok, bool(cfg.router_norm_topk), float(cfg.rms_eps))
    else:
        w, ids = route(rx, mw, cfg)
    shared = shared_mlp(x, mw, cfg) if mw.shared_gate_up is not None else None
    if use_triton:
        out = torch.ops.orl.moe_experts(x, ids, w, mw.gate_up, mw.down, shared, cfg.hidden_act != "silu",
                                        mw.router_scale is not None)
    else:
        out = experts_torch(x, ids, w, mw, cfg)
        if shared is not None:
            out = out + shared
    return out.view(shape)


# ----------------------------------------------------------------------------- bytes
def moe_bytes(mw: MoEWeights, ids: Optional[torch.Tensor] = None) -> int:
    """Weight bytes a forward reads from this layer: router, scales and shared expert, plus the
    routed experts in ``ids`` (any shape; each distinct expert once) or, for None, all of them."""
    dense = sum(t.numel() for t in (mw.router, mw.shared_gate_up, mw.shared_down, mw.router_scale,
                                    mw.per_expert_scale) if t is not None)
    per_expert = mw.gate_up[0].numel() + mw.down[0].numel()
    n = mw.gate_up.shape[0] if ids is None else int(torch.unique(ids).numel())
    bias = 0 if mw.expert_bias is None else mw.expert_bias.numel() * mw.expert_bias.element_size()
    return (dense + n * per_expert) * mw.gate_up.element_size() + bias
