"""Random streams for decoding, passed into `orl.decode.decode` as an object (no module patching).

A decoder draws three kinds of numbers: a fresh canvas (uniform-state models), a sample from the
step's distribution, and the re-noising of rejected positions. An RNG object answers each, and is
told when a step ends:

  ``canvas(high, shape, device)``   a new block's canvas, ints in [0, high)
  ``sample(probs)``                 one token per row of probs (N, V) -> (N,)
  ``noise(high, shape, device)``    the re-noised tokens of one step, ints in [0, high)
  ``advance(active)``               the step is over for the active rows (their next draws are fresh)

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
    """(R * n,) int64 random 32-bit words for draw event ``counter`` of ``stream``: n words for each
    of the R rows, row after row. seed (R,) and counter (R,) or (1,) int64 tensors (device-resident:
    nothing is read on the host). Row r's words depend on seed[r] and counter[r] only."""
    key = hash32((hash32(seed & M32) + _mul32(counter & M32, 0x9E3779B9) + stream * 0x632BE5AB) & M32)
    idx = torch.arange(n, device=counter.device)
    return hash32(hash32(key[:, None] ^ idx) ^ key[:, None]).view(-1)


def uniform(seed, counter, stream: int, n: int) -> torch.Tensor:
    """(R * n,) float32 in [0, 1), 24 random bits each."""
    return (counter_bits(seed, counter, stream, n) >> 8).float() * (1.0 / (1 << 24))


def randint(seed, counter, stream: int, n: int, high: int) -> torch.Tensor:
    """(R * n,) int64 in [0, high) (multiply-shift; exact when high is a power of two)."""
    if not 0 < high < 1 << 31:
        raise ValueError(f"high must be in (0, 2^31), got {high}")
    return (counter_bits(seed, counter, stream, n) * high) >> 32


def sample_inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One draw per row of probs (..., V) from uniforms u (...): the first index whose cumulative
    probability exceeds u * total (graph-safe; replaces ``torch.multinomial``)."""
    cdf = probs.cumsum(-1)
    target = (u * cdf[..., -1])[..., None].contiguous()
    return torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp_max(probs.shape[-1] - 1)


def row_seeds(seed, rows: int) -> list[int]:
    """One counter-RNG seed per row: an int ``s`` gives rows s, s + 1, ... (row 0's stream is the
    seed's own); a list is taken as it is (one per row)."""
    seeds = [seed + r for r in range(rows)] if isinstance(seed, int) else [int(x) for x in seed]
    if len(seeds) != rows:
        raise ValueError(f"{len(seeds)} seeds for {rows} rows: pass one int or one seed per row")
    for x in seeds:
        if not 0 <= x < 1 << 62:
            raise ValueError(f"seed must be in [0, 2^62), got {x}")
    return seeds


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
        """One draw per row of probs (..., V) -> (...): ``torch.multinomial`` over all rows at once."""
        flat = probs.reshape(-1, probs.shape[-1])
        if self._on_cpu(probs.device):
            out = torch.multinomial(flat.cpu(), 1, generator=self.generator).to(probs.device)
        else:
            out = torch.multinomial(flat, 1, generator=self.generator)
        return out.view(probs.shape[:-1])

    def advance(self, active=None) -> None:
        pass


class CounterRNG:
    """The engine's counter-based stream (module docstring), in the runtime's order, with one
    counter per row: a ``canvas`` draw at the row's counter c, then c + 1 for every row; per step a
    ``sample`` and a ``noise`` draw at c, then ``advance(active)``: c + 1 for the rows that took the
    step. ``seed``: an int or one per row, as `row_seeds` reads it. A row's numbers depend on its
    seed and its own steps only, so a rollout draws the same alone or in any batch, and
    `orl.engine.runtime.Runtime` with the same ``seed`` draws the same."""

    def __init__(self, seed):
        self.seed_arg = seed
        self.counter = None  # (rows,) int64, on the CPU; sized by the first draw

    def _state(self, rows: int):
        if self.counter is None:
            self.seeds = torch.tensor(row_seeds(self.seed_arg, rows), dtype=torch.long)
            self.counter = torch.zeros(rows, dtype=torch.long)
        if self.counter.numel() != rows:
            raise ValueError(f"this stream has {self.counter.numel()} rows, not {rows}")
        return self.seeds, self.counter

    def _words(self, fn, stream: int, shape, device, *extra) -> torch.Tensor:
        """Words of ``fn`` for a (rows, ...) draw: each row from its own seed and counter."""
        n = 1
        for d in shape[1:]:
            n *= d
        seeds, counter = self._state(shape[0])
        return fn(seeds, counter, stream, n, *extra).view(shape).to(device)

    def canvas(self, high: int, shape, device) -> torch.Tensor:
        out = self._words(randint, STREAM_CANVAS, shape, device, high)
        self.counter += 1
        return out

    def noise(self, high: int, shape, device) -> torch.Tensor:
        return self._words(randint, STREAM_NOISE, shape, device, high)

    def sample(self, probs: torch.Tensor) -> torch.Tensor:
        """One draw per row of probs (B, K, V) -> (B, K) by the inverse CDF of one uniform each."""
        u = self._words(uniform, STREAM_SAMPLE, probs.shape[:-1], probs.device)
        return sample_inverse_cdf(probs, u)

    def advance(self, active: torch.Tensor | None = None) -> None:
        """The step is over for the ``active`` rows (B,) bool (None: every row)."""
        if self.counter is None:
            return
        self.counter += 1 if active is None else active.to("cpu", torch.long)
