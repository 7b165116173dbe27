"""Triton kernels for the engine's batch-1 forward: the opt-in fast twin of `orl.engine.forward`
(``EngineConfig.kernels = "triton"``; the default "torch" path is untouched).

At batch 1 a round streams every weight once, so each matmul must run near copy bandwidth and the
round must have few kernels (each costs a few microseconds even inside a CUDA graph). Per layer
this module launches seven kernels (a MoE layer's MLP is `orl.engine.moe.moe_mlp`'s kernels instead of
the last three GEMMs):

  add_norm(ln1)        x <- x + round(sum of the previous down partials); h = RMSNorm(x) (row kernel)
  gemm(qkv)            skinny split-K GEMM, fp32 partials (SPLIT, T, (H + 2 Hkv) hd)
  qk_rope              sums the partials, QK-RMSNorm, RoPE at start + t, writes q (H, T, hd) and
                       k / v straight into the static cache slots start + t
  attention            split-KV (flash-decoding) over S cache slots; G query heads of a KV head are
                       stacked as G*T rows; row i sees slot j iff j < start + lim[i] (``start`` a
                       device tensor, so one capture serves every block); the last program of a
                       tile combines the splits in a fixed order (deterministic)
  gemm(o) -> add_norm(ln2) -> gemm(gate_up, SiLU(gate) * up epilogue) -> gemm(down, partials)
The split-K partial sums are reduced by the kernel that consumes them (add_norm / qk_rope), so a
GEMM needs no second pass or semaphore. Roundings mirror the PyTorch path where it is cheap
(F.linear's output, the activation, RoPE's products are rounded to the working dtype as PyTorch
would), so bf16 logits stay within rounding of `orl.engine.forward`'s; they are not bit-identical
(different summation order).
GEMM tiles come from ``TABLE`` (measured on an H200 by `benchmarks/kernels_bench.py`) or a
heuristic that aims for about two programs per SM.
Does not own: what the runtime decodes (`orl.engine.runtime`), the reference numerics
(`orl.engine.forward`), CUDA graphs (`orl.engine.graphs`). Without Triton this module imports and
`available()` says why; on CPU the kernels run under ``TRITON_INTERPRET=1`` (tests, float32).
Shapes: T new tokens (rows, also M of a GEMM), S attended cache slots, L cache length, D hidden,
H / Hkv query / KV heads, hd head dim, N GEMM output columns.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

try:
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # the package works without Triton; only kernels="triton" needs it
    triton = tl = None


def available() -> tuple[bool, str]:
    """(True, "") when the Triton kernels can run here, else (False, why)."""
    if triton is None:
        return False, "triton is not installed (pip install triton)"
    return True, ""


@dataclass(frozen=True)
class GemmConfig:
    BM: int
    BN: int
    BK: int
    SPLIT: int = 1
    warps: int = 4
    stages: int = 4


# (N, K, gated) -> [(largest M, config), ...] in increasing M; measured entries beat the heuristic.
# Filled from `python benchmarks/kernels_bench.py` on an H200 (its "suggested TABLE" lines).
TABLE: dict[tuple[int, int, bool], list[tuple[int, GemmConfig]]] = {
    # Qwen3-4B shape, M <= 32 (a 32-token block), bf16, H200 2026-11-30 (`kernels_bench.py` sweep, the
    # tiles of the 3.74 ms round in benchmarks/engine_results.md); the 64-row folded start keeps the
    # heuristic's BM = 64 (a BM = 32 tile would read W twice)
    (6144, 2560, False): [(32, GemmConfig(BM=32, BN=128, BK=128, SPLIT=2, warps=8, stages=4))],   # qkv 12.5 us
    (2560, 4096, False): [(32, GemmConfig(BM=32, BN=128, BK=256, SPLIT=4, warps=4, stages=3))],   # o 10.5 us
    (9728, 2560, True): [(32, GemmConfig(BM=32, BN=64, BK=128, SPLIT=1, warps=4, stages=3))],     # gate_up 30.5 us
    (2560, 9728, False): [(32, GemmConfig(BM=32, BN=128, BK=128, SPLIT=4, warps=8, stages=4))],   # down 18.9 us
    (151936, 2560, False): [(32, GemmConfig(BM=32, BN=64, BK=128, SPLIT=1, warps=4, stages=4))],  # lm_head 194 us
}


def load_table(path: str) -> int:
    """Merge tiles measured by `benchmarks/kernels_bench.py` (its gemm_table.json: a list of
    {"N", "K", "gated", "m_max", "cfg": GemmConfig fields}) into ``TABLE``; returns how many.
    ``ORL_GEMM_TABLE=path`` loads one at import (a sweep's result, tried before it is pasted here)."""
    import json  # noqa: PLC0415
    with open(path) as f:
        rows = json.load(f)
    for r in rows:
        key = (int(r["N"]), int(r["K"]), bool(r["gated"]))
        entries = [e for e in TABLE.get(key, []) if e[0] != int(r["m_max"])] + [(int(r["m_max"]), GemmConfig(**r["cfg"]))]
        TABLE[key] = sorted(entries, key=lambda e: e[0])
    return len(rows)


if os.environ.get("ORL_GEMM_TABLE"):
    load_table(os.environ["ORL_GEMM_TABLE"])


def _pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


def gemm_config(M: int, N: int, K: int, gated: bool, n_sm: int = 132, elem: int = 2) -> GemmConfig:
    """Tiles for y (M, N) = x (M, K) @ W^T: the TABLE entry for this shape (measured in bf16, so
    for 2-byte elements only), else a heuristic (small M: one M tile, narrow N tiles, split K until
    there are ~2 programs per SM)."""
    for m_max, cfg in TABLE.get((N, K, gated), []) if elem == 2 else []:
        if M <= m_max:
            return cfg
    if M <= 64:
        cfg = dict(BM=max(16, _pow2(M)), BN=32 if gated else 64, BK=128, warps=4, stages=4)
    elif M <= 512:
        cfg = dict(BM=64 if M <= 128 else 128, BN=64 if gated else 128, BK=64, warps=4 if M <= 128 else 8, stages=3)
    else:
        cfg = dict(BM=128, BN=64 if gated else 128, BK=64, warps=8, stages=3)
    split = 1
    if not gated and M <= 512:  # the largest divisor of the K blocks within the target: even chunks
        tiles = triton_cdiv(N, cfg["BN"]) * triton_cdiv(M, cfg["BM"])
        target = max(1, min(round(2 * n_sm / tiles), K // 512, 8))
        kb = triton_cdiv(K, cfg["BK"])
        split = max(s for s in range(1, target + 1) if kb % s == 0)
    return GemmConfig(SPLIT=split, **cfg)


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _round_up_few(n: int) -> int:
    """The smallest 2^k or 3 * 2^k >= n."""
    p = _pow2(n)
    return 3 * p // 4 if p >= 4 and 3 * p // 4 >= n else p


if triton is not None:
    @triton.jit
    def _l2_prefetch(ptrs, nbytes):
        """Hopper bulk prefetch of nbytes (multiple of 16) at each 16-byte aligned address into L2."""
        return tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], $2;\n\tmov.u32 $0, 0;",
                                         "=r,l,r", [ptrs, nbytes], dtype=tl.int32, is_pure=False, pack=1)

    @triton.jit
    def _gemm_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, stride_xm, gate_off, K_CHUNK: tl.constexpr,
                     BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SPLIT: tl.constexpr,
                     EPI: tl.constexpr, HAS_BIAS: tl.constexpr, PREC: tl.constexpr,
                     PDL: tl.constexpr = False, PF: tl.constexpr = 0, W_BYTES: tl.constexpr = 2):
        """y[pid_k] = x[:, chunk] @ W[:, chunk]^T over one K chunk (EPI 0), or, with the whole K
        (SPLIT 1), act(x @ Wg^T) * (x @ Wu^T) where Wu = W rows + gate_off (EPI 1 SiLU, 2 GELU-tanh).
        PDL: launched as a programmatic dependent of the previous kernel; before waiting for it, the
        program asks L2 for the first PF K-blocks of its weight rows (weights never depend on it)."""
        pid_n = tl.program_id(0)
        pid_m = tl.program_id(1)
        pid_k = tl.program_id(2)
        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        k_lo = pid_k * K_CHUNK
        k_hi = tl.minimum(k_lo + K_CHUNK, K)
        m_ok = rm[:, None] < M
        n_ok = rn[:, None] < N
        x_rows = x_ptr + rm[:, None].to(tl.int64) * stride_xm
        w_rows = w_ptr + rn[:, None].to(tl.int64) * K
        w_up = w_ptr + (rn[:, None] + gate_off).to(tl.int64) * K
        if PDL:
            gdc_launch_dependents()
            if PF > 0:
                rp = tl.minimum(rn, N - 1).to(tl.int64) * K + k_lo
                nbytes = (tl.minimum(PF * BK, k_hi - k_lo) * W_BYTES
                          + tl.zeros((BN,), dtype=tl.int32))
                _l2_prefetch(w_ptr + rp, nbytes)
                if EPI > 0:
                    _l2_prefetch(w_ptr + ((tl.minimum(rn, N - 1) + gate_off).to(tl.int64) * K + k_lo), nbytes)
            gdc_wait()
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        acc2 = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K_CHUNK, BK):  # constant trip count (the interpreter also needs it)
            kk = k_lo + k0 + rk
            k_ok = kk[None, :] < k_hi
            a = tl.load(x_rows + kk[None, :], mask=m_ok & k_ok, other=0.0)
            b = tl.load(w_rows + kk[None, :], mask=n_ok & k_ok, other=0.0)
            acc = tl.dot(a, tl.trans(b), acc, input_precision=PREC)
            if EPI > 0:
                b2 = tl.load(w_up + kk[None, :], mask=n_ok & k_ok, other=0.0)
                acc2 = tl.dot(a, tl.trans(b2), acc2, input_precision=PREC)
        if HAS_BIAS:  # added once, by the first K chunk
            bias = tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)
            acc += bias[None, :] * (pid_k == 0).to(tl.float32)
        ty = y_ptr.dtype.element_ty
        if EPI > 0:  # round as F.linear's outputs and F.silu / F.gelu's result would be
            g = acc.to(ty).to(tl.float32)
            u = acc2.to(ty).to(tl.float32)
            if EPI == 1:
                act = g / (1.0 + tl.exp(-g))
            else:
                z = 0.7978845608028654 * (g + 0.044715 * g * g * g)
                act = 0.5 * g * (2.0 / (1.0 + tl.exp(-2.0 * z)))  # 0.5 g (1 + tanh z)
            acc = act.to(ty).to(tl.float32) * u
        y = y_ptr + pid_k.to(tl.int64) * M * N + rm[:, None].to(tl.int64) * N + rn[None, :]
        tl.store(y, acc, mask=m_ok & (rn[None, :] < N))

    @triton.jit
    def _act_mul_kernel(y_ptr, o_ptr, M, N, BLOCK: tl.constexpr, SPLIT: tl.constexpr, GELU: tl.constexpr,
                        PDL: tl.constexpr = False):
        """Row m of y (SPLIT, M, 2N) = partial sums of [gate | up] -> o (M, N) = act(gate) * up: the
        partials summed and rounded as F.linear's output, then rounded as PyTorch's F.silu /
        F.gelu(tanh) result and the product would be (the epilogue of a split-K or cuBLAS gate/up)."""
        if PDL:
            gdc_launch_dependents()
            gdc_wait()
        m = tl.program_id(0)
        n = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = n < N
        ty = o_ptr.dtype.element_ty
        g = tl.zeros((BLOCK,), dtype=tl.float32)
        u = tl.zeros((BLOCK,), dtype=tl.float32)
        for s in tl.static_range(SPLIT):
            row = y_ptr + (s * M + m).to(tl.int64) * 2 * N
            g += tl.load(row + n, mask=ok, other=0.0).to(tl.float32)
            u += tl.load(row + N + n, mask=ok, other=0.0).to(tl.float32)
        g = g.to(ty).to(tl.float32)
        u = u.to(ty).to(tl.float32)
        if GELU:
            z = 0.7978845608028654 * (g + 0.044715 * g * g * g)
            act = 0.5 * g * (2.0 / (1.0 + tl.exp(-2.0 * z)))
        else:
            act = g / (1.0 + tl.exp(-g))
        tl.store(o_ptr + m.to(tl.int64) * N + n, act.to(ty).to(tl.float32) * u, mask=ok)

    @triton.jit
    def _add_norm_kernel(x_ptr, p_ptr, w_ptr, xo_ptr, ho_ptr, M, D, eps, offset,
                         BD: tl.constexpr, SPLIT: tl.constexpr, HAS_Y: tl.constexpr, PDL: tl.constexpr = False):
        """One row: x <- round(x + round(sum_s p[s])) (HAS_Y), h = RMSNorm(x) * (offset + w)."""
        if PDL:
            gdc_launch_dependents()
            gdc_wait()
        m = tl.program_id(0)
        d = tl.arange(0, BD)
        ok = d < D
        ty = ho_ptr.dtype.element_ty
        x = tl.load(x_ptr + m * D + d, mask=ok, other=0.0).to(tl.float32)
        if HAS_Y:
            y = tl.zeros((BD,), dtype=tl.float32)
            for s in tl.static_range(SPLIT):
                y += tl.load(p_ptr + (s * M + m) * D + d, mask=ok, other=0.0).to(tl.float32)
            x = (x + y.to(ty).to(tl.float32)).to(ty).to(tl.float32)
            tl.store(xo_ptr + m * D + d, x, mask=ok)
        r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
        w = tl.load(w_ptr + d, mask=ok, other=0.0).to(tl.float32)
        tl.store(ho_ptr + m * D + d, (x * r) * (offset + w), mask=ok)

    @triton.jit
    def _norm_rope(y1, y2, w_ptr, cos_ptr, sin_ptr, pos, eps, offset,
                   HD: tl.constexpr, NORM: tl.constexpr, TY: tl.constexpr):
        """RMSNorm (optional) then rotate-half RoPE of one head given as halves y1, y2 (fp32)."""
        d = tl.arange(0, HD // 2)
        if NORM:
            r = 1.0 / tl.sqrt((tl.sum(y1 * y1, axis=0) + tl.sum(y2 * y2, axis=0)) / HD + eps)
            w1 = tl.load(w_ptr + d).to(tl.float32)
            w2 = tl.load(w_ptr + HD // 2 + d).to(tl.float32)
            y1 = ((y1 * r) * (offset + w1)).to(TY).to(tl.float32)
            y2 = ((y2 * r) * (offset + w2)).to(TY).to(tl.float32)
        c1 = tl.load(cos_ptr + pos * HD + d).to(tl.float32)
        c2 = tl.load(cos_ptr + pos * HD + HD // 2 + d).to(tl.float32)
        s1 = tl.load(sin_ptr + pos * HD + d).to(tl.float32)
        s2 = tl.load(sin_ptr + pos * HD + HD // 2 + d).to(tl.float32)
        # x cos + cat(-x2, x1) sin, each product rounded as PyTorch's would be
        o1 = (y1 * c1).to(TY).to(tl.float32) + (-y2 * s1).to(TY).to(tl.float32)
        o2 = (y2 * c2).to(TY).to(tl.float32) + (y1 * s2).to(TY).to(tl.float32)
        return o1, o2

    @triton.jit
    def _qk_rope_kernel(p_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr, start_ptr, q_ptr, kc_ptr, vc_ptr,
                        T, N, L, eps, offset, H: tl.constexpr, HKV: tl.constexpr, HD: tl.constexpr,
                        SPLIT: tl.constexpr, QK_NORM: tl.constexpr, V_NORM: tl.constexpr,
                        PDL: tl.constexpr = False):
        """Token t, head j of the fused QKV output: q heads -> q (H, T, hd); k / v heads -> cache
        slot start + t of their KV head (cache (Hkv, L, hd))."""
        if PDL:
            gdc_launch_dependents()
            gdc_wait()
        t = tl.program_id(0)
        j = tl.program_id(1)
        d = tl.arange(0, HD // 2)
        ty = q_ptr.dtype.element_ty
        y1 = tl.zeros((HD // 2,), dtype=tl.float32)
        y2 = tl.zeros((HD // 2,), dtype=tl.float32)
        for s in tl.static_range(SPLIT):
            base = p_ptr + (s * T + t).to(tl.int64) * N + j * HD
            y1 += tl.load(base + d).to(tl.float32)
            y2 += tl.load(base + HD // 2 + d).to(tl.float32)
        y1 = y1.to(ty).to(tl.float32)
        y2 = y2.to(ty).to(tl.float32)
        pos = tl.load(start_ptr).to(tl.int32) + t
        if j < H:
            o1, o2 = _norm_rope(y1, y2, qn_ptr, cos_ptr, sin_ptr, pos, eps, offset, HD, QK_NORM, ty)
            dst = q_ptr + (j * T + t) * HD
        elif j < H + HKV:
            o1, o2 = _norm_rope(y1, y2, kn_ptr, cos_ptr, sin_ptr, pos, eps, offset, HD, QK_NORM, ty)
            dst = kc_ptr + ((j - H) * L + pos).to(tl.int64) * HD
        else:
            o1, o2 = y1, y2
            if V_NORM:  # scale-free RMSNorm
                r = 1.0 / tl.sqrt((tl.sum(y1 * y1, axis=0) + tl.sum(y2 * y2, axis=0)) / HD + eps)
                o1, o2 = y1 * r, y2 * r
            dst = vc_ptr + ((j - H - HKV) * L + pos).to(tl.int64) * HD
        tl.store(dst + d, o1)
        tl.store(dst + HD // 2 + d, o2)

    @triton.jit
    def _attn_kernel(q_ptr, k_ptr, v_ptr, o_ptr, start_ptr, lim_ptr, ws_ptr, ml_ptr, cnt_ptr,
                     T, S, L, stride_o, scale, N_ITER: tl.constexpr, G: tl.constexpr, HD: tl.constexpr,
                     BR: tl.constexpr, BS: tl.constexpr, SPLIT: tl.constexpr, PREC: tl.constexpr,
                     PDL: tl.constexpr = False):
        """KV head h, rows pid_r*BR.. of its G*T stacked query rows, cache slots of split pid_s."""
        if PDL:
            gdc_launch_dependents()
            gdc_wait()
        h = tl.program_id(0)
        pid_r = tl.program_id(1)
        pid_s = tl.program_id(2)
        R = G * T
        rr = tl.arange(0, BR)
        r = pid_r * BR + rr
        r_ok = r < R
        i = r % T
        d = tl.arange(0, HD)
        vis = tl.load(start_ptr).to(tl.int32) + tl.load(lim_ptr + i, mask=r_ok, other=0).to(tl.int32)
        q = tl.load(q_ptr + (h * R + r)[:, None] * HD + d[None, :], mask=r_ok[:, None], other=0.0)
        lo = pid_s * N_ITER * BS
        hi = tl.minimum(tl.minimum(lo + N_ITER * BS, S), tl.max(vis, axis=0))  # slots no row sees: masked
        m_i = tl.full((BR,), float("-inf"), dtype=tl.float32)
        l_i = tl.zeros((BR,), dtype=tl.float32)
        acc = tl.zeros((BR, HD), dtype=tl.float32)
        kv = h.to(tl.int64) * L * HD
        for j0 in range(0, N_ITER * BS, BS):  # constant trip count (see _gemm_kernel)
            j = lo + j0 + tl.arange(0, BS)
            j_ok = j < hi
            kt = tl.load(k_ptr + kv + j[:, None] * HD + d[None, :], mask=j_ok[:, None], other=0.0)
            s = tl.dot(q, tl.trans(kt), input_precision=PREC) * scale
            s = tl.where((j[None, :] < vis[:, None]) & j_ok[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp(s - m_use[:, None])
            alpha = tl.exp(m_i - m_use)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            vt = tl.load(v_ptr + kv + j[:, None] * HD + d[None, :], mask=j_ok[:, None], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt, input_precision=PREC)
            m_i = m_new
        out = o_ptr + i[:, None] * stride_o + ((h * G + r // T) * HD)[:, None] + d[None, :]
        if SPLIT == 1:
            tl.store(out, acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None], mask=r_ok[:, None])
        else:
            tile = h * tl.num_programs(1) + pid_r
            row = (tile * SPLIT + pid_s) * BR + rr
            tl.store(ws_ptr + row[:, None] * HD + d[None, :], acc)
            tl.store(ml_ptr + row * 2, m_i)
            tl.store(ml_ptr + row * 2 + 1, l_i)
            tl.debug_barrier()  # every thread's partial is written before the release below
            done = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel")
            if done == SPLIT - 1:  # the last split of this tile combines all, in split order
                m_all = tl.full((BR,), float("-inf"), dtype=tl.float32)
                for sp in tl.static_range(SPLIT):
                    row = (tile * SPLIT + sp) * BR + rr
                    m_all = tl.maximum(m_all, tl.load(ml_ptr + row * 2, cache_modifier=".cg"))
                m_use = tl.where(m_all == float("-inf"), 0.0, m_all)
                tot = tl.zeros((BR, HD), dtype=tl.float32)
                l_tot = tl.zeros((BR,), dtype=tl.float32)
                for sp in tl.static_range(SPLIT):
                    row = (tile * SPLIT + sp) * BR + rr
                    f = tl.exp(tl.load(ml_ptr + row * 2, cache_modifier=".cg") - m_use)
                    l_tot += tl.load(ml_ptr + row * 2 + 1, cache_modifier=".cg") * f
                    tot += tl.load(ws_ptr + row[:, None] * HD + d[None, :], cache_modifier=".cg") * f[:, None]
                tl.store(out, tot / tl.where(l_tot == 0.0, 1.0, l_tot)[:, None], mask=r_ok[:, None])
                tl.atomic_xchg(cnt_ptr + tile, 0)  # ready for the next launch (graph replays too)


class TritonKernels:
    """The Triton forward for one `orl.engine.forward.Baked` (dense layers). Owns the attention
    split counters (zeroed once, every launch leaves them zero), so create it outside CUDA-graph
    capture; everything else is allocated per call (graph pools serve captured calls)."""

    N_COUNTERS = 4096

    def __init__(self, w):
        ok, why = available()
        if not ok:
            raise RuntimeError(f"kernels='triton' unavailable: {why}; use kernels='torch'")
        cfg = w.cfg
        if cfg.sandwich_norm or cfg.layer_scalar or cfg.full_k_eq_v or "sliding" in cfg.layer_types \
                or cfg.full_head_dim or cfg.full_num_kv_heads:
            raise NotImplementedError("the Triton layer kernels cover SDAR / LLaDA layers (dense or MoE); Gemma-4 "
                                      "options (sandwich norms, layer scalars, sliding windows, K = V) run with "
                                      "kernels='torch'")
        hd = cfg.head_dim
        if hd < 16 or hd & (hd - 1):
            raise NotImplementedError(f"the Triton kernels need a power-of-two head_dim >= 16, not {hd}")
        if cfg.hidden_act not in ("silu", "gelu_tanh"):
            raise NotImplementedError(f"activation {cfg.hidden_act!r} has no Triton epilogue")
        self.w, self.cfg = w, cfg
        dev = w.embed.device
        self.n_sm = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 132
        self.counters = torch.zeros(self.N_COUNTERS, dtype=torch.int32, device=dev)
        self.prec = "ieee" if w.dtype == torch.float32 else "tf32"  # fp32: exact products (tests)
        self.gemm_override: dict = {}  # (N, K, gated) -> GemmConfig, for benchmarks sweeping tiles
        self.attn_split: int | None = None  # force the attention split count (tests, benchmarks)
        self.attn_bs = 64                     # cache slots per attention iteration
        self.attn_warps = 4
        # Programmatic dependent launch (Hopper+, opt-in with ``ORL_PDL=1``): each kernel lets the
        # next one start on SMs that free up while it finishes; the next GEMM prefetches its first
        # `pf_blocks` K-blocks of weights into L2 before waiting. Measured on the H200 (Qwen3-4B
        # shape, K = 32): 3.94 ms per round with it, 3.88 ms without -- off by default.
        cap = torch.cuda.get_device_capability(dev) if dev.type == "cuda" else (0, 0)
        self.pdl = cap >= (9, 0) and os.environ.get("ORL_PDL", "0") == "1"
        self.pf_blocks = int(os.environ.get("ORL_PDL_PREFETCH", "4"))
        # from this many rows a plain GEMM goes to cuBLAS (measured faster at M = 256 for every
        # Qwen3-4B matrix: kernels_results.md); the fused gate/up epilogue then runs in PyTorch
        self.cublas_min_m = int(os.environ.get("ORL_CUBLAS_MIN_M", "128"))

    @staticmethod
    def _prefetchable(W: torch.Tensor) -> bool:
        """The bulk L2 prefetch needs 16-byte aligned rows (and so chunk sizes in 16-byte units)."""
        return W.data_ptr() % 16 == 0 and (W.shape[1] * W.element_size()) % 16 == 0

    def _kw(self) -> dict:
        """Launch options shared by every kernel: PDL on Hopper, nothing on the interpreter."""
        return dict(PDL=True, launch_pdl=True) if self.pdl else {}

    # -------------------------------------------------------------- single kernels
    def linear(self, x: torch.Tensor, W: torch.Tensor, bias=None, gated: bool = False,
               cfg: GemmConfig | None = None) -> torch.Tensor:
        """x (M, K) @ W^T. Plain: (SPLIT, M, N) partial sums, fp32 when SPLIT > 1 else x's dtype
        (sum over dim 0 = F.linear(x, W, bias)). ``gated``: W = [gate; up] (2N, K), returns
        act(x @ gate^T) * (x @ up^T) as (M, N) in x's dtype."""
        M, K = x.shape
        N = W.shape[0] // 2 if gated else W.shape[0]
        if cfg is None and M >= self.cublas_min_m and x.is_cuda:
            y = torch.nn.functional.linear(x, W, bias)
            return self.act_mul(y) if gated else y[None]
        if x.stride(1) != 1:
            x = x.contiguous()
        cfg = cfg or self.gemm_override.get((N, K, gated)) or gemm_config(M, N, K, gated, self.n_sm, x.element_size())
        if gated and cfg.SPLIT > 1:  # split-K over all 2N rows, then the epilogue as its own kernel
            return self.act_mul(self.linear(x, W, cfg=cfg), dtype=x.dtype)
        split = 1 if gated else cfg.SPLIT
        y = torch.empty((split, M, N), dtype=x.dtype if split == 1 else torch.float32, device=x.device)
        grid = (triton_cdiv(N, cfg.BN), triton_cdiv(M, cfg.BM), split)
        epi = 0 if not gated else (1 if self.cfg.hidden_act == "silu" else 2)
        k_chunk = triton_cdiv(triton_cdiv(K, split), cfg.BK) * cfg.BK
        _gemm_kernel[grid](x, W, bias if bias is not None else W, y, M, N, K, x.stride(0), N, K_CHUNK=k_chunk,
                           BM=cfg.BM, BN=cfg.BN, BK=cfg.BK, SPLIT=split, EPI=epi, HAS_BIAS=bias is not None,
                           PREC=self.prec, num_warps=cfg.warps, num_stages=cfg.stages,
                           **self._kw(), **(dict(PF=self.pf_blocks if self._prefetchable(W) else 0,
                                                 W_BYTES=W.element_size()) if self.pdl else {}))
        return y[0] if gated else y

    def act_mul(self, y: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """y (M, 2N) = [gate | up], or (SPLIT, M, 2N) partial sums of it -> act(gate) * up (M, N) in
        ``dtype`` (default y's), one kernel (PyTorch needs three)."""
        y = y if y.dim() == 3 else y[None]
        S_, M, N2 = y.shape
        o = torch.empty((M, N2 // 2), dtype=dtype or y.dtype, device=y.device)
        BLOCK = 1024
        _act_mul_kernel[(M, triton_cdiv(N2 // 2, BLOCK))](y.contiguous(), o, M, N2 // 2, BLOCK=BLOCK, SPLIT=S_,
                                                         GELU=self.cfg.hidden_act != "silu", num_warps=4, **self._kw())
        return o

    def add_norm(self, x: torch.Tensor, partials: torch.Tensor | None, w: torch.Tensor):
        """x (M, D) [+ rounded sum of partials (SPLIT, M, D)] -> (x, RMSNorm(x) * w), both (M, D)."""
        M, D = x.shape
        h = torch.empty_like(x)
        xo = x if partials is None else torch.empty_like(x)
        p = partials if partials is not None else x
        _add_norm_kernel[(M,)](x, p, w, xo, h, M, D, self.cfg.rms_eps, self.cfg.norm_offset,
                               BD=_pow2(D), SPLIT=1 if partials is None else partials.shape[0],
                               HAS_Y=partials is not None, num_warps=8 if D >= 2048 else 4, **self._kw())
        return xo, h

    def qk_rope(self, partials: torch.Tensor, lw, start: torch.Tensor, k_cache, v_cache) -> torch.Tensor:
        """QKV partials (SPLIT, T, (H + 2 Hkv) hd) -> q (H, T, hd); k, v written at slots start + t."""
        c = self.cfg
        S_, T, N = partials.shape
        q = torch.empty((c.num_heads, T, c.head_dim), dtype=k_cache.dtype, device=partials.device)
        norm = lw.q_norm is not None
        _qk_rope_kernel[(T, c.num_heads + 2 * c.num_kv_heads)](
            partials, lw.q_norm if norm else q, lw.k_norm if norm else q, self.w.rope_cos, self.w.rope_sin,
            start, q, k_cache, v_cache, T, N, k_cache.shape[2], c.rms_eps, c.norm_offset,
            H=c.num_heads, HKV=c.num_kv_heads, HD=c.head_dim, SPLIT=S_, QK_NORM=norm, V_NORM=bool(c.v_norm),
            num_warps=1 if c.head_dim <= 64 else 2, **self._kw())
        return q

    def attention(self, q: torch.Tensor, k_cache, v_cache, start: torch.Tensor, lim: torch.Tensor, S: int,
                  split: int | None = None, BR: int | None = None, BS: int | None = None,
                  warps: int | None = None) -> torch.Tensor:
        """q (H, T, hd) over cache slots [0, S) of k_cache / v_cache (1, Hkv, L, hd), row i of every
        head seeing slot j iff j < start + lim[i]. Returns (T, H hd) in q's dtype."""
        c = self.cfg
        H, T, hd = q.shape
        Hkv, L = k_cache.shape[1], k_cache.shape[2]
        G = H // Hkv
        R = G * T
        BR = BR or (64 if R >= 64 else max(16, _pow2(R)))
        BS = BS or self.attn_bs
        tiles = Hkv * triton_cdiv(R, BR)
        split = split or self.attn_split
        if split is None:  # about one program per SM (H200: 2 per SM measured slower at K = 256)
            split = max(1, min(triton_cdiv(self.n_sm, tiles), S // 128, 16))
        if tiles > self.N_COUNTERS:
            split = 1
        # blocks of BS slots per split: a compile-time trip count, rounded up to 2^k or 3 * 2^k so
        # that varying S (prefill) compiles a few variants only; the split count is then trimmed
        blocks = triton_cdiv(S, BS)
        n_iter = _round_up_few(triton_cdiv(blocks, split))
        split = triton_cdiv(blocks, n_iter)
        o = torch.empty((T, H * hd), dtype=q.dtype, device=q.device)
        ws = torch.empty((tiles * split * BR, hd) if split > 1 else (1, hd), dtype=torch.float32, device=q.device)
        ml = torch.empty(tiles * split * BR * 2 if split > 1 else 2, dtype=torch.float32, device=q.device)
        scale = c.attn_scale if c.attn_scale is not None else hd ** -0.5
        _attn_kernel[(Hkv, triton_cdiv(R, BR), split)](
            q, k_cache, v_cache, o, start, lim, ws, ml, self.counters, T, S, L, H * hd, scale, N_ITER=n_iter,
            G=G, HD=hd, BR=BR, BS=BS, SPLIT=split, PREC=self.prec, num_warps=warps or self.attn_warps, num_stages=2,
            **self._kw())
        return o

    # ------------------------------------------------------------------ forward
    def forward(self, h: torch.Tensor, start: torch.Tensor, lim: torch.Tensor, kv, S: int,
                logits_from: int | None = 0) -> torch.Tensor | None:
        """`orl.engine.forward.forward` (same arguments and result) with these kernels."""
        from ..model.layers import soft_cap  # noqa: PLC0415
        from ..engine.moe import moe_mlp  # noqa: PLC0415
        w, c = self.w, self.cfg
        red = w.tp_reduce or (lambda t: t)  # tensor parallel: partials summed over ranks in place
        x = h[0].contiguous()
        layers = w.layers
        x, hn = self.add_norm(x, None, layers[0].ln1)
        for i, lw in enumerate(layers):
            q = self.qk_rope(self.linear(hn, lw.qkv, lw.qkv_bias), lw, start, kv.k[i], kv.v[i])
            last = i + 1 == len(layers)
            if last and logits_from is None:
                return None  # a commit pass: the cache is written, nothing else is read out
            a = self.attention(q, kv.k[i], kv.v[i], start, lim, S)
            x, hn = self.add_norm(x, red(self.linear(a, lw.o)), lw.ln2)
            nxt = w.norm if last else layers[i + 1].ln1
            if lw.moe is not None:  # routed + shared experts: `orl.engine.moe` (its grouped Triton kernels)
                if w.tp_reduce is not None:
                    raise NotImplementedError("tensor parallelism does not shard MoE layers yet")
                x, hn = self.add_norm(x, moe_mlp(hn[None], lw.moe, c, backend=w.moe_backend), nxt)
                continue
            act = self.linear(hn, lw.gate_up, gated=True)
            x, hn = self.add_norm(x, red(self.linear(act, lw.down)), nxt)
        logits = self.linear(hn[logits_from:], w.lm_head)
        logits = logits[0] if logits.shape[0] == 1 else logits.sum(0).to(hn.dtype)
        return soft_cap(logits[None], c.final_logit_softcap)
