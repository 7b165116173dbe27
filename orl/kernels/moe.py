"""Triton kernels of the engine's grouped MoE (`orl.engine.moe` owns the layout and the contract).

The router (`orl.engine.moe.route_triton` owns its contract):
  ``orl_moe_route``    grid (tokens / BLOCK_T, experts / BLOCK_E): router logits of a token tile and
                       an expert block; the tile's last block (a split counter) takes softmax, top-k,
                       renormalisation and the Gemma 4 scales and writes the k (weight, id) of each
                       token in ascending id (`orl.engine.moe.route`, in one launch)
Three kernels over the (token, expert) assignments sorted by expert, grouped into slots (one
slot per expert the tokens route to; ``count == 0`` marks an inactive slot), and the layout:
  ``orl_moe_plan``     grid (1,): `orl.engine.moe.plan` (sort by expert, slots, inverse permutation)
                       plus the routing weights in sorted order, in one program
  ``orl_moe_gate_up``  grid (slots, I / BLOCK_I): h[p] = act(x[tok p] Wg^T) * (x[tok p] Wu^T)
  ``orl_moe_down``     grid (slots, D / BLOCK_N): y[p] = weight[p] * (h[p] Wd^T)
  ``orl_moe_combine``  grid (tokens, D / BLOCK): out[t] = sum over t's k pairs in expert order
                       (+ the shared expert), rounded after every add as the reference's
                       sequential ``index_add_``
A program loads its expert's weight tile once per BLOCK_T tokens of the slot (once per round at
batch 1); an inactive slot skips its loop and reads nothing. Shapes are compile-time constants
(one compilation per model shape); the token-tile loop runs TILES (a power of two >= N / BLOCK_T)
times, so prefills of any length share a few compilations. Rounding follows `MoE.forward` in
the tensors' dtype (the linear outputs, the activation and the product are each rounded); fp32
dots use IEEE precision (no TF32), as torch does by default.
Importing this module imports Triton; `TRITON_INTERPRET=1` (set before the import) runs the kernels
on CPU tensors (fp32 only: bf16 is broken in the interpreter).
Does not own: the routing and layout contracts (`orl.engine.moe.route`, `orl.engine.moe.plan`), the
PyTorch twin.
"""
import triton
import triton.language as tl


@triton.jit
def _act(g, GELU: tl.constexpr):
    if GELU:  # tanh-approximate GELU, with tanh(a) = 1 - 2 / (exp(2a) + 1)
        a = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        a = tl.minimum(tl.maximum(a, -15.0), 15.0)  # tanh(15) is 1 in fp32; no exp overflow
        y = 0.5 * g * (2.0 - 2.0 / (tl.exp(2.0 * a) + 1.0))
    else:
        y = g / (1.0 + tl.exp(-g))  # silu, as torch computes it
    return y


@triton.jit
def orl_moe_gate_up(x_ptr, w_ptr, tok_ptr, start_ptr, count_ptr, expert_ptr, h_ptr, D: tl.constexpr, I: tl.constexpr,
                    TILES: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_D: tl.constexpr,
                    GELU: tl.constexpr, FP32: tl.constexpr):
    OUT = h_ptr.dtype.element_ty
    m = tl.program_id(0)
    ib = tl.program_id(1)
    count = tl.load(count_ptr + m)
    start = tl.load(start_ptr + m)
    e = tl.load(expert_ptr + m).to(tl.int64)
    offs_i = ib * BLOCK_I + tl.arange(0, BLOCK_I)
    mi = offs_i < I
    wg_ptr = w_ptr + e * 2 * I * D + offs_i[None, :].to(tl.int64) * D
    wu_ptr = wg_ptr + I * D
    for tt in range(TILES):
        t0 = tt * BLOCK_T
        if t0 < count:  # an inactive slot (count 0) reads no weights
            offs_t = t0 + tl.arange(0, BLOCK_T)
            mt = offs_t < count
            tok = tl.load(tok_ptr + start + offs_t, mask=mt, other=0)
            acc_g = tl.zeros((BLOCK_T, BLOCK_I), dtype=tl.float32)
            acc_u = tl.zeros((BLOCK_T, BLOCK_I), dtype=tl.float32)
            for d0 in range(0, D, BLOCK_D):
                offs_d = d0 + tl.arange(0, BLOCK_D)
                md = offs_d < D
                xt = tl.load(x_ptr + tok[:, None] * D + offs_d[None, :], mask=mt[:, None] & md[None, :], other=0.0)
                wm = md[:, None] & mi[None, :]
                wg = tl.load(wg_ptr + offs_d[:, None], mask=wm, other=0.0)
                wu = tl.load(wu_ptr + offs_d[:, None], mask=wm, other=0.0)
                if FP32:
                    acc_g = tl.dot(xt, wg, acc_g, input_precision="ieee")
                    acc_u = tl.dot(xt, wu, acc_u, input_precision="ieee")
                else:
                    acc_g = tl.dot(xt, wg, acc_g)
                    acc_u = tl.dot(xt, wu, acc_u)
            g = acc_g.to(OUT).to(tl.float32)
            u = acc_u.to(OUT).to(tl.float32)
            a = _act(g, GELU).to(OUT).to(tl.float32)
            tl.store(h_ptr + (start + offs_t)[:, None] * I + offs_i[None, :], (a * u).to(OUT),
                     mask=mt[:, None] & mi[None, :])


@triton.jit
def orl_moe_down(h_ptr, w_ptr, wt_ptr, start_ptr, count_ptr, expert_ptr, y_ptr, D: tl.constexpr, I: tl.constexpr,
                 TILES: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 GEMMA: tl.constexpr, FP32: tl.constexpr):
    OUT = y_ptr.dtype.element_ty
    m = tl.program_id(0)
    nb = tl.program_id(1)
    count = tl.load(count_ptr + m)
    start = tl.load(start_ptr + m)
    e = tl.load(expert_ptr + m).to(tl.int64)
    offs_n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    mn = offs_n < D
    wd_ptr = w_ptr + e * D * I + offs_n[None, :].to(tl.int64) * I
    for tt in range(TILES):
        t0 = tt * BLOCK_T
        if t0 < count:
            offs_t = t0 + tl.arange(0, BLOCK_T)
            mt = offs_t < count
            rows = start + offs_t
            acc = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
            for k0 in range(0, I, BLOCK_K):
                offs_k = k0 + tl.arange(0, BLOCK_K)
                mk = offs_k < I
                hv = tl.load(h_ptr + rows[:, None] * I + offs_k[None, :], mask=mt[:, None] & mk[None, :], other=0.0)
                wd = tl.load(wd_ptr + offs_k[:, None], mask=mk[:, None] & mn[None, :], other=0.0)
                if FP32:
                    acc = tl.dot(hv, wd, acc, input_precision="ieee")
                else:
                    acc = tl.dot(hv, wd, acc)
            y = acc.to(OUT).to(tl.float32)
            wt = tl.load(wt_ptr + rows, mask=mt, other=0.0)
            if GEMMA:  # weight in float32, product cast (HF Gemma 4)
                y = y * wt[:, None]
            else:      # weight cast to the dtype first (LLaDA path of MoE.forward)
                y = y * wt.to(OUT).to(tl.float32)[:, None]
            tl.store(y_ptr + rows[:, None] * D + offs_n[None, :], y.to(OUT), mask=mt[:, None] & mn[None, :])


@triton.jit
def orl_moe_combine(y_ptr, pos_ptr, shared_ptr, out_ptr, D: tl.constexpr, K_TOP: tl.constexpr, BLOCK: tl.constexpr,
                    HAS_SHARED: tl.constexpr):
    OUT = out_ptr.dtype.element_ty
    t = tl.program_id(0)
    b = tl.program_id(1)
    offs = b * BLOCK + tl.arange(0, BLOCK)
    m = offs < D
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for j in tl.static_range(K_TOP):
        p = tl.load(pos_ptr + t * K_TOP + j)
        acc = (acc + tl.load(y_ptr + p * D + offs, mask=m, other=0.0).to(tl.float32)).to(OUT).to(tl.float32)
    if HAS_SHARED:
        acc = acc + tl.load(shared_ptr + t * D + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * D + offs, acc.to(OUT), mask=m)


@triton.jit
def orl_moe_plan(ids_ptr, w_ptr, order_ptr, tok_ptr, pos_ptr, wsorted_ptr, start_ptr, count_ptr, expert_ptr,
                 NK, M, K_TOP: tl.constexpr, BLOCK: tl.constexpr, BLOCK_E: tl.constexpr, ONE: tl.constexpr):
    """`orl.engine.moe.plan` in one program (grid (1,)) over the NK = N k assignments, ids in [0, E).
    Per expert its count (tl.histogram) and first sorted position (exclusive cumsum); within a chunk
    of BLOCK assignments the keys ``expert * BLOCK + index`` (unique, so the sort is stable) are
    sorted in registers (tl.sort); an assignment's sorted position is its expert's first position
    plus that expert's assignments in earlier chunks plus its rank among them in its chunk. Slot
    m < M holds the m-th expert present (count, start, expert); the inactive slots after them hold
    count 0, start NK and expert 0 (as `plan`). Also writes wsorted[s] = w[order[s]] (float32).
    Nothing is written and read back, so no barrier. ONE: NK <= BLOCK (one chunk, no tl.gather)."""
    offs_e = tl.arange(0, BLOCK_E)
    offs = tl.arange(0, BLOCK)
    if ONE:
        mask = offs < NK
        e = tl.load(ids_ptr + offs, mask=mask, other=0).to(tl.int32)
        hist = tl.histogram(e, BLOCK_E, mask=mask)
    else:
        hist = tl.zeros((BLOCK_E,), dtype=tl.int32)
        c0 = tl.full((), 0, tl.int32)
        while c0 < NK:  # (a while loop: the interpreter cannot range() over a runtime bound)
            mask = c0 + offs < NK
            ec = tl.load(ids_ptr + c0 + offs, mask=mask, other=0).to(tl.int32)
            hist += tl.histogram(ec, BLOCK_E, mask=mask)
            c0 += BLOCK
    active = hist > 0
    slot = tl.cumsum(active.to(tl.int32), 0) - active.to(tl.int32)
    first = tl.cumsum(hist, 0) - hist
    n_active = tl.sum(active.to(tl.int32), 0)
    tl.store(count_ptr + slot, hist.to(tl.int64), mask=active)
    tl.store(start_ptr + slot, first.to(tl.int64), mask=active)
    tl.store(expert_ptr + slot, offs_e.to(tl.int64), mask=active)
    idle = (offs_e >= n_active) & (offs_e < M)  # inactive slots (disjoint from the active ones)
    tl.store(count_ptr + offs_e, tl.zeros((BLOCK_E,), dtype=tl.int64), mask=idle)
    tl.store(start_ptr + offs_e, tl.zeros((BLOCK_E,), dtype=tl.int64) + NK, mask=idle)
    tl.store(expert_ptr + offs_e, tl.zeros((BLOCK_E,), dtype=tl.int64), mask=idle)
    if ONE:
        key = tl.where(mask, e * BLOCK + offs, BLOCK_E * BLOCK)  # the padding sorts last
        p = tl.sort(key, 0) % BLOCK           # order: the assignment at sorted position offs
        ms = offs < NK
        tl.store(order_ptr + offs, p.to(tl.int64), mask=ms)
        tl.store(tok_ptr + offs, (p // K_TOP).to(tl.int64), mask=ms)
        tl.store(pos_ptr + p, offs.to(tl.int64), mask=ms)
        tl.store(wsorted_ptr + offs, tl.load(w_ptr + p, mask=ms, other=0.0).to(tl.float32), mask=ms)
    else:
        base = first  # per expert: its first sorted position not yet taken by an earlier chunk
        c0 = tl.full((), 0, tl.int32)
        while c0 < NK:
            mask = c0 + offs < NK
            ec = tl.load(ids_ptr + c0 + offs, mask=mask, other=0).to(tl.int32)
            ch = tl.histogram(ec, BLOCK_E, mask=mask)
            key = tl.where(mask, ec * BLOCK + offs, BLOCK_E * BLOCK)
            sk = tl.sort(key, 0)
            ms = offs < NK - c0
            se = tl.where(ms, sk // BLOCK, 0)
            # sorted chunk position offs of expert se -> base[se] + offs - (se's first position in the chunk)
            s = tl.gather(base - (tl.cumsum(ch, 0) - ch), se, 0) + offs
            p = c0 + sk % BLOCK
            tl.store(order_ptr + s, p.to(tl.int64), mask=ms)
            tl.store(tok_ptr + s, (p // K_TOP).to(tl.int64), mask=ms)
            tl.store(pos_ptr + p, s.to(tl.int64), mask=ms)
            tl.store(wsorted_ptr + s, tl.load(w_ptr + p, mask=ms, other=0.0).to(tl.float32), mask=ms)
            base += ch
            c0 += BLOCK


@triton.jit
def _route_tail(lg, offs_t, N, pes_ptr, w_ptr, ids_ptr, E: tl.constexpr, E_PAD: tl.constexpr, K_TOP: tl.constexpr,
                BLOCK_T: tl.constexpr, NORM: tl.constexpr, GEMMA: tl.constexpr):
    """Router logits lg (BLOCK_T, E_PAD) float32 of tokens offs_t -> their k weights and ids, each row
    in ascending id: softmax, top-k by value (of equal values the lower id first: torch.topk's CUDA
    order), renormalised (NORM), times the per-expert scale (GEMMA), stored at the slot given by the
    id's rank among the row's k (a cumsum of the selection; no sort)."""
    offs_e = tl.arange(0, E_PAD)
    valid = (offs_e < E)[None, :]
    lg = tl.where(valid, lg, float("-inf"))
    ex = tl.exp(lg - tl.max(lg, 1)[:, None])  # the padding: exp(-inf) = 0
    p = tl.math.div_rn(ex, tl.sum(ex, 1)[:, None])
    left = tl.where(valid, p, -1.0)  # probabilities are >= 0: the padding is never picked (k <= E)
    sel = tl.zeros((BLOCK_T, E_PAD), dtype=tl.int32)
    tot = tl.zeros((BLOCK_T,), dtype=tl.float32)
    for j in tl.static_range(K_TOP):  # the j-th largest; summed in descending order as w.sum(-1)
        m = tl.max(left, 1)
        i = tl.min(tl.where(left == m[:, None], offs_e[None, :], E_PAD), 1)
        hit = offs_e[None, :] == i[:, None]
        sel = tl.where(hit, 1, sel)
        left = tl.where(hit, -2.0, left)
        tot += m
    w = p
    if NORM:
        w = tl.math.div_rn(p, tot[:, None])
    if GEMMA:
        w = w * tl.load(pes_ptr + offs_e, mask=offs_e < E, other=0.0).to(tl.float32)[None, :]
    dst = offs_t[:, None] * K_TOP + tl.cumsum(sel, 1) - sel
    ms = (sel > 0) & (offs_t < N)[:, None]
    tl.store(w_ptr + dst, w, mask=ms)
    tl.store(ids_ptr + dst, (offs_e[None, :] + tl.zeros((BLOCK_T, E_PAD), dtype=tl.int32)).to(tl.int64), mask=ms)


@triton.jit
def orl_moe_route(x_ptr, r_ptr, rscale_ptr, pes_ptr, lg_ptr, cnt_ptr, w_ptr, ids_ptr, N, eps, x_mul,
                  D: tl.constexpr, E: tl.constexpr, K_TOP: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr,
                  E_PAD: tl.constexpr, BLOCK_D: tl.constexpr, NORM: tl.constexpr, GEMMA: tl.constexpr,
                  FP32: tl.constexpr):
    """`orl.engine.moe.route` in one launch, grid (tokens / BLOCK_T, E_PAD / BLOCK_E): program
    (tb, s) computes the router logits of tokens tb*BLOCK_T.. for experts s*BLOCK_E.. (x @ W^T in
    float32, rounded to x's dtype as F.linear's output); with one split (BLOCK_E == E_PAD) it goes
    on to `_route_tail`, else it writes them to lg (token tile rows, E_PAD) and the last split of
    the tile to arrive (a counter per tile, acquire/release, reset to 0 by that program, so graph
    replays find it zero) reads the tile's logits back and runs `_route_tail`.
    GEMMA: x is first replaced by round(round(round(x * rsqrt(mean(x^2) + eps)) * scale) * x_mul)
    (the scale-free RMSNorm, router_scale, D^-1/2, each rounded to x's dtype as torch would)."""
    OUT = x_ptr.dtype.element_ty
    tb = tl.program_id(0)
    s = tl.program_id(1)
    offs_t = tb * BLOCK_T + tl.arange(0, BLOCK_T)
    mt = offs_t < N
    offs_e = s * BLOCK_E + tl.arange(0, BLOCK_E)
    me = offs_e < E
    x_rows = x_ptr + offs_t[:, None].to(tl.int64) * D
    if GEMMA:
        ss = tl.zeros((BLOCK_T,), dtype=tl.float32)
        for d0 in range(0, D, BLOCK_D):
            offs_d = d0 + tl.arange(0, BLOCK_D)
            xf = tl.load(x_rows + offs_d[None, :], mask=mt[:, None] & (offs_d < D)[None, :], other=0.0).to(tl.float32)
            ss += tl.sum(xf * xf, 1)
        rs = tl.math.rsqrt(ss * (1.0 / D) + eps)
    acc = tl.zeros((BLOCK_T, BLOCK_E), dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        offs_d = d0 + tl.arange(0, BLOCK_D)
        md = offs_d < D
        xt = tl.load(x_rows + offs_d[None, :], mask=mt[:, None] & md[None, :], other=0.0)
        if GEMMA:
            xn = (xt.to(tl.float32) * rs[:, None]).to(OUT).to(tl.float32)
            sc = tl.load(rscale_ptr + offs_d, mask=md, other=0.0).to(tl.float32)
            xn = (xn * sc[None, :]).to(OUT).to(tl.float32)
            xt = (xn * x_mul).to(OUT)
        wt = tl.load(r_ptr + offs_e[:, None].to(tl.int64) * D + offs_d[None, :], mask=me[:, None] & md[None, :],
                     other=0.0)
        if FP32:
            acc = tl.dot(xt, tl.trans(wt), acc, input_precision="ieee")
        else:
            acc = tl.dot(xt, tl.trans(wt), acc)
    lg = acc.to(OUT).to(tl.float32)
    if BLOCK_E == E_PAD:
        _route_tail(lg, offs_t, N, pes_ptr, w_ptr, ids_ptr, E, E_PAD, K_TOP, BLOCK_T, NORM, GEMMA)
    else:
        rows = offs_t[:, None].to(tl.int64) * E_PAD
        tl.store(lg_ptr + rows + offs_e[None, :], lg)
        tl.debug_barrier()  # every thread's logits are written before the release below
        done = tl.atomic_add(cnt_ptr + tb, 1, sem="acq_rel")
        if done == E_PAD // BLOCK_E - 1:  # the last split of this token tile routes it
            lg_all = tl.load(lg_ptr + rows + tl.arange(0, E_PAD)[None, :], cache_modifier=".cg")
            _route_tail(lg_all, offs_t, N, pes_ptr, w_ptr, ids_ptr, E, E_PAD, K_TOP, BLOCK_T, NORM, GEMMA)
            tl.atomic_xchg(cnt_ptr + tb, 0)  # ready for the next launch (graph replays too)
