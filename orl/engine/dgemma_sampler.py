"""DiffusionGemma's sampler on the device: a counter-based RNG and one round's decision, graph-safe.

Owns:
  * a counter-based RNG in plain torch integer ops: 32-bit words = hash(seed, counter, index)
    (``lowbias32``, C. Wellons' hash-prospector, applied twice), where ``counter`` is a (1,) int64
    device tensor the caller advances once per draw event (a canvas start, a round). A captured
    graph replayed in a device WHILE loop therefore draws fresh numbers every round with no host
    RNG and no Philox offsets (shared/docs/engine-notes.md 4.4, constraint 3). All arithmetic stays
    below 2^63, so int64 never overflows (same words on CPU and GPU).
  * ``dgemma_round``: HF DiffusionGemma's step (docs/diffusiongemma-spec.md 9; the reference is
    `orl.decode.block.decode` with rule "dgemma") as tensors in, tensors out: temperature schedule,
    sample (inverse CDF on one uniform per position; or argmax), entropy-bound acceptance, uniform
    re-noising of the others, the stability + confidence stop. The samplers' own functions
    (`orl.decode.samplers`) are called where they are graph-safe, so the numerics are theirs.
  * ``dgemma_round_fused``: the same round with the per-position passes over the logits in one
    Triton kernel (`orl.engine.dgemma_kernels`), equal up to float rounding; the engine's choice on CUDA.
  * ``reference_rng``: the reference decoder driven by the same random stream, for parity checks
    (tests/test_engine_dgemma.py, benchmarks/engine.py).
Deviation from HF: the draws are not torch's Philox stream, and a sample is the inverse CDF of a
float32 cumulative sum (one uniform per position) instead of ``torch.multinomial``; the same
distribution up to float32 rounding of the CDF.
Shapes: K canvas length, V vocab, s stability window.
"""
from __future__ import annotations

import contextlib

import torch

from ..decode import samplers as Smp

M32 = 0xFFFFFFFF
STREAM_CANVAS, STREAM_SAMPLE, STREAM_NOISE = 0, 1, 2


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2^32 for int64 x in [0, 2^32) without leaving int64: c's top bit apart."""
    r = x * (c & 0x7FFFFFFF)
    if c >> 31:
        r = r + ((x << 31) & M32)
    return r & M32


def hash32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 on int64 words in [0, 2^32): a bijection with full avalanche."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def counter_bits(seed: torch.Tensor, counter: torch.Tensor, stream: int, n: int) -> torch.Tensor:
    """(n,) int64 random 32-bit words for draw event ``counter`` of ``stream``; seed and counter
    (1,) int64 tensors (device-resident: nothing is read on the host)."""
    key = hash32((hash32(seed & M32) + _mul32(counter & M32, 0x9E3779B9) + stream * 0x632BE5AB) & M32)
    idx = torch.arange(n, device=counter.device)
    return hash32(hash32(key ^ idx) ^ key)


def uniform(seed, counter, stream: int, n: int) -> torch.Tensor:
    """(n,) float32 in [0, 1), 24 random bits each."""
    return (counter_bits(seed, counter, stream, n) >> 8).float() * (1.0 / (1 << 24))


def randint(seed, counter, stream: int, n: int, high: int) -> torch.Tensor:
    """(n,) int64 in [0, high) (multiply-shift; exact when high is a power of two)."""
    if not 0 < high < 1 << 31:
        raise ValueError(f"high must be in (0, 2^31), got {high}")
    return (counter_bits(seed, counter, stream, n) * high) >> 32


def sample_inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One draw per row of probs (..., V) from uniforms u (...): the first index whose cumulative
    probability exceeds u * total (graph-safe; replaces ``torch.multinomial``)."""
    cdf = probs.cumsum(-1)
    target = (u * cdf[..., -1])[..., None].contiguous()
    return torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp_max(probs.shape[-1] - 1)


def temperature(step: torch.Tensor, max_steps: torch.Tensor, t_min: torch.Tensor, t_span: torch.Tensor):
    """`orl.decode.samplers.dgemma_temperature` on device tensors, bit for bit: T = t_min + (t_max -
    t_min) * (n / N) in float32, n = N - step steps remaining; t_min, t_span = float32(t_max - t_min)."""
    n = (max_steps - step).to(torch.int32)
    return t_min + t_span * (n / max_steps.to(torch.int32))


def dgemma_round(logits, hist, step, max_steps, t_min, t_span, bound, conf, seed, counter, greedy: bool):
    """One DiffusionGemma step from raw logits (1, K, V) (`orl.decode.block.decode`, rule "dgemma").

    hist (s, 1, K) argmax history (-1 at a canvas start); step, max_steps, seed, counter (1,) int64;
    t_min, t_span, bound (nats), conf (nats) (1,) float32. Returns (processed logits lg (1, K, V)
    float32, the next canvas (1, K), the next history, finished (1,) bool). Draws use ``counter``;
    the caller advances it. The reference of `dgemma_round_fused`."""
    K, V = logits.shape[1], logits.shape[2]
    lg = logits.float() / temperature(step, max_steps, t_min, t_span)
    arg = lg.argmax(-1)
    if greedy:
        tok = arg
    else:
        tok = sample_inverse_cdf(torch.softmax(lg, dim=-1), uniform(seed, counter, STREAM_SAMPLE, K).view(1, K))
    ent = Smp.dgemma_entropy(lg)
    return (lg, *_round_tail(arg, tok, ent, hist, step, max_steps, bound, conf, seed, counter, V))


def dgemma_round_fused(logits, hist, step, max_steps, t_min, t_span, bound, conf, seed, counter, greedy: bool,
                       probs_dtype: torch.dtype | None = None, round_dtype: torch.dtype | None = None):
    """`dgemma_round` with the per-position work over the logits (temperature, argmax, sample,
    entropy) in one Triton kernel (`orl.engine.dgemma_kernels`: one read of the logits, one more
    with the probabilities) and the same K-sized decisions after it. Returns (the self-conditioning
    probabilities ``dgemma_selfcond_probs(lg, round_dtype)`` (1, K, V) in ``probs_dtype``, or None
    when ``probs_dtype`` is None, the next canvas, the next history, finished). Equals
    `dgemma_round` up to float rounding (entropies and probabilities to ~1e-6 relative; a token, an
    acceptance or the stop can differ only at a rounding boundary). Needs CUDA tensors or
    ``TRITON_INTERPRET=1`` (float32)."""
    from . import dgemma_kernels as DK  # noqa: PLC0415 - Triton is imported on first use only
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


# ------------------------------------------------------------------------------- parity
class _CounterTorch:
    """Stands in for the ``torch`` module inside `orl.decode.block` / `orl.decode.samplers`:
    ``randint`` and ``multinomial`` draw from the counter RNG in the runtime's order, everything
    else is torch. Order per canvas: randint (canvas, counter c, then c + 1); per step:
    multinomial (counter c) and randint (noise, counter c, then c + 1)."""

    def __init__(self, seed: int):
        self._seed = torch.tensor([seed])
        self.counter = torch.zeros(1, dtype=torch.long)
        self.canvas_next = True

    def __getattr__(self, name):
        return getattr(torch, name)

    def randint(self, high, size, generator=None, device=None, **kw):
        n = 1
        for d in size:
            n *= d
        stream = STREAM_CANVAS if self.canvas_next else STREAM_NOISE
        out = randint(self._seed, self.counter, stream, n, high).view(size)
        self.counter += 1
        self.canvas_next = False
        return out

    def multinomial(self, probs, num_samples, generator=None, **kw):
        u = uniform(self._seed.to(probs.device), self.counter.to(probs.device), STREAM_SAMPLE, probs.shape[0])
        return sample_inverse_cdf(probs, u)[:, None]


@contextlib.contextmanager
def reference_rng(seed: int):
    """Within the block, `orl.decode.decode` (rule "dgemma", one row) draws the same numbers as
    `orl.engine.dgemma.DGemmaRuntime` with this seed. Yields ``on_block``-style hook
    ``new_canvas()`` that the caller must call after each committed canvas. Not thread-safe: it
    swaps the decoder modules' ``torch`` name while open."""
    from ..decode import block  # noqa: PLC0415
    proxy = _CounterTorch(seed)
    saved = block.torch, Smp.torch
    block.torch = Smp.torch = proxy
    try:
        yield lambda: setattr(proxy, "canvas_next", True)
    finally:
        block.torch, Smp.torch = saved
