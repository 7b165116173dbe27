"""Triton kernels of the engine's grouped MoE (`orl.engine.moe` owns the layout and the contract).

Three kernels over the (token, expert) assignments sorted by expert, grouped into slots (one
slot per expert the tokens route to; ``count == 0`` marks an inactive slot):
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
Does not own: routing, the layout (`orl.engine.moe.plan`), the PyTorch twin.
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
