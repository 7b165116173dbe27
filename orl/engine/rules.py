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

import os

import torch

from ..decode import samplers as Smp
from ..decode.rng import STREAM_CANVAS, STREAM_NOISE, STREAM_SAMPLE, randint, sample_inverse_cdf, uniform
from . import forward as F_



def _buf(dev, *shape, dtype=torch.long):
    return torch.zeros(*shape, dtype=dtype, device=dev)


class MaskRule:
    """SDAR "threshold" / "topk" and LLaDA "llada" on a mask-diffusion model (module docstring):
    the same operations as `orl.decode.block.decode` for those rules, greedy, batch 1."""

    rules = ("threshold", "topk", "llada")

    def __init__(self, rt):
        dev, K = rt.device, rt.K
        self.unresolved = _buf(dev, 1, K, dtype=torch.bool)
        self.active, self.post = _buf(dev, 1, dtype=torch.bool), _buf(dev, 1)  # llada: still denoising; post steps
        self.threshold = _buf(dev, 1, dtype=torch.float32)
        self.quota_base, self.quota_rem, self.max_steps, self.mask_id = (_buf(dev, 1) for _ in range(4))
        self.edit_threshold, self.post_cap = _buf(dev, 1, dtype=torch.float32), _buf(dev, 1)
        self.key = None  # (rule, residual, residual temperature) of the request
        # committed block rows see their whole block ("block") or the slots up to themselves ("causal")
        self.block_causal = rt.mcfg.clean_attention != "block"

    def set_request(self, rt, cfg, mask_id: int | None = None, seed: int = 0) -> tuple:
        if cfg.rule not in self.rules:
            raise NotImplementedError(f"the engine runs the SDAR rules 'threshold' and 'topk' and LLaDA's 'llada', "
                                      f"not {cfg.rule!r}; use orl.decode.decode for the others")
        if cfg.temperature != 0:
            raise NotImplementedError("the engine decodes mask-diffusion models greedily (temperature 0); "
                                      "sampled decoding runs in orl.decode.decode")
        mask_id = rt.mcfg.mask_token_id if mask_id is None else mask_id
        base, rem = divmod(rt.K, cfg.max_steps)
        post = cfg.max_post_steps if cfg.rule == "llada" else 0
        # max_steps holds the cap on rounds per block: llada adds its editing-only post steps
        for buf, v in ((self.threshold, cfg.threshold), (self.quota_base, base), (self.quota_rem, rem),
                       (self.max_steps, cfg.max_steps + post), (self.mask_id, mask_id),
                       (self.edit_threshold, cfg.edit_threshold), (self.post_cap, post)):
            buf.fill_(v)
        use_res = cfg.residual and rt.mcfg.pathway != "none"
        self.key = (cfg.rule, use_res, cfg.residual_temperature if use_res else 1.0)
        return self.key

    @property
    def use_residual(self) -> bool:
        return self.key[1]

    def saved(self) -> list:
        return []

    def begin(self, rt) -> None:
        """A fresh canvas of mask tokens; the residual of the first round is zero."""
        rt.canvas.copy_(self.mask_id.expand(1, rt.K))
        self.unresolved.fill_(True)
        rt.step.zero_()
        self.active.fill_(True)
        self.post.zero_()
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

    def decide(self, rt, logits: torch.Tensor) -> None:
        """One round's decision from logits (1, K, V): commit tokens, feed the residual, set the flag."""
        rule, use_res, rtemp = self.key
        lf = logits.float()
        probs = torch.softmax(lf, dim=-1)
        tok = probs.argmax(-1)
        conf = probs.gather(-1, tok[..., None]).squeeze(-1)
        if rule == "llada":
            self._llada(rt, probs, tok, conf)
        else:
            self._sdar(rt, rule, tok, conf)
        if use_res:
            pr = probs if rtemp == 1.0 else torch.softmax(lf / rtemp, -1)
            rt.z.copy_(F_.soft_embed(rt.w, pr))
            if rt.mcfg.pathway_where == "canvas":
                rt.where.fill_(True)
            else:
                rt.where.copy_(self.unresolved)
            if rt.mcfg.pathway == "rcd":
                rt.weight.copy_(Smp.normalized_entropy(pr))
        go = self.active if rule == "llada" else self.unresolved.any(-1)
        torch.logical_and(go, rt.step < self.max_steps, out=rt.flag)

    def _llada(self, rt, probs, tok, conf) -> None:
        """LLaDA-2.1 (`orl.decode.block.decode`, rule "llada"): commit masks above the threshold
        (else the single best), edit committed tokens whose argmax differs with probability above
        the edit threshold; after the last mask, editing-only post steps until a round edits
        nothing or ``max_post_steps`` of them ran."""
        act = self.active[:, None]
        had_masks = self.unresolved.any(-1)
        take = Smp.llada_transfer(conf, self.unresolved, self.threshold) & act
        edits, arg = Smp.llada_edits(probs, rt.canvas, ~self.unresolved & act, self.edit_threshold)
        rt.canvas.copy_(torch.where(take, tok, torch.where(edits, arg, rt.canvas)))
        self.unresolved.logical_and_(~take)
        self.post.add_((~had_masks & self.active).long())
        finished = ~had_masks & (~edits.any(-1) | (self.post >= self.post_cap))
        rt.step.add_(self.active.long())
        self.active.logical_and_(~finished)

    def _sdar(self, rt, rule, tok, conf) -> None:
        quota = (self.quota_base + (rt.step < self.quota_rem).long()).clamp_min(1)  # step_quota on device
        if rule == "threshold":
            take = Smp.select_threshold(conf, self.unresolved, self.threshold, quota)
        else:
            take = Smp.select_topk(conf, self.unresolved, quota)
        active = self.unresolved.any(-1, keepdim=True)
        take = take & active
        rt.canvas.copy_(torch.where(take, tok, rt.canvas))
        self.unresolved.logical_and_(~take)
        rt.step.add_(active.view(1).long())


class CanvasRule:
    """DiffusionGemma's rule "dgemma" on a uniform-state model (module docstring). ``sampler``: the
    round's per-position work over the logits -- "torch" (`canvas_round`, the reference), "triton"
    (`canvas_round_fused`: one fused kernel, equal up to float rounding; CUDA, or CPU under
    ``TRITON_INTERPRET=1``), "auto": "triton" on CUDA when Triton imports, else "torch". A round
    is a no-op once the flag is down, so an extra round (graph warm-up) changes nothing."""

    rules = ("dgemma",)
    block_causal = True  # committed text is encoded causally (DiffusionGemma's encoder)

    def __init__(self, rt, sampler: str = "auto"):
        dev = rt.device
        self.sampler = self._pick_sampler(sampler, dev)
        self.hists: dict[int, torch.Tensor] = {}
        self.hist = None
        self.max_steps, self.seed, self.counter = (_buf(dev, 1) for _ in range(3))
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

    def set_request(self, rt, cfg, mask_id: int | None = None, seed: int = 0) -> tuple:
        """One request's numbers into the device buffers (no recapture); the RNG counter restarts."""
        if cfg.rule not in self.rules:
            raise NotImplementedError(f"a DiffusionGemma model decodes with rule 'dgemma', not {cfg.rule!r}")
        if not 0 <= seed < 1 << 62:
            raise ValueError(f"seed must be in [0, 2^62), got {seed}")
        for buf, v in ((self.max_steps, cfg.max_steps), (self.seed, seed), (self.counter, 0), (self.t_min, cfg.t_min),
                       (self.t_span, cfg.t_max - cfg.t_min), (self.bound, cfg.entropy_bound),
                       (self.conf, cfg.confidence_threshold)):
            buf.fill_(v)
        s = cfg.stability_threshold
        if s not in self.hists:  # one buffer per window length, kept for the graphs that use it
            self.hists[s] = torch.full((s, 1, rt.K), -1, dtype=torch.long, device=rt.device)
        self.hist = self.hists[s]
        use_res = cfg.residual and rt.mcfg.pathway != "none"
        self.key = ("dgemma", use_res, cfg.temperature == 0, s)
        return self.key

    @property
    def use_residual(self) -> bool:
        return self.key[1]

    def saved(self) -> list:
        """Buffers a capture's warm-up must leave as they were (it must not consume random numbers)."""
        return [self.counter]

    def begin(self, rt) -> None:
        """A fresh random canvas from the counter RNG; no self-conditioning yet (z = 0)."""
        K = rt.K
        rt.canvas.copy_(randint(self.seed, self.counter, STREAM_CANVAS, K, rt.mcfg.vocab_size).view(1, K))
        self.counter.add_(1)
        self.hist.fill_(-1)
        rt.step.zero_()
        rt.flag.fill_(True)
        rt.z.zero_()

    def canvas_inputs(self, rt, first: bool):
        """Every canvas row is marked (pathway_where="canvas"): the post-norm applies even with z = 0."""
        return (None if first or not self.use_residual else rt.z), rt.where, None

    def decide(self, rt, logits: torch.Tensor) -> None:
        """One round's decision (gated by the flag: a no-op on a finished canvas)."""
        _, use_res, greedy, _ = self.key
        act = rt.flag.clone()
        args = (logits, self.hist, rt.step, self.max_steps, self.t_min, self.t_span, self.bound, self.conf,
                self.seed, self.counter, greedy)
        if self.sampler == "triton":  # the probabilities come out in the embedding's dtype, as soft_embed casts
            probs, canvas, hist, finished = canvas_round_fused(
                *args, probs_dtype=rt.w.embed.dtype if use_res else None, round_dtype=rt.w.dtype)
        else:
            lg, canvas, hist, finished = canvas_round(*args)
            probs = Smp.dgemma_selfcond_probs(lg, rt.w.dtype) if use_res else None
        rt.canvas.copy_(torch.where(act[:, None], canvas, rt.canvas))
        if self.hist.shape[0]:
            self.hist.copy_(torch.where(act[None, :, None], hist, self.hist))
        rt.step.add_(act.long())
        self.counter.add_(act.long())
        rt.flag.copy_(act & ~finished)
        if use_res:  # HF: z from the processed (temperature-scaled) logits, cast to the embedding dtype
            rt.z.copy_(F_.soft_embed(rt.w, probs))


# ------------------------------------------------------------------ the canvas round's numerics
def temperature(step: torch.Tensor, max_steps: torch.Tensor, t_min: torch.Tensor, t_span: torch.Tensor):
    """`orl.decode.samplers.dgemma_temperature` on device tensors, bit for bit: T = t_min + (t_max -
    t_min) * (n / N) in float32, n = N - step steps remaining; t_min, t_span = float32(t_max - t_min)."""
    n = (max_steps - step).to(torch.int32)
    return t_min + t_span * (n / max_steps.to(torch.int32))


def canvas_round(logits, hist, step, max_steps, t_min, t_span, bound, conf, seed, counter, greedy: bool):
    """One DiffusionGemma step from raw logits (1, K, V) (`orl.decode.block.decode`, rule "dgemma").

    hist (s, 1, K) argmax history (-1 at a canvas start); step, max_steps, seed, counter (1,) int64;
    t_min, t_span, bound (nats), conf (nats) (1,) float32. Returns (processed logits lg (1, K, V)
    float32, the next canvas (1, K), the next history, finished (1,) bool). Draws use ``counter``;
    the caller advances it. The reference of `canvas_round_fused`."""
    K, V = logits.shape[1], logits.shape[2]
    lg = logits.float() / temperature(step, max_steps, t_min, t_span)
    arg = lg.argmax(-1)
    if greedy:
        tok = arg
    else:
        tok = sample_inverse_cdf(torch.softmax(lg, dim=-1), uniform(seed, counter, STREAM_SAMPLE, K).view(1, K))
    ent = Smp.dgemma_entropy(lg)
    return (lg, *_round_tail(arg, tok, ent, hist, step, max_steps, bound, conf, seed, counter, V))


def canvas_round_fused(logits, hist, step, max_steps, t_min, t_span, bound, conf, seed, counter, greedy: bool,
                       probs_dtype: torch.dtype | None = None, round_dtype: torch.dtype | None = None):
    """`canvas_round` with the per-position work over the logits (temperature, argmax, sample,
    entropy) in one Triton kernel (`orl.kernels.canvas`: one read of the logits, one more
    with the probabilities) and the same K-sized decisions after it. Returns (the self-conditioning
    probabilities ``dgemma_selfcond_probs(lg, round_dtype)`` (1, K, V) in ``probs_dtype``, or None
    when ``probs_dtype`` is None, the next canvas, the next history, finished). Equals
    `canvas_round` up to float rounding (entropies and probabilities to ~1e-6 relative; a token, an
    acceptance or the stop can differ only at a rounding boundary). Needs CUDA tensors or
    ``TRITON_INTERPRET=1`` (float32)."""
    from ..kernels import canvas as DK  # noqa: PLC0415 - Triton is imported on first use only
    K, V = logits.shape[1], logits.shape[2]
    u = None if greedy else uniform(seed, counter, STREAM_SAMPLE, K).view(1, K)
    arg, tok, ent, probs = DK.round_rows(logits, temperature(step, max_steps, t_min, t_span), u, probs_dtype,
                                         round_dtype)
    return (probs, *_round_tail(arg, tok, ent, hist, step, max_steps, bound, conf, seed, counter, V))


def _round_tail(arg, tok, ent, hist, step, max_steps, bound, conf, seed, counter, V: int):
    """A round's decisions from the per-position argmax, token and entropy (1, K): entropy-bound
    acceptance, re-noising of the others, the stability + confidence stop."""
    K = arg.shape[1]
    take = Smp.dgemma_accept(ent, bound)
    noise = randint(seed, counter, STREAM_NOISE, K, V).view(1, K)
    stable, new_hist = Smp.dgemma_stable(hist, arg)
    finished = (stable & (ent.mean(-1) < conf)) | (step + 1 >= max_steps)
    canvas = torch.where(finished[:, None], arg, torch.where(take, tok, noise))
    return canvas, new_hist, finished
