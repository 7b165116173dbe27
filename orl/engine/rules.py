"""The decision rules of each family's decoder, on the device: one round's logits -> the next state.

A rule owns its own static buffers (the per-request numbers and the per-block state beyond the
runtime's canvas / residual / step / flag) and three graph-safe pieces the runtime calls
(`orl.engine.runtime`): ``begin`` (a fresh canvas), ``decide`` (one round's decision from the
logits, the residual for the next round, the "go on?" flag) and ``set_request`` (one request's
numbers into the buffers, no recapture). Two rules cover the three families:

  `MaskRule`    mask-diffusion models: SDAR's "threshold" (dynamic threshold with a top-quota
                fallback) and "topk", LLaDA-2.1's "llada" (mask->token threshold with a one-token
                fallback, token->token editing of committed positions, editing-only post steps)
  `CanvasRule`  uniform-state models (DiffusionGemma, rule "dgemma"): a random canvas from the
                counter RNG, every position re-judged each round (temperature schedule, sample,
                entropy-bound accept, re-noise), the stability + confidence stop; the per-position
                pass over the logits is `canvas_round` or its fused Triton twin `canvas_round_fused`

The numerics are `orl.decode.samplers`' (called as they are where they are graph-safe) and the
random numbers `orl.decode.rng`'s counter stream, so the reference decoder `orl.decode.decode`
gives the same tokens (greedy; or sampled with ``rng=CounterRNG(seed)``): tests/test_engine_cpu.py,
tests/test_engine_dgemma.py. HF's step for "dgemma" is docs/diffusiongemma-spec.md 9.
Shapes: K canvas length, V vocab, D hidden, s stability window.
"""
from __future__ import annotations

import math
import os
from typing import NamedTuple

import torch

from ..decode import samplers as Smp
from ..decode.rng import STREAM_CANVAS, STREAM_NOISE, STREAM_SAMPLE, randint, sample_inverse_cdf, uniform
from . import forward as F_



def _buf(dev, *shape, dtype=torch.long):
    return torch.zeros(*shape, dtype=dtype, device=dev)


class _Rule:
    """What both rules share: the request's key (its second entry: the residual pathway is on) and the
    counter RNG whose state a graph capture's warm-up must leave as it was."""

    key: tuple
    counter: torch.Tensor

    @property
    def use_residual(self) -> bool:
        return self.key[1]

    def saved(self) -> list:
        """Buffers a capture's warm-up must leave as they were (it must not consume random numbers)."""
        return [self.counter]

    def raw_lse(self, d) -> torch.Tensor | None:
        """The raw logits' logsumexp (B, K) when this round computed it (else None: capture computes it)."""
        return None


class Dist(NamedTuple):
    """One round's distribution as `MaskRule` keeps it: ``probs`` (B, K, V) float32 and the float
    logits ``lf`` (torch sampler), or per-position numbers only (fused sampler: ``ent`` normalised
    entropy, ``arg`` / ``p_arg`` the argmax and its probability, ``lse`` the logsumexp at the step's
    temperature, ``zprobs`` the probabilities in the embedding's dtype when the residual reads them)."""

    probs: torch.Tensor | None
    tok: torch.Tensor
    conf: torch.Tensor
    lf: torch.Tensor | None
    ent: torch.Tensor | None = None
    arg: torch.Tensor | None = None
    p_arg: torch.Tensor | None = None
    lse: torch.Tensor | None = None
    zprobs: torch.Tensor | None = None


class MaskRule(_Rule):
    """SDAR "threshold" / "topk" and LLaDA "llada" on a mask-diffusion model (module docstring):
    the same operations as `orl.decode.block.decode` for those rules, for B rows, greedy or sampled
    (temperature, top-p; the sample is the inverse CDF of one counter-RNG uniform per position, as
    `orl.decode.rng.CounterRNG.sample` draws it)."""

    rules = ("threshold", "topk", "llada")

    def __init__(self, rt, sampler: str = "torch"):
        dev, K, B = rt.device, rt.K, rt.B
        # "auto" keeps the torch sampler: the fused one equals it up to float rounding only (opt in)
        self.sampler = CanvasRule._pick_sampler("torch" if sampler == "auto" else sampler, dev)
        self.rtemp = _buf(dev, 1, dtype=torch.float32)  # the residual's temperature (fused sampler)
        self.unresolved = _buf(dev, B, K, dtype=torch.bool)
        self.active, self.post = _buf(dev, B, dtype=torch.bool), _buf(dev, B)  # still denoising; llada post steps
        self.threshold, self.temperature = _buf(dev, 1, dtype=torch.float32), _buf(dev, 1, dtype=torch.float32)
        self.top_p = _buf(dev, 1, dtype=torch.float32)
        self.quota_base, self.quota_rem, self.max_steps, self.mask_id = (_buf(dev, 1) for _ in range(4))
        self.edit_threshold, self.post_cap = _buf(dev, 1, dtype=torch.float32), _buf(dev, 1)
        self.seed, self.counter = _buf(dev, B), _buf(dev, B)  # counter RNG (sampling): per row
        # (rule, residual, residual temperature, sampled, residual from the step's probs, top-p, fused, T in {0, 1})
        self.key = None
        # committed block rows see their whole block ("block") or the slots up to themselves ("causal")
        self.block_causal = rt.mcfg.clean_attention != "block"

    def set_request(self, rt, cfg, mask_id: int | None = None, seeds=(0,)) -> tuple:
        if cfg.rule not in self.rules:
            raise NotImplementedError(f"the engine runs the SDAR rules 'threshold' and 'topk' and LLaDA's 'llada', "
                                      f"not {cfg.rule!r}; use orl.decode.decode for the others")
        if cfg.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {cfg.temperature}")
        mask_id = rt.mcfg.mask_token_id if mask_id is None else mask_id
        base, rem = divmod(rt.K, cfg.max_steps)
        post = cfg.max_post_steps if cfg.rule == "llada" else 0
        # max_steps holds the cap on rounds per block: llada adds its editing-only post steps
        for buf, v in ((self.threshold, cfg.threshold), (self.quota_base, base), (self.quota_rem, rem),
                       (self.max_steps, cfg.max_steps + post), (self.mask_id, mask_id),
                       (self.edit_threshold, cfg.edit_threshold), (self.post_cap, post),
                       (self.temperature, cfg.temperature if cfg.temperature > 0 else 1.0), (self.counter, 0),
                       (self.top_p, cfg.top_p)):
            buf.fill_(v)
        self.seed.copy_(torch.tensor(seeds, dtype=torch.long))
        use_res = cfg.residual and rt.mcfg.pathway != "none"
        rtemp = cfg.residual_temperature if use_res else 1.0
        # `orl.decode.block`: the residual reads the step's probabilities when neither temperature rescales them
        sampled = cfg.temperature > 0
        nucleus = sampled and cfg.top_p < 1
        same = rtemp == 1.0 and cfg.temperature in (0.0, 1.0) and not nucleus
        self.rtemp.fill_(rtemp)
        # the fused sampler (not with top-p: its nucleus is a sort) and whether the step's logsumexp is at T = 1
        fused = self.sampler == "triton" and not nucleus
        self.key = (cfg.rule, use_res, rtemp, sampled, same, nucleus, fused, cfg.temperature in (0.0, 1.0))
        return self.key

    def raw_lse(self, d: "Dist") -> torch.Tensor | None:
        return d.lse if d.lse is not None and self.key[-1] else None  # the fused pass's, at T = 1

    def begin(self, rt) -> None:
        """A fresh canvas of mask tokens for every row; rows already done stay idle. The residual of
        the first round is zero."""
        rt.canvas.copy_(self.mask_id.expand(rt.B, rt.K))
        self.unresolved.fill_(True)
        rt.step.zero_()
        self.active.copy_(~rt.done)
        self.post.zero_()
        rt.flag.copy_(self.active.any().view(1))
        if self.use_residual:
            rt.z.zero_()
            rt.weight.zero_()
            rt.where.fill_(True)

    def canvas_inputs(self, rt, first: bool):
        """(residual, where, weight) of a canvas forward: none at a block's first round."""
        if not self.use_residual:
            return None, None, None
        if first:
            return None, rt.where, None
        return rt.z, rt.where, rt.weight if rt.mcfg.pathway == "rcd" else None

    def distribution(self, rt, logits: torch.Tensor) -> "Dist":
        """One round's distribution over logits (B, K, V): the argmax, or a sample at the request's
        temperature (`orl.decode.samplers.step_distribution`'s numbers), and its confidence. The
        "torch" sampler keeps the float probabilities (B, K, V); the "triton" one (`orl.kernels.canvas`:
        one read of the logits) keeps per-position numbers only, plus the probabilities in the
        embedding's dtype when the residual reads them."""
        _, use_res, _, sampled, same, nucleus, fused, _ = self.key
        B, K, V = logits.shape
        u = uniform(self.seed, self.counter, STREAM_SAMPLE, K).view(B, K) if sampled else None
        if fused:
            from ..kernels import canvas as DK  # noqa: PLC0415 - Triton is imported on first use only
            zdt = rt.w.embed.dtype if use_res and same else None
            arg, tok, ent, zp, lse = DK.round_rows(logits, self.temperature, u, zdt, with_lse=True)
            at = lambda i: logits.gather(-1, i[..., None]).squeeze(-1).float() / self.temperature  # noqa: E731
            return Dist(None, tok, torch.exp(at(tok) - lse), None, ent / math.log(V), arg, torch.exp(at(arg) - lse),
                        lse, zp)
        lf = logits.float()
        if not sampled:
            probs = torch.softmax(lf, dim=-1)
            tok = probs.argmax(-1)
        else:
            probs = torch.softmax(lf / self.temperature, dim=-1)
            if nucleus:
                probs = Smp.top_p_filter(probs, self.top_p)
            tok = sample_inverse_cdf(probs, u)
        conf = probs.gather(-1, tok[..., None]).squeeze(-1)
        return Dist(probs, tok, conf, lf)

    def decide(self, rt, logits: torch.Tensor) -> None:
        """One round's decision from logits (B, K, V): commit tokens, feed the residual, set the flag."""
        rule, use_res, rtemp, _, same, _, fused, _ = self.key
        self.active.logical_and_(rt.flag)  # once the flag is down a round changes nothing (graph warm-ups)
        # the rows that take this step (the reference decoder's ``active``): an SDAR row stops once resolved
        stepping = self.active.clone() if rule == "llada" else self.active & self.unresolved.any(-1)
        d = self.distribution(rt, logits)
        self.last = (d, stepping)  # what the round chose (capture reads it next)
        if rule == "llada":
            self.last_take = self._llada(rt, d)
        else:
            self.last_take = self._sdar(rt, rule, d.tok, d.conf)
        self.counter.add_(stepping.long())  # `CounterRNG.advance(active)`
        if use_res:
            if not fused:
                pr = d.probs if same else torch.softmax(d.lf / rtemp, -1)
                z, weight = F_.soft_embed(rt.w, pr), (Smp.normalized_entropy(pr) if rt.mcfg.pathway == "rcd" else None)
            else:  # the residual's distribution from the kernel: at the step's temperature, or its own
                zp, ent = d.zprobs, d.ent
                if not same:
                    from ..kernels import canvas as DK  # noqa: PLC0415
                    _, _, ent, zp = DK.round_rows(logits, self.rtemp, None, rt.w.embed.dtype)
                    ent = ent / math.log(logits.shape[-1])
                z, weight = F_.soft_embed(rt.w, zp), ent
            rt.z.copy_(z)
            if rt.mcfg.pathway_where == "canvas":
                rt.where.fill_(True)
            else:
                rt.where.copy_(self.unresolved)
            if rt.mcfg.pathway == "rcd":
                rt.weight.copy_(weight)
        go_rows = self.active if rule == "llada" else self.unresolved.any(-1) & self.active
        rt.flag.copy_(go_rows.any().view(1) & (rt.rnd + 1 < self.max_steps))

    def _llada(self, rt, d: "Dist") -> torch.Tensor:
        """LLaDA-2.1 (`orl.decode.block.decode`, rule "llada"): commit masks above the threshold
        (else the single best), edit committed tokens whose argmax differs with probability above
        the edit threshold; after the last mask, editing-only post steps until a round edits
        nothing or ``max_post_steps`` of them ran. Returns the positions resolved or edited."""
        act = self.active[:, None]
        had_masks = self.unresolved.any(-1)
        take = Smp.llada_transfer(d.conf, self.unresolved, self.threshold) & act
        if d.probs is not None:
            edits, arg = Smp.llada_edits(d.probs, rt.canvas, ~self.unresolved & act, self.edit_threshold)
        else:
            edits, arg = Smp.llada_edits_at(d.p_arg, d.arg, rt.canvas, ~self.unresolved & act, self.edit_threshold)
        rt.canvas.copy_(torch.where(take, d.tok, torch.where(edits, arg, rt.canvas)))
        self.unresolved.logical_and_(~take)
        self.post.add_((~had_masks & self.active).long())
        finished = ~had_masks & (~edits.any(-1) | (self.post >= self.post_cap))
        rt.step.add_(self.active.long())
        self.active.logical_and_(~finished)
        return take | edits

    def _sdar(self, rt, rule, tok, conf) -> torch.Tensor:
        # step_quota on device; every active row is at round rnd of the block
        quota = (self.quota_base + (rt.rnd < self.quota_rem).long()).clamp_min(1)
        if rule == "threshold":
            take = Smp.select_threshold(conf, self.unresolved, self.threshold, quota)
        else:
            take = Smp.select_topk(conf, self.unresolved, quota)
        active = self.unresolved.any(-1, keepdim=True) & self.active[:, None]
        take = take & active
        rt.canvas.copy_(torch.where(take, tok, rt.canvas))
        self.unresolved.logical_and_(~take)
        rt.step.add_(active.view(-1).long())
        return take


class CanvasRule(_Rule):
    """DiffusionGemma's rule "dgemma" on a uniform-state model (module docstring), for B rows, each
    with its own seed. ``sampler``: the round's per-position work over the logits -- "torch"
    (`canvas_round`, the reference), "triton" (`canvas_round_fused`: one fused kernel, equal up to
    float rounding; CUDA, or CPU under ``TRITON_INTERPRET=1``), "auto": "triton" on CUDA when Triton
    imports, else "torch". A round is a no-op once the flag is down, so an extra round (graph
    warm-up) changes nothing."""

    rules = ("dgemma",)
    block_causal = True  # committed text is encoded causally (DiffusionGemma's encoder)

    def __init__(self, rt, sampler: str = "auto"):
        dev, B = rt.device, rt.B
        self.sampler = self._pick_sampler(sampler, dev)
        self.hists: dict[int, torch.Tensor] = {}
        self.hist = None
        self.max_steps = _buf(dev, 1)
        self.seed, self.counter, self.active = _buf(dev, B), _buf(dev, B), _buf(dev, B, dtype=torch.bool)
        self.unresolved = _buf(dev, B, rt.K, dtype=torch.bool)  # re-noised positions (the reference's trace)
        self.t_min, self.t_span, self.bound, self.conf = (_buf(dev, 1, dtype=torch.float32) for _ in range(4))
        self.key = None

    @staticmethod
    def _pick_sampler(sampler: str, dev) -> str:
        if sampler not in ("auto", "torch", "triton"):
            raise ValueError(f"sampler must be 'auto', 'torch' or 'triton', got {sampler!r}")
        cuda = dev.type == "cuda"
        if sampler == "auto":
            from .moe import triton_available  # noqa: PLC0415
            return "triton" if cuda and triton_available() else "torch"
        if sampler == "triton" and not (cuda or os.environ.get("TRITON_INTERPRET") == "1"):
            raise ValueError("sampler 'triton' needs the model on a CUDA device (or TRITON_INTERPRET=1 for the CPU "
                             "interpreter); use sampler='torch'")
        return sampler

    def set_request(self, rt, cfg, mask_id: int | None = None, seeds=(0,)) -> tuple:
        """One request's numbers into the device buffers (no recapture); the RNG counter restarts."""
        if cfg.rule not in self.rules:
            raise NotImplementedError(f"a DiffusionGemma model decodes with rule 'dgemma', not {cfg.rule!r}")
        for buf, v in ((self.max_steps, cfg.max_steps), (self.counter, 0), (self.t_min, cfg.t_min),
                       (self.t_span, cfg.t_max - cfg.t_min), (self.bound, cfg.entropy_bound),
                       (self.conf, cfg.confidence_threshold)):
            buf.fill_(v)
        self.seed.copy_(torch.tensor(seeds, dtype=torch.long))
        s = cfg.stability_threshold
        if s not in self.hists:  # one buffer per window length, kept for the graphs that use it
            self.hists[s] = torch.full((s, rt.B, rt.K), -1, dtype=torch.long, device=rt.device)
        self.hist = self.hists[s]
        use_res = cfg.residual and rt.mcfg.pathway != "none"
        self.key = ("dgemma", use_res, cfg.temperature == 0, s)
        return self.key

    def begin(self, rt) -> None:
        """A fresh random canvas per row from the counter RNG; no self-conditioning yet (z = 0)."""
        B, K = rt.B, rt.K
        rt.canvas.copy_(randint(self.seed, self.counter, STREAM_CANVAS, K, rt.mcfg.vocab_size).view(B, K))
        self.counter.add_(1)
        self.hist.fill_(-1)
        self.unresolved.fill_(True)
        rt.step.zero_()
        self.active.copy_(~rt.done)
        rt.flag.copy_(self.active.any().view(1))
        rt.z.zero_()

    def canvas_inputs(self, rt, first: bool):
        """Every canvas row is marked (pathway_where="canvas"): the post-norm applies even with z = 0."""
        return (None if first or not self.use_residual else rt.z), rt.where, None

    def decide(self, rt, logits: torch.Tensor) -> None:
        """One round's decision (gated per row: a no-op on finished rows and, once the flag is down,
        on all). Every active row is at round ``rt.rnd`` of its canvas."""
        _, use_res, greedy, _ = self.key
        act = self.active & rt.flag
        args = (logits, self.hist, rt.rnd, self.max_steps, self.t_min, self.t_span, self.bound, self.conf,
                self.seed, self.counter, greedy)
        if self.sampler == "triton":  # the probabilities come out in the embedding's dtype, as soft_embed casts
            probs, canvas, hist, finished, take, ent = canvas_round_fused(
                *args, probs_dtype=rt.w.embed.dtype if use_res else None, round_dtype=rt.w.dtype)
        else:
            lg, canvas, hist, finished, take, ent = canvas_round(*args)
            probs = Smp.dgemma_selfcond_probs(lg, rt.w.dtype) if use_res else None
        if rt._cap is not None:  # what a capture reads (the reference trace's): the normalised entropy of
            V = logits.shape[-1]  # softmax(lg), the kept positions, the re-noised ones; top-k: of the raw logits
            ent = ent / math.log(V) if self.sampler == "triton" else Smp.normalized_entropy(torch.softmax(lg, -1))
            self.last = (Dist(None, canvas, take.float(), None, ent), act)
            stop = finished[:, None]
            self.last_take = take | stop
            self.unresolved.copy_(torch.where(act[:, None], ~take & ~stop, self.unresolved))
        rt.canvas.copy_(torch.where(act[:, None], canvas, rt.canvas))
        if self.hist.shape[0]:
            self.hist.copy_(torch.where(act[None, :, None], hist, self.hist))
        rt.step.add_(act.long())
        self.counter.add_(act.long())
        self.active.copy_(act & ~finished)
        rt.flag.copy_(self.active.any().view(1))
        if use_res:  # HF: z from the processed (temperature-scaled) logits, cast to the embedding dtype
            rt.z.copy_(F_.soft_embed(rt.w, probs))


# ------------------------------------------------------------------ the canvas round's numerics
def temperature(step: torch.Tensor, max_steps: torch.Tensor, t_min: torch.Tensor, t_span: torch.Tensor):
    """`orl.decode.samplers.dgemma_temperature` on device tensors, bit for bit: T = t_min + (t_max -
    t_min) * (n / N) in float32, n = N - step steps remaining; t_min, t_span = float32(t_max - t_min)."""
    n = (max_steps - step).to(torch.int32)
    return t_min + t_span * (n / max_steps.to(torch.int32))


def canvas_round(logits, hist, step, max_steps, t_min, t_span, bound, conf, seed, counter, greedy: bool):
    """One DiffusionGemma step from raw logits (B, K, V) (`orl.decode.block.decode`, rule "dgemma").

    hist (s, B, K) argmax history (-1 at a canvas start); step (the round of the canvas), max_steps,
    counter (1,) int64; seed (B,) int64, one per row; t_min, t_span, bound (nats), conf (nats) (1,)
    float32. Returns (processed logits lg (B, K, V) float32, the next canvas (B, K), the next
    history, finished (B,) bool, the accepted positions (B, K), the entropy (B, K) in nats). Draws
    use ``counter``; the caller advances it. The reference of `canvas_round_fused`."""
    B, K, V = logits.shape
    lg = logits.float() / temperature(step, max_steps, t_min, t_span)
    arg = lg.argmax(-1)
    if greedy:
        tok = arg
    else:
        tok = sample_inverse_cdf(torch.softmax(lg, dim=-1), uniform(seed, counter, STREAM_SAMPLE, K).view(B, K))
    ent = Smp.dgemma_entropy(lg)
    return (lg, *_round_tail(arg, tok, ent, hist, step, max_steps, bound, conf, seed, counter, V), ent)


def canvas_round_fused(logits, hist, step, max_steps, t_min, t_span, bound, conf, seed, counter, greedy: bool,
                       probs_dtype: torch.dtype | None = None, round_dtype: torch.dtype | None = None):
    """`canvas_round` with the per-position work over the logits (temperature, argmax, sample,
    entropy) in one Triton kernel (`orl.kernels.canvas`: one read of the logits, one more
    with the probabilities) and the same K-sized decisions after it. Returns (the self-conditioning
    probabilities ``dgemma_selfcond_probs(lg, round_dtype)`` (1, K, V) in ``probs_dtype``, or None
    when ``probs_dtype`` is None, the next canvas, the next history, finished, accepted, entropy). Equals
    `canvas_round` up to float rounding (entropies and probabilities to ~1e-6 relative; a token, an
    acceptance or the stop can differ only at a rounding boundary). Needs CUDA tensors or
    ``TRITON_INTERPRET=1`` (float32)."""
    from ..kernels import canvas as DK  # noqa: PLC0415 - Triton is imported on first use only
    B, K, V = logits.shape
    u = None if greedy else uniform(seed, counter, STREAM_SAMPLE, K).view(B, K)
    arg, tok, ent, probs = DK.round_rows(logits, temperature(step, max_steps, t_min, t_span), u, probs_dtype,
                                         round_dtype)
    return (probs, *_round_tail(arg, tok, ent, hist, step, max_steps, bound, conf, seed, counter, V), ent)


def _round_tail(arg, tok, ent, hist, step, max_steps, bound, conf, seed, counter, V: int):
    """A round's decisions from the per-position argmax, token and entropy (1, K): entropy-bound
    acceptance, re-noising of the others, the stability + confidence stop."""
    B, K = arg.shape
    take = Smp.dgemma_accept(ent, bound)
    noise = randint(seed, counter, STREAM_NOISE, K, V).view(B, K)
    stable, new_hist = Smp.dgemma_stable(hist, arg)
    finished = (stable & (ent.mean(-1) < conf)) | (step + 1 >= max_steps)
    canvas = torch.where(finished[:, None], arg, torch.where(take, tok, noise))
    return canvas, new_hist, finished, take
