"""Triton kernel of a round's per-position work over the logits: DiffusionGemma's (`orl.engine.rules.canvas_round`
owns the contract: ``canvas_round`` is the reference, ``canvas_round_fused`` calls ``round_rows``) and,
with the logsumexp, the mask rules' distribution (`orl.engine.rules.MaskRule`, sampler "triton").

One program per canvas position (row of V logits), ``orl_dgemma_rows``:
  pass 1   read the row once in blocks of BLOCK: lg = logits / T (IEEE division, as torch), and per block
           its max bm, the first index of that max, s = sum exp(lg - bm), t = sum exp(lg - bm) (lg - bm)
           (and, when the self-conditioning distribution is over lg rounded to bf16/fp16, the same sum
           over the rounded values); the per-block numbers stay in registers (NB of them).
  combine  M = max bm; w_b = s_b exp(bm_b - M); S = sum w_b; the argmax (first max, as torch.argmax);
           the entropy in nats H = log S - T / S with T = sum exp(bm_b - M) (t_b + (bm_b - M) s_b)
           (= -sum p log p of softmax(lg), `orl.decode.samplers.dgemma_entropy`).
  sample   (not greedy) target = u * S for the row's uniform u; the block b* holding the target from the
           inclusive prefix sums of w (none: V - 1, torch's clamp); that one block is read again and the
           token is the first index whose cumulative exp(lg - M) (carried from the prefix before b*)
           exceeds the target -- `orl.decode.rng.sample_inverse_cdf`'s rule without normalising.
  probs    (only when asked) pass 2: the self-conditioning probabilities softmax(lg.to(dtype)) in float32
           (`orl.decode.samplers.dgemma_selfcond_probs`), written in the output's dtype (the embedding's:
           `orl.engine.forward.soft_embed` casts them to it anyway).
So a round reads the logits once (+ one block per row when sampling), twice with the probabilities,
which it then writes once; the torch reference makes ~16 full-size passes.
Numerics: the same rules (temperature division, first-max argmax, entropy in nats, first index whose
cumulative probability exceeds u * total, clamped to V - 1), but other summation orders and Triton's
exp/log (approximate on the GPU): entropies and probabilities agree with the torch path to float32
rounding (~1e-6 relative), and a token or an acceptance can differ only where u * total falls within
rounding of a cumulative boundary or an entropy sits at the acceptance/stop threshold.
Shapes are compile-time constants (one compilation per V, block, greedy/probs flags). Graph-safe: no
host reads. Importing this module imports Triton; `TRITON_INTERPRET=1` (set before the import) runs the
kernel on CPU tensors (float32: bf16 is unreliable in the interpreter).
Shapes: R rows (B K positions), V vocab, NB = ceil(V / BLOCK) blocks.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 4096      # vocab elements per block (the rows' inner loop); capped at next_pow2(V)
NUM_WARPS = 8

_TL = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


@triton.jit
def orl_dgemma_rows(x_ptr, stride_row, temp_ptr, u_ptr, arg_ptr, tok_ptr, ent_ptr, p_ptr, lse_ptr,
                    V: tl.constexpr, BLOCK: tl.constexpr, NB: tl.constexpr, NBP: tl.constexpr,
                    GREEDY: tl.constexpr, PROBS: tl.constexpr, ROUND: tl.constexpr, RDT: tl.constexpr,
                    LSE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_row
    temp = tl.load(temp_ptr)
    lanes = tl.arange(0, BLOCK)
    ids = tl.arange(0, NBP)
    NEG: tl.constexpr = float("-inf")
    bm_v = tl.full([NBP], NEG, tl.float32)    # block max of lg
    ba_v = tl.zeros([NBP], tl.int32)           # its first index
    bs_v = tl.zeros([NBP], tl.float32)         # sum exp(lg - bm)
    bt_v = tl.zeros([NBP], tl.float32)         # sum exp(lg - bm) (lg - bm)
    bq_v = tl.zeros([NBP], tl.float32)         # ROUND: sum exp(r(lg) - r(bm)), r = rounding to RDT
    # ---- pass 1: the row once
    for b in range(NB):
        offs = b * BLOCK + lanes
        ok = offs < V
        lg = tl.math.div_rn(tl.load(x_row + offs, mask=ok, other=NEG).to(tl.float32), temp)
        bm = tl.max(lg, 0)
        ba = tl.min(tl.where(lg == bm, offs, V), 0)
        bmf = tl.where(bm > NEG, bm, 0.0)  # a block of -inf logits only: zero sums, not NaN
        d = lg - bmf
        e = tl.exp(d)
        sel = ids == b
        bm_v = tl.where(sel, bm, bm_v)
        ba_v = tl.where(sel, ba, ba_v)
        bs_v = tl.where(sel, tl.sum(e, 0), bs_v)
        bt_v = tl.where(sel, tl.sum(e * tl.where(e > 0, d, 0.0), 0), bt_v)  # 0, not 0 * -inf
        if ROUND:
            q = tl.exp(lg.to(RDT).to(tl.float32) - bmf.to(RDT).to(tl.float32))
            bq_v = tl.where(sel, tl.sum(q, 0), bq_v)
    # ---- combine the blocks (blocks of -inf only, and the padding ones, count for nothing)
    live = bm_v > NEG
    M = tl.max(bm_v, 0)
    dm = tl.where(live, bm_v - M, 0.0)
    sc = tl.where(live, tl.exp(dm), 0.0)
    w = bs_v * sc
    S = tl.sum(w, 0)
    T = tl.sum(sc * (bt_v + dm * bs_v), 0)
    tl.store(ent_ptr + row, tl.log(S) - T / S)
    if LSE:  # log sum exp(lg): the mask rules' confidence exp(lg[tok] - lse) and capture's log-probs
        tl.store(lse_ptr + row, M + tl.log(S))
    first = tl.min(tl.where(bm_v == M, ids, NBP), 0)
    arg = tl.sum(tl.where(ids == first, ba_v, 0), 0)
    tl.store(arg_ptr + row, arg.to(tl.int64))
    # ---- inverse-CDF sample: find the block, then the index inside it
    if GREEDY:
        tl.store(tok_ptr + row, arg.to(tl.int64))
    else:
        target = tl.load(u_ptr + row) * S
        cum = tl.cumsum(w, 0)
        bstar = tl.sum((cum <= target).to(tl.int32), 0)          # first block whose prefix exceeds it
        carry = tl.sum(tl.where(ids == bstar - 1, cum, 0.0), 0)  # the prefix before it (<= target)
        bl = tl.minimum(bstar, NB - 1)
        offs = bl * BLOCK + lanes
        ok = offs < V
        lg = tl.math.div_rn(tl.load(x_row + offs, mask=ok, other=NEG).to(tl.float32), temp)
        e = tl.exp(lg - M)
        c = carry + tl.cumsum(e, 0)
        n_le = tl.sum((ok & (c <= target)).to(tl.int32), 0)
        last = tl.max(tl.where(ok & (e > 0), offs, -1), 0)  # rounding left the target past the block
        tok = tl.minimum(bl * BLOCK + n_le, last)
        tok = tl.where(bstar >= NB, V - 1, tok)
        tl.store(tok_ptr + row, tok.to(tl.int64))
    # ---- pass 2: the self-conditioning probabilities
    if PROBS:
        if ROUND:
            Mq = M.to(RDT).to(tl.float32)
            bmq = tl.where(live, bm_v, 0.0).to(RDT).to(tl.float32)
            Sq = tl.sum(tl.where(live, bq_v * tl.exp(bmq - Mq), 0.0), 0)
        else:
            Mq = M
            Sq = S
        p_row = p_ptr + row * V
        for b in range(NB):
            offs = b * BLOCK + lanes
            ok = offs < V
            lg = tl.math.div_rn(tl.load(x_row + offs, mask=ok, other=NEG).to(tl.float32), temp)
            if ROUND:
                lg = lg.to(RDT).to(tl.float32)
            p = tl.exp(lg - Mq) / Sq
            tl.store(p_row + offs, p.to(p_ptr.dtype.element_ty), mask=ok)


def round_rows(logits: torch.Tensor, temp: torch.Tensor, u: torch.Tensor | None = None,
               probs_dtype: torch.dtype | None = None, round_dtype: torch.dtype | None = None,
               block: int | None = None, num_warps: int | None = None, with_lse: bool = False):
    """The per-position work of one round over logits (..., V) (float32, bf16 or fp16).

    temp (1,) float32 (`orl.engine.rules.temperature`); u (...) float32 uniforms, or None: greedy (the
    token is the argmax). ``probs_dtype``: also return softmax(lg.to(round_dtype), float32) in that
    dtype (``round_dtype`` None: that of probs_dtype; float32 rounds nothing). Returns (argmax (...)
    int64, token (...) int64, entropy (...) float32 nats, probs (..., V) or None), and with
    ``with_lse`` a fifth entry: logsumexp(lg) (...) float32."""
    V = logits.shape[-1]
    lead = logits.shape[:-1]
    x = logits.reshape(-1, V)
    if x.stride(-1) != 1:
        x = x.contiguous()
    R, dev = x.shape[0], x.device
    BL = min(block or BLOCK, triton.next_power_of_2(V))
    NB = triton.cdiv(V, BL)
    arg = torch.empty(R, dtype=torch.long, device=dev)
    tok = torch.empty(R, dtype=torch.long, device=dev)
    ent = torch.empty(R, dtype=torch.float32, device=dev)
    probs = None if probs_dtype is None else torch.empty(R, V, dtype=probs_dtype, device=dev)
    rdt = (round_dtype or probs_dtype) if probs_dtype is not None else torch.float32
    uu = ent if u is None else u.reshape(R).to(torch.float32)
    lse = torch.empty(R, dtype=torch.float32, device=dev) if with_lse else ent
    orl_dgemma_rows[(R,)](x, x.stride(0), temp, uu, arg, tok, ent, ent if probs is None else probs, lse,
                          V=V, BLOCK=BL, NB=NB, NBP=triton.next_power_of_2(NB), GREEDY=u is None,
                          PROBS=probs is not None, ROUND=rdt != torch.float32, RDT=_TL[rdt], LSE=with_lse,
                          num_warps=num_warps or NUM_WARPS)
    out = (arg.view(lead), tok.view(lead), ent.view(lead), None if probs is None else probs.view(*lead, V))
    return (*out, lse.view(lead)) if with_lse else out
