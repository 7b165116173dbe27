"""Capture of every denoising step for the loss, written by the runtime's graphs, read on the host.

What ORL replays (docs/method.md 3.4) is the state each step consumed and what the rollout policy
said there; this module owns the static device buffers the runtime writes them into during a block
and their trip to the host:

  per round i of a block, per row (index ``i`` a device counter, so the writes live in the graph)
    canvas (K,) int64   unresolved (K,) bool   z consumed (K, D) in the dtype the step consumed it
    where (K,) bool     weight (K,) float32 (rcd only)     entropy (K,) float32 (normalised)
    committed (K,) bool active () bool         top-k ids (K, k) int64 and log-probs (K, k) float32
  a round that runs with the flag down (a graph warm-up) writes to a scratch slot instead.

After a block's one read-back the host knows how many rounds ran (the most any row took) and
copies that many rounds into pinned host memory on a side stream; the next block's launch waits
for the copy on the device, not on the host. Never whole (K, V) logits: the budget per rollout
(one row) per step is K (8 + 1 + 1 + 4 + 4 + 1 + 2 D + 12 k) + 1 bytes with a bf16 z (D = 2560,
K = 32, k = 16: 170 KB; 256 tokens in 8 blocks of <= 32 steps: <= 44 MB per rollout).
`records` turns the host copy into `orl.decode.block.StepRecord`s, the reference decoder's trace.
Does not own: what the rule decides (`orl.engine.rules`), the loop (`orl.engine.runtime`).
Shapes: R rounds per block (cap), B rows, K block length, D hidden, k top-k.
"""
from __future__ import annotations

import torch

from ..decode import samplers as Smp
from ..decode.block import StepRecord

FIELDS = ("canvas", "unresolved", "z", "where", "weight", "entropy", "committed", "active", "ids", "logp")


def topk_lastdim(x: torch.Tensor, k: int, chunks: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """``x.topk(k, -1)`` over a long last axis (a vocabulary) in two stages: the top k of each of
    ``chunks`` slices, then the top k of those (one pass with ``chunks`` times the parallelism)."""
    V = x.shape[-1]
    if V % chunks or V // chunks < k:
        return x.topk(k, -1)
    part, idx = x.reshape(*x.shape[:-1], chunks, V // chunks).topk(k, -1)
    idx = idx + torch.arange(0, V, V // chunks, device=x.device)[:, None]
    top, j = part.flatten(-2).topk(k, -1)
    return top, idx.flatten(-2).gather(-1, j)


class Capture:
    """Device buffers for R rounds (+ one scratch slot) of B rows, and the host copy of a request."""

    def __init__(self, R: int, B: int, K: int, D: int, topk: int, z_dtype: torch.dtype, device, rcd: bool):
        self.R, self.B, self.K, self.topk, self.rcd = R, B, K, topk, rcd
        self.device = device
        e = lambda *s, dt: torch.zeros(R + 1, *s, dtype=dt, device=device)  # noqa: E731
        self.dev = {"canvas": e(B, K, dt=torch.long), "unresolved": e(B, K, dt=torch.bool),
                    "z": e(B, K, D, dt=z_dtype), "where": e(B, K, dt=torch.bool),
                    "weight": e(B, K, dt=torch.float32) if rcd else None,
                    "entropy": e(B, K, dt=torch.float32), "committed": e(B, K, dt=torch.bool),
                    "active": e(B, dt=torch.bool),
                    "ids": e(B, K, topk, dt=torch.long) if topk else None,
                    "logp": e(B, K, topk, dt=torch.float32) if topk else None}
        self.cuda = device.type == "cuda"
        self._stream = torch.cuda.Stream(device) if self.cuda else None
        self._event = None
        self.host: list[dict] = []     # per block: {field: (rounds, ...) tensor on the host}

    def key(self) -> tuple:
        return (self.R, self.topk)

    def bytes_per_round(self) -> int:
        return sum(t[0].numel() * t.element_size() for t in self.dev.values() if t is not None)

    # ---------------------------------------------------------------- in the graph
    def slot(self, rnd: torch.Tensor, go: torch.Tensor) -> torch.Tensor:
        """(1,) index of this round: ``rnd``, or the scratch slot R when the flag is down."""
        return torch.where(go, rnd, torch.full_like(rnd, self.R))

    def inputs(self, i, canvas, unresolved, z, where, weight) -> None:
        d = self.dev
        d["canvas"].index_copy_(0, i, canvas[None])
        d["unresolved"].index_copy_(0, i, unresolved[None])
        d["z"].index_copy_(0, i, z[None])
        d["where"].index_copy_(0, i, where[None])
        if d["weight"] is not None:
            d["weight"].index_copy_(0, i, weight[None])

    def outputs(self, i, logits, dist, committed, active, lse=None) -> None:
        """What a round chose: ``dist`` the rule's `orl.engine.rules.Dist` (its normalised entropy,
        or its probabilities); top-k over its float logits, or over the raw ``logits`` (their
        float32 upcast is exact, so the top-k values are); ``lse`` (B, K): the raw logits'
        logsumexp when the rule computed it (else one pass here)."""
        d = self.dev
        ent = dist.ent if dist.ent is not None else Smp.normalized_entropy(dist.probs)
        d["entropy"].index_copy_(0, i, ent[None])
        d["committed"].index_copy_(0, i, committed[None])
        d["active"].index_copy_(0, i, active[None])
        if self.topk:
            # half-precision logits: their top-k directly (half the bytes and radix passes of the float32
            # copy; the values upcast exactly); else the rule's float logits
            half = logits.dtype in (torch.bfloat16, torch.float16)
            src = logits if half or dist.lf is None else dist.lf
            top, ids = topk_lastdim(src, self.topk)  # log_softmax's top-k = the logits' top-k - logsumexp
            if lse is None:
                lse = torch.logsumexp(dist.lf if dist.lf is not None else logits.float(), -1, keepdim=True)
            else:
                lse = lse[..., None]
            d["ids"].index_copy_(0, i, ids[None])
            d["logp"].index_copy_(0, i, (top.float() - lse)[None])

    # ---------------------------------------------------------------- on the host
    def start(self) -> None:
        self.host = []

    def wait(self) -> None:
        """The next launch may overwrite the buffers only after the last copy (a device-side wait)."""
        if self._event is not None:
            torch.cuda.current_stream(self.device).wait_event(self._event)
            self._event = None

    def take(self, rounds: int) -> None:
        """Copy the block's first ``rounds`` rounds to the host (pinned, asynchronous on CUDA)."""
        out = {}
        if self.cuda:
            self._stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self._stream):
                for k, t in self.dev.items():
                    if t is not None:
                        h = torch.empty(t[:rounds].shape, dtype=t.dtype, pin_memory=True)
                        h.copy_(t[:rounds], non_blocking=True)
                        out[k] = h
            self._event = torch.cuda.Event()
            self._event.record(self._stream)
        else:
            out = {k: t[:rounds].clone() for k, t in self.dev.items() if t is not None}
        self.host.append(out)

    def records(self, use_residual: bool) -> list[StepRecord]:
        """The request's steps as the reference decoder's trace (B rows per record)."""
        if self.cuda:
            torch.cuda.current_stream(self.device).synchronize()
            if self._stream is not None:
                self._stream.synchronize()
        recs = []
        for b, h in enumerate(self.host):
            for i in range(h["canvas"].shape[0]):
                z = h["z"][i] if use_residual and i > 0 else None
                recs.append(StepRecord(
                    b, i, h["canvas"][i], h["unresolved"][i], z, h["where"][i] if use_residual else None,
                    h["weight"][i] if use_residual and i > 0 and "weight" in h else None, h["entropy"][i],
                    h["committed"][i], h["active"][i], None,
                    h["ids"][i] if "ids" in h else None, h["logp"][i] if "logp" in h else None))
        return recs
