"""Random streams for decoding, passed into `orl.decode.decode` as an object (no module patching).

A decoder draws three kinds of numbers: a fresh canvas (uniform-state models), a sample from the
step's distribution, and the re-noising of rejected positions. An RNG object answers each:

  ``canvas(high, shape, device)``   a new block's canvas, ints in [0, high)
  ``sample(probs)``                 one token per row of probs (N, V) -> (N,)
  ``noise(high, shape, device)``    the re-noised tokens of one step, ints in [0, high)

`TorchRNG` is torch's own stream (``torch.randint`` / ``torch.multinomial`` with a
``torch.Generator``): what `decode(generator=...)` uses, HF's draws. `CounterRNG` is the engine's
counter-based stream -- 32-bit words = hash(seed, counter, index) (``lowbias32``, C. Wellons'
hash-prospector, applied twice) in plain int64 torch ops, with ``counter`` a (1,) int64 tensor
advanced once per draw event (a canvas, a step), so a CUDA graph replayed in a device loop draws
fresh numbers with no host RNG (docs/engine.md, "Random numbers in the graph"). With the same
seed the reference decoder and `orl.engine.runtime.Runtime` draw the same numbers in the same
order, so they decode the same tokens. All arithmetic stays below 2^63: the same words on CPU and GPU.
Deviation from HF in `CounterRNG`: a sample is the inverse CDF of a float32 cumulative sum (one
uniform per row) instead of ``torch.multinomial``: the same distribution up to float32 rounding.
"""
from __future__ import annotations

import torch

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


class TorchRNG:
    """torch's stream: ``torch.randint`` / ``torch.multinomial`` on ``generator`` (None: torch's
    default generator). A CPU generator drives sampling on any device (drawn on the CPU)."""

    def __init__(self, generator: torch.Generator | None = None):
        self.generator = generator

    def _on_cpu(self, device) -> bool:
        return self.generator is not None and self.generator.device != torch.device(device)

    def canvas(self, high: int, shape, device) -> torch.Tensor:
        return torch.randint(high, shape, generator=self.generator, device="cpu").to(device)

    noise = canvas

    def sample(self, probs: torch.Tensor) -> torch.Tensor:
        if self._on_cpu(probs.device):
            return torch.multinomial(probs.cpu(), 1, generator=self.generator).to(probs.device).view(-1)
        return torch.multinomial(probs, 1, generator=self.generator).view(-1)


class CounterRNG:
    """The engine's counter-based stream from ``seed`` (module docstring), in the runtime's order:
    per canvas one ``canvas`` draw (counter c, then c + 1); per step a ``sample`` (counter c) and a
    ``noise`` draw (counter c, then c + 1). ``counter`` is a host-side (1,) int64 tensor."""

    def __init__(self, seed: int):
        if not 0 <= seed < 1 << 62:
            raise ValueError(f"seed must be in [0, 2^62), got {seed}")
        self.seed = torch.tensor([seed])
        self.counter = torch.zeros(1, dtype=torch.long)

    def _draw(self, stream: int, high: int, shape, device) -> torch.Tensor:
        n = 1
        for d in shape:
            n *= d
        out = randint(self.seed, self.counter, stream, n, high).view(shape).to(device)
        self.counter += 1
        return out

    def canvas(self, high: int, shape, device) -> torch.Tensor:
        return self._draw(STREAM_CANVAS, high, shape, device)

    def noise(self, high: int, shape, device) -> torch.Tensor:
        return self._draw(STREAM_NOISE, high, shape, device)

    def sample(self, probs: torch.Tensor) -> torch.Tensor:
        u = uniform(self.seed.to(probs.device), self.counter.to(probs.device), STREAM_SAMPLE, probs.shape[0])
        return sample_inverse_cdf(probs, u)
