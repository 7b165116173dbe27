"""The packed replay's staircase attention as Triton kernels, forward and backward, that skip the
tiles no query of a tile can see: the third twin of `orl.model.masks.visible`'s rule, beside the
dense (B, T, T) bool mask for SDPA and the FlexAttention BlockMask (`staircase_block_mask`).

Owns:
  tile tables   the class of every (row, query tile, key tile): EMPTY (no visible pair: never
                visited), FULL (every pair visible: no per-element rule) or PARTIAL; computed
                exactly from the per-token metadata by evaluating `visible` a chunk of query tiles
                at a time (never a (B, T, T) tensor), at one base tile and coarsened exactly to each
                kernel tile (a coarse tile is EMPTY iff all its sub-tiles are, FULL iff all are).
                Stored sparsely as FlexAttention stores a BlockMask (kv_num_blocks / kv_indices and
                their full_* twins): per query tile its PARTIAL key tiles and, apart, its FULL ones,
                and the transposed lists per key tile for the dK / dV pass. Two lists rather than one
                with a flag, so that each kernel runs two branch-free loops (masked, then unmasked)
                that the compiler can pipeline.
  kernels       FlashAttention-2 (Dao 2023, alg. 1 and 2): the forward's online softmax in base 2
                (scores times scale * log2 e, exp2), fp32 accumulation, the logsumexp saved; the
                backward's delta = rowsum(dO * O); dQ per query tile; dK, dV per key tile and KV
                head, looping over the g query heads that share it (no atomics). Each visits only the
                non-empty tiles of its table and evaluates the rule per element on PARTIAL tiles only,
                from int32 metadata vectors of the tile's rows and columns.
  `staircase_attention`  the autograd function over them: q (B, H, T, d), k / v (B, Hkv, T, d),
                H = g Hkv (GQA), equal to SDPA with the dense mask (tested).
Does not own: the rule (`orl.model.masks.visible`), the layouts (`orl.train.pack`,
`orl.model.masks`), the choice of replay attention (`orl.train.loop`).

No row is empty: under the rule every token sees itself (clean: its own block; noisy: its own
state), and `orl.train.pack` gives every padding token a segment of its own, so a padding row
attends to itself alone (its output is its own v). Tile positions past T (a ragged last tile)
are never FULL, so only the masked loop needs bounds checks.
Numerics: SDPA's softmax in another summation order: fp32 inputs agree with SDPA to ~1e-6; bf16 /
fp16 inputs round P and dS to the input dtype before their matmuls, as FlashAttention does.
Cost: on ORL's packed replay the visited tiles hold ~1.3-1.5 x the visible pairs (32-token states
and blocks inside 32..128-token tiles; `benchmarks/staircase_bench.py --dry-run` prints it), and the
backward recomputes P in two kernels (7 matmuls per tile pair against FlashAttention-2's 5, whose dQ
is an atomic sum): deterministic, at that price.
Importing this module works without Triton (the tables are torch); the kernels need it, and CPU
tensors need ``TRITON_INTERPRET=1`` set before Triton's first import (the tests; float32 there).
Shapes: B rows, T tokens, H query heads, Hkv key/value heads (g = H / Hkv), d head dim, NM / NN
query / key tiles (ceil(T / tile)).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from ..model.masks import visible

try:
    import triton
    import triton.language as tl
except ImportError:  # the package works without Triton; only the kernels need it
    triton = tl = None

EMPTY, PARTIAL, FULL = 0, 1, 2
LOG2E = 1.4426950408889634


# ---------------------------------------------------------------- tile tables (pure torch)

def tile_classes(block: torch.Tensor, state: torch.Tensor, segment: torch.Tensor, tile_m: int, tile_n: int,
                 max_elements: int = 1 << 25) -> torch.Tensor:
    """(B, NM, NN) int8 class (EMPTY / PARTIAL / FULL) of every (query tile, key tile) of the rule of
    `visible` over block, state, segment (each (B, T)). Exact: the rule is evaluated on every pair,
    ``max_elements`` pairs at a time. Positions past T count as invisible, so a ragged tile is never
    FULL."""
    B, T = block.shape
    NM, NN = -(-T // tile_m), -(-T // tile_n)
    out = torch.empty(B, NM, NN, dtype=torch.int8, device=block.device)
    per = max(1, max_elements // (B * tile_m * NN * tile_n))  # query tiles per chunk
    for i0 in range(0, NM, per):
        i1 = min(NM, i0 + per)
        r0, r1 = i0 * tile_m, min(T, i1 * tile_m)
        vis = visible(block[:, r0:r1], state[:, r0:r1], segment[:, r0:r1], block, state, segment)
        if r1 - r0 != (i1 - i0) * tile_m or T != NN * tile_n:
            pad = torch.zeros(B, (i1 - i0) * tile_m, NN * tile_n, dtype=torch.bool, device=block.device)
            pad[:, :r1 - r0, :T] = vis
            vis = pad
        t = vis.view(B, i1 - i0, tile_m, NN, tile_n)
        some, full = t.any(4).any(2), t.all(4).all(2)
        out[:, i0:i1] = torch.where(full, FULL, torch.where(some, PARTIAL, EMPTY)).to(torch.int8)
    return out


def coarsen(classes: torch.Tensor, fm: int, fn: int) -> torch.Tensor:
    """Classes (B, NM, NN) of fine tiles -> (B, ceil(NM / fm), ceil(NN / fn)) of tiles fm x fn times
    larger: EMPTY iff every sub-tile is EMPTY, FULL iff every sub-tile is FULL (sub-tiles past the
    end count as EMPTY, so a coarse tile reaching past T is never FULL)."""
    B, NM, NN = classes.shape
    cm, cn = -(-NM // fm), -(-NN // fn)
    c = torch.full((B, cm * fm, cn * fn), EMPTY, dtype=torch.int8, device=classes.device)
    c[:, :NM, :NN] = classes
    c = c.view(B, cm, fm, cn, fn)
    some, full = (c != EMPTY).any(4).any(2), (c == FULL).all(4).all(2)
    return torch.where(full, FULL, torch.where(some, PARTIAL, EMPTY)).to(torch.int8)


def tile_lists(classes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Classes (B, R, C) -> sparse lists along C: (partial_num (B, R) int32, partial_idx (B, R, C)
    int32, full_num, full_idx); the first ``num`` entries of ``idx`` are the C indices of that
    class in increasing order (the rest is filler no kernel reads)."""
    out = []
    for cls in (PARTIAL, FULL):
        sel = classes == cls
        out.append(sel.sum(-1, dtype=torch.int32))
        out.append(torch.argsort((~sel).to(torch.int8), dim=-1, stable=True).to(torch.int32).contiguous())
    return tuple(out)


@dataclass(frozen=True)
class TileTables:
    """The sparse tables of one kernel tile shape (tile_m query rows x tile_n key columns)."""

    tile_m: int
    tile_n: int
    classes: torch.Tensor   # (B, NM, NN) int8
    by_query: tuple         # per query tile, over key tiles: `tile_lists` (B, NM), (B, NM, NN) x 2
    by_key: tuple           # per key tile, over query tiles: (B, NN), (B, NN, NM) x 2

    def visited(self) -> int:
        """Tiles a pass visits (PARTIAL + FULL), over all rows (per head)."""
        return int(self.by_query[0].sum()) + int(self.by_query[2].sum())

    def total(self) -> int:
        """Tiles a dense pass would visit, B NM NN."""
        return self.classes.numel()


@dataclass(frozen=True)
class Tiles:
    """One kernel's tile and launch shape: m query rows x n key columns, Triton warps and stages."""

    m: int
    n: int
    warps: int = 4
    stages: int = 2


@dataclass(frozen=True)
class StaircaseConfig:
    """Tiles of the three kernels; every m and n a power-of-two multiple of the mask's base tile.
    The defaults were the fastest of `benchmarks/staircase_bench.py --sweep` for d = 128, bf16, on
    an H200 (T = 8192, 32:8 heads, the packed replay layout): small key tiles waste fewer invisible
    pairs on the 32-token staircase than FlashAttention's usual 128 x 64."""

    fwd: Tiles = Tiles(128, 32, 4, 3)
    dq: Tiles = Tiles(64, 64, 4, 2)
    dkdv: Tiles = Tiles(32, 64, 4, 3)

    def shapes(self) -> list[tuple[int, int]]:
        return [(t.m, t.n) for t in (self.fwd, self.dq, self.dkdv)]


def default_config(tile: int) -> StaircaseConfig:
    """`StaircaseConfig`'s tiles, each dimension at least ``tile``; below a 32 base tile (tests), every
    kernel runs at the base tile."""
    if tile < 32:
        t = Tiles(tile, tile, 4, 1)
        return StaircaseConfig(t, t, t)
    c = StaircaseConfig()
    return StaircaseConfig(*(Tiles(max(t.m, tile), max(t.n, tile), t.warps, t.stages) for t in (c.fwd, c.dq, c.dkdv)))


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


class StaircaseMask:
    """The visibility of B packed rows for `staircase_attention` (and, through
    `orl.model.layers.Attention`, for `Transformer.forward`'s ``mask``): the per-token metadata
    (block, state, segment each (B, T) integers, as `orl.model.masks.visible` takes them), the exact
    tile classes at the base ``tile`` (a power of two >= 16) and the tables of the kernel tiles of
    ``config`` (default `default_config(tile)`). Built once per packed batch and shared by every
    layer, as a BlockMask is; ``tables(m, n)`` adds other tile shapes (multiples of ``tile``)."""

    def __init__(self, block: torch.Tensor, state: torch.Tensor, segment: torch.Tensor, tile: int = 32,
                 config: StaircaseConfig | None = None):
        if not (block.shape == state.shape == segment.shape and block.dim() == 2):
            raise ValueError(f"block, state, segment must each be (B, T); got {tuple(block.shape)}, "
                             f"{tuple(state.shape)}, {tuple(segment.shape)} (PackedBatch.meta[:, i] gives them)")
        if not _pow2(tile) or tile < 16:
            raise ValueError(f"tile must be a power of two >= 16 (tl.dot's minimum), got {tile}")
        meta = torch.stack([block, state, segment], 1)
        if meta.is_floating_point() or meta.dtype == torch.bool:
            raise ValueError(f"block, state, segment must be integer tensors, got {meta.dtype}")
        lo, hi = torch.aminmax(meta)
        if int(lo) <= -2 ** 31 or int(hi) >= 2 ** 31:
            raise ValueError("block / state / segment ids must fit in int32 (the kernels read them as int32); "
                             "renumber them")
        self.shape = tuple(block.shape)
        self.tile = tile
        self.config = config or default_config(tile)
        meta[:, 1] = meta[:, 1].clamp(min=-1)  # every clean state -1: the same rule, and `_fold`'s -2 is free
        self.meta = meta.to(torch.int32).contiguous()        # (B, 3, T): block, state, segment
        self.classes = tile_classes(block, state, segment, tile, tile)  # (B, T / tile, T / tile) int8
        self._tables: dict[tuple[int, int], TileTables] = {}
        for m, n in self.config.shapes():
            self.tables(m, n)

    @property
    def device(self) -> torch.device:
        return self.meta.device

    def tables(self, tile_m: int, tile_n: int) -> TileTables:
        """The sparse tables for kernel tiles of tile_m x tile_n (cached)."""
        key = (tile_m, tile_n)
        if key not in self._tables:
            for t in key:
                if not _pow2(t) or t % self.tile:
                    raise ValueError(f"kernel tile {key} must be powers of two and multiples of the mask's base "
                                     f"tile {self.tile}; build the StaircaseMask with a smaller tile")
            c = coarsen(self.classes, tile_m // self.tile, tile_n // self.tile)
            self._tables[key] = TileTables(tile_m, tile_n, c, tile_lists(c), tile_lists(c.transpose(1, 2)))
        return self._tables[key]

    def dense(self) -> torch.Tensor:
        """(B, T, T) bool: the same visibility as a dense mask (small T only: tests, checks)."""
        b, s, g = self.meta.long().unbind(1)
        return visible(b, s, g, b, s, g)

    def to(self, device) -> StaircaseMask:
        """The same mask with its metadata and tables on ``device``."""
        out = object.__new__(StaircaseMask)
        out.__dict__.update(self.__dict__)
        out.meta, out.classes = self.meta.to(device), self.classes.to(device)
        out._tables = {k: TileTables(t.tile_m, t.tile_n, t.classes.to(device),
                                     tuple(x.to(device) for x in t.by_query), tuple(x.to(device) for x in t.by_key))
                       for k, t in self._tables.items()}
        return out

    def __repr__(self) -> str:
        B, T = self.shape
        return f"StaircaseMask(B={B}, T={T}, tile={self.tile}, config={self.config})"


# ---------------------------------------------------------------- kernels

if triton is not None:
    @triton.jit
    def _fold(qb, qs):
        """Query metadata folded for `_rule`: (qlim, qsx) = (block, -2) for a clean query, (block - 1,
        state) for a noisy one (the mask's states are >= -1, so no key has state -2)."""
        clean = qs < 0
        return tl.where(clean, qb, qb - 1), tl.where(clean, -2, qs)

    @triton.jit
    def _rule(qlim, qsx, qg, kb, ks, kg):
        """`orl.model.masks.visible` on broadcastable int32 tiles, the query side folded by `_fold`:
        clean q: clean k of block <= block(q); noisy q: clean k of block < block(q), or its own state."""
        return (qg == kg) & (((ks < 0) & (kb <= qlim)) | (ks == qsx))

    @triton.jit
    def _query_meta(META, b, T, offs_m, rm):
        """Row ``b``'s metadata base and its query tile's block, state (folded by `_fold`), segment."""
        META_b = META + b * 3 * T
        qb = tl.load(META_b + offs_m, mask=rm, other=0)
        qs = tl.load(META_b + T + offs_m, mask=rm, other=0)
        qg = tl.load(META_b + 2 * T + offs_m, mask=rm, other=0)
        qb, qs = _fold(qb, qs)
        return META_b, qb, qs, qg

    @triton.jit
    def _kv_tile(Kh, Vh, skt, svt, T, kt, MASKED: tl.constexpr, BN: tl.constexpr, D: tl.constexpr):
        """Key tile ``kt``'s K and V (BN, D), its key offsets and in-range flags; ``MASKED``: the
        loads stop at T (a partial tile at the end of a row)."""
        offs_n = kt * BN + tl.arange(0, BN)
        offs_d = tl.arange(0, D)
        cn = offs_n < T
        if MASKED:
            k = tl.load(Kh + offs_n[:, None] * skt + offs_d[None, :], mask=cn[:, None], other=0.0)
            v = tl.load(Vh + offs_n[:, None] * svt + offs_d[None, :], mask=cn[:, None], other=0.0)
        else:
            k = tl.load(Kh + offs_n[:, None] * skt + offs_d[None, :])
            v = tl.load(Vh + offs_n[:, None] * svt + offs_d[None, :])
        return k, v, offs_n, cn

    @triton.jit
    def _key_visible(qb, qs, qg, META_b, T, offs_n, cn):
        """(BM, BN) visibility of a query tile's rows (folded metadata) to the keys ``offs_n``."""
        kb = tl.load(META_b + offs_n, mask=cn, other=0)
        ks = tl.load(META_b + T + offs_n, mask=cn, other=0)
        kg = tl.load(META_b + 2 * T + offs_n, mask=cn, other=0)
        return _rule(qb[:, None], qs[:, None], qg[:, None], kb[None, :], ks[None, :], kg[None, :]) & cn[None, :]

    @triton.jit
    def _fwd_tile(acc, m_i, l_i, q, qb, qs, qg, Kh, Vh, skt, svt, META_b, T, kt, qk_scale,
                  MASKED: tl.constexpr, BN: tl.constexpr, D: tl.constexpr, PREC: tl.constexpr):
        k, v, offs_n, cn = _kv_tile(Kh, Vh, skt, svt, T, kt, MASKED, BN, D)
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale       # (BM, BN) scores in log2 units
        if MASKED:
            vis = _key_visible(qb, qs, qg, META_b, T, offs_n, cn)
            s = tl.where(vis, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PREC)
        return acc, m_new, l_i

    @triton.jit
    def _fwd_loop(acc, m_i, l_i, q, qb, qs, qg, Kh, Vh, skt, svt, META_b, T, NUM, IDX, row, NN, qk_scale,
                  MASKED: tl.constexpr, BN: tl.constexpr, D: tl.constexpr, PREC: tl.constexpr, WHILE: tl.constexpr):
        """The key tiles of one list (IDX[row, :NUM[row]]) of one query tile."""
        n = tl.load(NUM + row)
        if WHILE:  # the interpreter's range() cannot take a loaded bound (see `_while`)
            j = 0
            while j < n:
                acc, m_i, l_i = _fwd_tile(acc, m_i, l_i, q, qb, qs, qg, Kh, Vh, skt, svt, META_b, T,
                                          tl.load(IDX + row * NN + j), qk_scale, MASKED, BN, D, PREC)
                j += 1
        else:
            for j in range(n):
                acc, m_i, l_i = _fwd_tile(acc, m_i, l_i, q, qb, qs, qg, Kh, Vh, skt, svt, META_b, T,
                                          tl.load(IDX + row * NN + j), qk_scale, MASKED, BN, D, PREC)
        return acc, m_i, l_i

    @triton.jit
    def _fwd_kernel(Q, K, V, O, LSE, META, PNUM, PIDX, FNUM, FIDX,
                    sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot,
                    T, H, G, NM, NN, qk_scale,
                    D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, PREC: tl.constexpr, WHILE: tl.constexpr):
        i = tl.program_id(0)
        bh = tl.program_id(1)
        b = (bh // H).to(tl.int64)
        h = (bh % H).to(tl.int64)
        hk = h // G
        offs_m = i * BM + tl.arange(0, BM)
        offs_d = tl.arange(0, D)
        rm = offs_m < T
        q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqt + offs_d[None, :], mask=rm[:, None], other=0.0)
        META_b, qb, qs, qg = _query_meta(META, b, T, offs_m, rm)
        Kh = K + b * skb + hk * skh
        Vh = V + b * svb + hk * svh
        # finite start: a row whose first tile is all masked keeps exp2(m_i - m_new) = 1, not NaN
        m_i = tl.full([BM], -1.0e30, tl.float32)
        l_i = tl.zeros([BM], tl.float32)
        acc = tl.zeros([BM, D], tl.float32)
        row = b * NM + i
        acc, m_i, l_i = _fwd_loop(acc, m_i, l_i, q, qb, qs, qg, Kh, Vh, skt, svt, META_b, T, PNUM, PIDX, row, NN,
                                  qk_scale, True, BN, D, PREC, WHILE)
        acc, m_i, l_i = _fwd_loop(acc, m_i, l_i, q, qb, qs, qg, Kh, Vh, skt, svt, META_b, T, FNUM, FIDX, row, NN,
                                  qk_scale, False, BN, D, PREC, WHILE)
        l_i = tl.where(l_i > 0, l_i, 1.0)   # only rows past T have no key
        o = acc / l_i[:, None]
        tl.store(O + b * sob + h * soh + offs_m[:, None] * sot + offs_d[None, :], o.to(O.dtype.element_ty),
                 mask=rm[:, None])
        tl.store(LSE + bh.to(tl.int64) * T + offs_m, m_i + tl.math.log2(l_i), mask=rm)

    @triton.jit
    def _delta_kernel(O, DO, DELTA, sob, soh, sot, sdb, sdh, sdt, T, H, D: tl.constexpr, BM: tl.constexpr):
        i = tl.program_id(0)
        bh = tl.program_id(1)
        b = (bh // H).to(tl.int64)
        h = (bh % H).to(tl.int64)
        offs_m = i * BM + tl.arange(0, BM)
        offs_d = tl.arange(0, D)
        rm = offs_m < T
        o = tl.load(O + b * sob + h * soh + offs_m[:, None] * sot + offs_d[None, :], mask=rm[:, None], other=0.0)
        do = tl.load(DO + b * sdb + h * sdh + offs_m[:, None] * sdt + offs_d[None, :], mask=rm[:, None], other=0.0)
        tl.store(DELTA + bh.to(tl.int64) * T + offs_m, tl.sum(o.to(tl.float32) * do.to(tl.float32), 1), mask=rm)

    @triton.jit
    def _dq_tile(dq, q, do, lse, delta, qb, qs, qg, Kh, Vh, skt, svt, META_b, T, kt, qk_scale,
                 MASKED: tl.constexpr, BN: tl.constexpr, D: tl.constexpr, PREC: tl.constexpr):
        k, v, offs_n, cn = _kv_tile(Kh, Vh, skt, svt, T, kt, MASKED, BN, D)
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
        p = tl.math.exp2(s - lse[:, None])                                # P = exp(S - logsumexp)
        if MASKED:
            vis = _key_visible(qb, qs, qg, META_b, T, offs_n, cn)
            p = tl.where(vis, p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PREC)
        ds = p * (dp - delta[:, None])                                    # dS = P (dP - rowsum(dO O))
        return tl.dot(ds.to(k.dtype), k, dq, input_precision=PREC)

    @triton.jit
    def _dq_loop(dq, q, do, lse, delta, qb, qs, qg, Kh, Vh, skt, svt, META_b, T, NUM, IDX, row, NN, qk_scale,
                 MASKED: tl.constexpr, BN: tl.constexpr, D: tl.constexpr, PREC: tl.constexpr, WHILE: tl.constexpr):
        n = tl.load(NUM + row)
        if WHILE:
            j = 0
            while j < n:
                dq = _dq_tile(dq, q, do, lse, delta, qb, qs, qg, Kh, Vh, skt, svt, META_b, T,
                              tl.load(IDX + row * NN + j), qk_scale, MASKED, BN, D, PREC)
                j += 1
        else:
            for j in range(n):
                dq = _dq_tile(dq, q, do, lse, delta, qb, qs, qg, Kh, Vh, skt, svt, META_b, T,
                              tl.load(IDX + row * NN + j), qk_scale, MASKED, BN, D, PREC)
        return dq

    @triton.jit
    def _dq_kernel(Q, K, V, DO, LSE, DELTA, DQ, META, PNUM, PIDX, FNUM, FIDX,
                   sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdb, sdh, sdt, sgb, sgh, sgt,
                   T, H, G, NM, NN, qk_scale, scale,
                   D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, PREC: tl.constexpr, WHILE: tl.constexpr):
        i = tl.program_id(0)
        bh = tl.program_id(1)
        b = (bh // H).to(tl.int64)
        h = (bh % H).to(tl.int64)
        hk = h // G
        offs_m = i * BM + tl.arange(0, BM)
        offs_d = tl.arange(0, D)
        rm = offs_m < T
        q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqt + offs_d[None, :], mask=rm[:, None], other=0.0)
        do = tl.load(DO + b * sdb + h * sdh + offs_m[:, None] * sdt + offs_d[None, :], mask=rm[:, None], other=0.0)
        lse = tl.load(LSE + bh.to(tl.int64) * T + offs_m, mask=rm, other=0.0)
        delta = tl.load(DELTA + bh.to(tl.int64) * T + offs_m, mask=rm, other=0.0)
        META_b, qb, qs, qg = _query_meta(META, b, T, offs_m, rm)
        Kh = K + b * skb + hk * skh
        Vh = V + b * svb + hk * svh
        dq = tl.zeros([BM, D], tl.float32)
        row = b * NM + i
        dq = _dq_loop(dq, q, do, lse, delta, qb, qs, qg, Kh, Vh, skt, svt, META_b, T, PNUM, PIDX, row, NN, qk_scale,
                      True, BN, D, PREC, WHILE)
        dq = _dq_loop(dq, q, do, lse, delta, qb, qs, qg, Kh, Vh, skt, svt, META_b, T, FNUM, FIDX, row, NN, qk_scale,
                      False, BN, D, PREC, WHILE)
        tl.store(DQ + b * sgb + h * sgh + offs_m[:, None] * sgt + offs_d[None, :], (dq * scale).to(DQ.dtype.element_ty),
                 mask=rm[:, None])

    @triton.jit
    def _dkdv_tile(dk, dv, k, v, kb, ks, kg, Qh, DOh, LSEh, DELTAh, sqt, sdt, META_b, T, qt, qk_scale,
                   MASKED: tl.constexpr, BM: tl.constexpr, D: tl.constexpr, PREC: tl.constexpr):
        offs_m = qt * BM + tl.arange(0, BM)
        offs_d = tl.arange(0, D)
        if MASKED:
            rm = offs_m < T
            q = tl.load(Qh + offs_m[:, None] * sqt + offs_d[None, :], mask=rm[:, None], other=0.0)
            do = tl.load(DOh + offs_m[:, None] * sdt + offs_d[None, :], mask=rm[:, None], other=0.0)
            lse = tl.load(LSEh + offs_m, mask=rm, other=0.0)
            delta = tl.load(DELTAh + offs_m, mask=rm, other=0.0)
        else:
            q = tl.load(Qh + offs_m[:, None] * sqt + offs_d[None, :])
            do = tl.load(DOh + offs_m[:, None] * sdt + offs_d[None, :])
            lse = tl.load(LSEh + offs_m)
            delta = tl.load(DELTAh + offs_m)
        sT = tl.dot(k, tl.trans(q), input_precision=PREC) * qk_scale     # (BN, BM) = S^T
        pT = tl.math.exp2(sT - lse[None, :])
        if MASKED:
            qb = tl.load(META_b + offs_m, mask=rm, other=0)
            qs = tl.load(META_b + T + offs_m, mask=rm, other=0)
            qg = tl.load(META_b + 2 * T + offs_m, mask=rm, other=0)
            qb, qs = _fold(qb, qs)
            vis = _rule(qb[None, :], qs[None, :], qg[None, :], kb[:, None], ks[:, None], kg[:, None]) & rm[None, :]
            pT = tl.where(vis, pT, 0.0)
        dv = tl.dot(pT.to(do.dtype), do, dv, input_precision=PREC)      # dV += P^T dO
        dpT = tl.dot(v, tl.trans(do), input_precision=PREC)
        dsT = pT * (dpT - delta[None, :])
        dk = tl.dot(dsT.to(q.dtype), q, dk, input_precision=PREC)       # dK += dS^T Q (times scale at the end)
        return dk, dv

    @triton.jit
    def _dkdv_loop(dk, dv, k, v, kb, ks, kg, Qh, DOh, LSEh, DELTAh, sqt, sdt, META_b, T, NUM, IDX, col, NM, qk_scale,
                   MASKED: tl.constexpr, BM: tl.constexpr, D: tl.constexpr, PREC: tl.constexpr, WHILE: tl.constexpr):
        """The query tiles of one list (IDX[col, :NUM[col]]) of one key tile, for one query head."""
        n = tl.load(NUM + col)
        if WHILE:
            i = 0
            while i < n:
                dk, dv = _dkdv_tile(dk, dv, k, v, kb, ks, kg, Qh, DOh, LSEh, DELTAh, sqt, sdt, META_b, T,
                                    tl.load(IDX + col * NM + i), qk_scale, MASKED, BM, D, PREC)
                i += 1
        else:
            for i in range(n):
                dk, dv = _dkdv_tile(dk, dv, k, v, kb, ks, kg, Qh, DOh, LSEh, DELTAh, sqt, sdt, META_b, T,
                                    tl.load(IDX + col * NM + i), qk_scale, MASKED, BM, D, PREC)
        return dk, dv

    @triton.jit
    def _dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, META, PNUM, PIDX, FNUM, FIDX,
                     sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sdb, sdh, sdt,
                     skgb, skgh, skgt, svgb, svgh, svgt,
                     T, H, HKV, NM, NN, qk_scale, scale, G: tl.constexpr,
                     D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, PREC: tl.constexpr, WHILE: tl.constexpr):
        j = tl.program_id(0)
        bhk = tl.program_id(1)
        b = (bhk // HKV).to(tl.int64)
        hk = (bhk % HKV).to(tl.int64)
        offs_n = j * BN + tl.arange(0, BN)
        offs_d = tl.arange(0, D)
        cn = offs_n < T
        k = tl.load(K + b * skb + hk * skh + offs_n[:, None] * skt + offs_d[None, :], mask=cn[:, None], other=0.0)
        v = tl.load(V + b * svb + hk * svh + offs_n[:, None] * svt + offs_d[None, :], mask=cn[:, None], other=0.0)
        META_b = META + b * 3 * T
        kb = tl.load(META_b + offs_n, mask=cn, other=0)
        ks = tl.load(META_b + T + offs_n, mask=cn, other=0)
        kg = tl.load(META_b + 2 * T + offs_n, mask=cn, other=0)
        dk = tl.zeros([BN, D], tl.float32)
        dv = tl.zeros([BN, D], tl.float32)
        col = b * NN + j
        for g in range(G):   # the query heads sharing this KV head: one program owns dK, dV
            h = hk * G + g
            Qh = Q + b * sqb + h * sqh
            DOh = DO + b * sdb + h * sdh
            LSEh = LSE + (b * H + h) * T
            DELTAh = DELTA + (b * H + h) * T
            dk, dv = _dkdv_loop(dk, dv, k, v, kb, ks, kg, Qh, DOh, LSEh, DELTAh, sqt, sdt, META_b, T, PNUM, PIDX,
                                col, NM, qk_scale, True, BM, D, PREC, WHILE)
            dk, dv = _dkdv_loop(dk, dv, k, v, kb, ks, kg, Qh, DOh, LSEh, DELTAh, sqt, sdt, META_b, T, FNUM, FIDX,
                                col, NM, qk_scale, False, BM, D, PREC, WHILE)
        tl.store(DK + b * skgb + hk * skgh + offs_n[:, None] * skgt + offs_d[None, :],
                 (dk * scale).to(DK.dtype.element_ty), mask=cn[:, None])
        tl.store(DV + b * svgb + hk * svgh + offs_n[:, None] * svgt + offs_d[None, :], dv.to(DV.dtype.element_ty),
                 mask=cn[:, None])


# ---------------------------------------------------------------- launchers and autograd

def _check(q, k, v, mask) -> None:
    if triton is None:
        raise RuntimeError("staircase_attention needs Triton (pip install triton); or use the dense mask / "
                           "FlexAttention BlockMask of the same layout")
    if q.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(f"staircase_attention runs on CUDA tensors (got {q.device}); on the CPU only under "
                           "TRITON_INTERPRET=1 set before Triton's first import (tests)")
    if q.dim() != 4 or k.dim() != 4 or k.shape != v.shape:
        raise ValueError(f"q must be (B, H, T, d) and k, v (B, Hkv, T, d); got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    B, H, T, d = q.shape
    if k.shape[0] != B or k.shape[2:] != (T, d) or H % k.shape[1]:
        raise ValueError(f"k, v {tuple(k.shape)} do not fit q {tuple(q.shape)}: need (B, Hkv, T, d) with H a "
                         "multiple of Hkv")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"q, k, v must share one dtype of float32 / bfloat16 / float16; got {q.dtype}, "
                         f"{k.dtype}, {v.dtype}")
    if not _pow2(d) or not 16 <= d <= 128:
        raise ValueError(f"head dim must be a power of two in 16..128, got {d}; use the dense mask for others")
    if not isinstance(mask, StaircaseMask):
        raise TypeError(f"mask must be a StaircaseMask, got {type(mask).__name__}")
    if mask.shape != (B, T):
        raise ValueError(f"mask is for (B, T) = {mask.shape}, q for {(B, T)}")
    if mask.device != q.device:
        raise ValueError(f"mask is on {mask.device}, q on {q.device}; move it with mask.to(q.device)")


def _last_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _while() -> bool:
    """Loop over a table's tiles with ``while`` instead of ``range``: only in Triton's interpreter,
    whose ``range`` cannot take a bound loaded from memory (its scalars are 1-element numpy arrays,
    which numpy >= 2.4 refuses to convert to int). On the GPU a ``for`` loop, which Triton pipelines."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def _prec(dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"   # fp32: exact products; bf16/fp16: unused


def _forward(q, k, v, mask: StaircaseMask, scale: float, cfg: StaircaseConfig):
    B, H, T, d = q.shape
    Hkv = k.shape[1]
    t = cfg.fwd
    tb = mask.tables(t.m, t.n)
    NM, NN = tb.classes.shape[1:]
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(B, H, T, dtype=torch.float32, device=q.device)
    _fwd_kernel[(NM, B * H)](
        q, k, v, o, lse, mask.meta, *tb.by_query,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), o.stride(0), o.stride(1), o.stride(2),
        T, H, H // Hkv, NM, NN, scale * LOG2E,
        D=d, BM=t.m, BN=t.n, PREC=_prec(q.dtype), WHILE=_while(), num_warps=t.warps, num_stages=t.stages)
    return o, lse


def _backward(do, q, k, v, o, lse, mask: StaircaseMask, scale: float, cfg: StaircaseConfig):
    B, H, T, d = q.shape
    Hkv = k.shape[1]
    do = _last_contiguous(do)
    delta = torch.empty_like(lse)
    BM = 64
    _delta_kernel[(triton.cdiv(T, BM), B * H)](o, do, delta, o.stride(0), o.stride(1), o.stride(2),
                                               do.stride(0), do.stride(1), do.stride(2), T, H, D=d, BM=BM)
    dq = torch.empty_like(q, memory_format=torch.contiguous_format)
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    dv = torch.empty_like(v, memory_format=torch.contiguous_format)
    strides = [x.stride(i) for x in (q, k, v, do) for i in range(3)]
    t = cfg.dq
    tb = mask.tables(t.m, t.n)
    NM, NN = tb.classes.shape[1:]
    _dq_kernel[(NM, B * H)](
        q, k, v, do, lse, delta, dq, mask.meta, *tb.by_query, *strides, dq.stride(0), dq.stride(1), dq.stride(2),
        T, H, H // Hkv, NM, NN, scale * LOG2E, scale,
        D=d, BM=t.m, BN=t.n, PREC=_prec(q.dtype), WHILE=_while(), num_warps=t.warps, num_stages=t.stages)
    t = cfg.dkdv
    tb = mask.tables(t.m, t.n)
    NM, NN = tb.classes.shape[1:]
    _dkdv_kernel[(NN, B * Hkv)](
        q, k, v, do, lse, delta, dk, dv, mask.meta, *tb.by_key, *strides,
        dk.stride(0), dk.stride(1), dk.stride(2), dv.stride(0), dv.stride(1), dv.stride(2),
        T, H, Hkv, NM, NN, scale * LOG2E, scale, G=H // Hkv,
        D=d, BM=t.m, BN=t.n, PREC=_prec(q.dtype), WHILE=_while(), num_warps=t.warps, num_stages=t.stages)
    return dq, dk, dv


class _StaircaseAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask, scale, cfg):
        q, k, v = _last_contiguous(q), _last_contiguous(k), _last_contiguous(v)
        o, lse = _forward(q, k, v, mask, scale, cfg)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.mask, ctx.scale, ctx.cfg = mask, scale, cfg
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = _backward(do, q, k, v, o, lse, ctx.mask, ctx.scale, ctx.cfg)
        return dq, dk, dv, None, None, None


def staircase_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: StaircaseMask,
                        scale: float | None = None, config: StaircaseConfig | None = None) -> torch.Tensor:
    """softmax(scale q k^T over the keys ``mask`` lets each query see) v, differentiable in q, k, v.

    q (B, H, T, d), k / v (B, Hkv, T, d) with H a multiple of Hkv (GQA), one dtype of float32 /
    bfloat16 / float16, d a power of two in 16..128; ``mask`` a `StaircaseMask` of (B, T) on q's
    device; ``scale`` default d^-1/2; ``config`` default ``mask.config``. Returns (B, H, T, d), equal
    to ``F.scaled_dot_product_attention(q, k, v, attn_mask=mask.dense()[:, None], scale=scale,
    enable_gqa=True)``."""
    _check(q, k, v, mask)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")
    return _StaircaseAttention.apply(q, k, v, mask, scale, config or mask.config)
