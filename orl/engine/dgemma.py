"""The single-request runtime for DiffusionGemma: a whole canvas per launch, sampling on the device.

`DGemmaRuntime` is `orl.engine.runtime.Runtime` (same modes "eager" / "graph" / "while", same graph
cache, ``generate_block`` / ``decode`` / ``truncate`` / ``flush``; ``Runtime(model)`` returns one for
a uniform-noise model) with the DiffusionGemma pieces (docs/diffusiongemma-spec.md 6-9):
  prefill  the prompt through the encoder (causal; sliding layers q - W < k <= q), into the cache
  start    a uniform random canvas from the counter RNG, the argmax history reset, and the first
           round (no self-conditioning yet; with ``fold_commit`` the previous canvas is encoded
           causally in the same forward, its rows in encoder mode, the canvas rows in decoder mode)
  round    decoder forward over the canvas (bidirectional; cache + canvas, sliding layers the last
           W - 1 cached slots) with the self-conditioning input z -> `dgemma_sampler.dgemma_round`
           (temperature schedule, sample, entropy-bound accept, re-noise, stop test; or
           ``dgemma_round_fused``, the same in one Triton kernel over the logits: ``sampler``) -> z of
           the processed logits -> device flag "go on?"
  end      the committed canvas is the last argmax; its causal encoder pass (or folded, as above)
A round is a no-op once the flag is down, so an extra round (graph warm-up) changes nothing.
Random numbers come from `orl.engine.dgemma_sampler`'s counter RNG (seed per request, counter in
device memory, advanced once per canvas start and per round), so every replay of the loop body
draws fresh numbers. With `dgemma_sampler.reference_rng` the reference decoder draws the same ones:
then both decode the same tokens in the same rounds (tests/test_engine_dgemma.py).
Does not own: the forward's numerics (`orl.engine.dgemma_forward`), the sampler's
(`orl.engine.dgemma_sampler`), graphs (`orl.engine.graphs` via the base class).
Shapes: P prompt length, K canvas length, D hidden, V vocab, S attended cache slots.
"""
from __future__ import annotations

import dataclasses
import os

import torch

from ..decode import samplers as Smp
from ..decode.block import DecodeOutput
from ..decode.config import DecodeConfig
from . import dgemma_forward as DF
from . import dgemma_sampler as DS
from . import forward as F_
from .runtime import DTYPES, EngineConfig, Runtime


class DGemmaRuntime(Runtime):
    """Runtime for DiffusionGemma-configured models (``config.noise == "uniform"``). ``decode``
    takes ``seed`` (the counter RNG's; greedy decoding still draws the starting canvas and the
    re-noising). ``compile`` (None) stays off: compiling 30 MoE layers is left to callers.
    ``sampler``: the round's per-position work over the logits -- "torch" (`dgemma_sampler.dgemma_round`,
    the reference), "triton" (`dgemma_sampler.dgemma_round_fused`: one fused kernel, equal up to float
    rounding; CUDA, or CPU under ``TRITON_INTERPRET=1``), "auto": "triton" on CUDA when Triton
    imports, else "torch"."""

    def __init__(self, model, block_size: int | None = None, config: EngineConfig | None = None, *,
                 sampler: str = "auto", **overrides):
        self.config = dataclasses.replace(config or EngineConfig(), **overrides)
        ec = self.config
        self.mcfg = mcfg = model.config
        self.K = K = block_size or mcfg.block_size
        if ec.kernels != "torch":
            raise NotImplementedError("the Triton layer kernels (EngineConfig.kernels='triton') cover dense layers; "
                                      "DiffusionGemma runs with kernels='torch'")
        self.w = DF.bake(model, DTYPES[ec.dtype] if ec.dtype else None, ec.max_len, ec.moe_backend)
        self.device = dev = self.w.embed.device
        self.kv = DF.DGStaticKV(mcfg, ec.max_len, self.w.dtype, dev)
        self.mode = self._pick_mode(ec.mode)
        self.sampler = self._pick_sampler(sampler)
        self._layer = torch.compile(DF.layer, dynamic=False) if ec.compile else DF.layer
        z = lambda *s, dt=torch.long: torch.zeros(*s, dtype=dt, device=dev)  # noqa: E731
        # ---- static state, allocated once (graphs read and write only these) ----
        self.cache_len = z(1)
        self.canvas, self.prev = z(1, K), z(1, K)
        self.z = z(1, K, mcfg.hidden_size, dt=self.w.dtype)
        self.where = torch.ones(1, K, dtype=torch.bool, device=dev)  # every canvas position (pathway_where="canvas")
        self.no_canvas = z(1, K, dt=torch.bool)
        self.step, self.flag = z(1), z(1, dt=torch.bool)
        self.out = z(K + 1)
        self._hists: dict[int, torch.Tensor] = {}
        self.hist = None
        # ---- per-request numbers, on the device so graphs never bake them ----
        self.max_steps, self.seed, self.counter = z(1), z(1), z(1)
        self.t_min, self.t_span, self.bound, self.conf = (z(1, dt=torch.float32) for _ in range(4))
        self.request_seed = 0
        self.lim_canvas = torch.full((K,), K, device=dev)
        self.lim_block = torch.arange(1, K + 1, device=dev)  # committed text is causal (encoder)
        self.lim_fold = torch.cat([self.lim_block, torch.full((K,), 2 * K, device=dev)])
        self.length, self.pending = 0, False
        self._key_extra = None
        self._graphs: dict = {}
        self._loop = None
        self._cap_stream = torch.cuda.Stream(dev) if dev.type == "cuda" else None
        self._pool = torch.cuda.graph_pool_handle() if dev.type == "cuda" else None
        self._out_host = torch.zeros(K + 1, dtype=torch.long, pin_memory=dev.type == "cuda")

    # ------------------------------------------------------------------ setup
    def _pick_sampler(self, sampler: str) -> str:
        if sampler not in ("auto", "torch", "triton"):
            raise ValueError(f"sampler must be 'auto', 'torch' or 'triton', got {sampler!r}")
        cuda = self.device.type == "cuda"
        if sampler == "auto":
            from .moe import triton_available  # noqa: PLC0415
            return "triton" if cuda and triton_available() else "torch"
        if sampler == "triton" and not (cuda or os.environ.get("TRITON_INTERPRET") == "1"):
            raise ValueError("sampler 'triton' needs the model on a CUDA device (or TRITON_INTERPRET=1 for the CPU "
                             "interpreter); use sampler='torch'")
        return sampler

    def set_request(self, cfg: DecodeConfig, mask_id: int | None = None, seed: int | None = None) -> None:
        """One request's numbers into the device buffers (no recapture); the RNG counter restarts.
        ``seed`` None: ``self.request_seed`` (set by ``decode``)."""
        if cfg.rule != "dgemma":
            raise NotImplementedError(f"a DiffusionGemma model decodes with rule 'dgemma', not {cfg.rule!r}")
        if cfg.block_size != self.K:
            raise ValueError(f"DecodeConfig.block_size {cfg.block_size} != the runtime's canvas length {self.K}")
        seed = self.request_seed if seed is None else seed
        if not 0 <= seed < 1 << 62:
            raise ValueError(f"seed must be in [0, 2^62), got {seed}")
        for buf, v in ((self.max_steps, cfg.max_steps), (self.seed, seed), (self.counter, 0), (self.t_min, cfg.t_min),
                       (self.t_span, cfg.t_max - cfg.t_min), (self.bound, cfg.entropy_bound),
                       (self.conf, cfg.confidence_threshold)):
            buf.fill_(v)
        s = cfg.stability_threshold
        if s not in self._hists:  # one buffer per window length, kept for the graphs that use it
            self._hists[s] = torch.full((s, 1, self.K), -1, dtype=torch.long, device=self.device)
        self.hist = self._hists[s]
        use_res = cfg.residual and self.mcfg.pathway != "none"
        self._key_extra = ("dgemma", use_res, cfg.temperature == 0, s)

    # ------------------------------------------------------------ block pieces
    def _embed_forward(self, tokens, lim, S, residual=None, where=None, weight=None, logits_from=0):
        """Forward of ``tokens`` (1, T) at the cache end; rows with ``where`` are canvas (decoder)
        rows: self-conditioning input, canvas layer scalar, window anchored at the canvas start
        (their ``lim`` minus K); the others are committed text (encoder, causal)."""
        h = F_.embed(self.w, tokens, residual, where, weight)
        rows = torch.zeros_like(tokens, dtype=torch.bool) if where is None else where
        anc = torch.where(rows[0], lim - self.K, lim - 1)
        return DF.forward(self.w, h, self.cache_len, lim, anc, rows, self.kv, S, logits_from, self._layer)

    def _decide(self, logits: torch.Tensor) -> None:
        """One round's decision (gated by the flag: a no-op on a finished canvas)."""
        _, use_res, greedy, _ = self._key_extra
        act = self.flag.clone()
        args = (logits, self.hist, self.step, self.max_steps, self.t_min, self.t_span, self.bound, self.conf,
                self.seed, self.counter, greedy)
        if self.sampler == "triton":  # the probabilities come out in the embedding's dtype, as soft_embed casts
            probs, canvas, hist, finished = DS.dgemma_round_fused(
                *args, probs_dtype=self.w.embed.dtype if use_res else None, round_dtype=self.w.dtype)
        else:
            lg, canvas, hist, finished = DS.dgemma_round(*args)
            probs = Smp.dgemma_selfcond_probs(lg, self.w.dtype) if use_res else None
        self.canvas.copy_(torch.where(act[:, None], canvas, self.canvas))
        if self.hist.shape[0]:
            self.hist.copy_(torch.where(act[None, :, None], hist, self.hist))
        self.step.add_(act.long())
        self.counter.add_(act.long())
        self.flag.copy_(act & ~finished)
        if use_res:  # HF: z from the processed (temperature-scaled) logits, cast to the embedding dtype
            self.z.copy_(F_.soft_embed(self.w, probs))

    def _start(self, fold: bool, S: int) -> None:
        """A fresh random canvas and its first round (no self-conditioning: z = 0); with ``fold`` the
        previous canvas is encoded in the same forward and the cache length advances by K."""
        K = self.K
        self.canvas.copy_(DS.randint(self.seed, self.counter, DS.STREAM_CANVAS, K, self.mcfg.vocab_size).view(1, K))
        self.counter.add_(1)
        self.hist.fill_(-1)
        self.step.zero_()
        self.flag.fill_(True)
        self.z.zero_()
        if fold:
            tokens = torch.cat([self.prev, self.canvas], 1)
            where = torch.cat([self.no_canvas, self.where], 1)
            logits = self._embed_forward(tokens, self.lim_fold, S, None, where, None, logits_from=K)
            self.cache_len.add_(K)
        else:
            logits = self._embed_forward(self.canvas, self.lim_canvas, S, None, self.where, None)
        self._decide(logits)

    def _round(self, S: int) -> None:
        _, use_res, _, _ = self._key_extra
        logits = self._embed_forward(self.canvas, self.lim_canvas, S, self.z if use_res else None, self.where)
        self._decide(logits)

    def _graph(self, kind: str, fold: bool, S: int):
        """The base class's graphs; a capture's warm-up must not consume random numbers, except a
        round's (graph mode keeps the warm-up round as a real one, like the base class)."""
        counter = self.counter.clone()
        g = super()._graph(kind, fold, S)
        if kind != "round":
            self.counter.copy_(counter)
        return g

    def _prefill_forward(self, prompt: torch.Tensor) -> None:
        """The prompt encoded causally (DiffusionGemma's encoder mode) into the cache from slot 0."""
        P = prompt.shape[1]
        lim = torch.arange(1, P + 1, device=self.device)
        rows = torch.zeros(1, P, dtype=torch.bool, device=self.device)
        DF.forward(self.w, F_.embed(self.w, prompt), self.cache_len, lim, lim - 1, rows, self.kv, P, logits_from=None)

    # --------------------------------------------------------------- public API

    @torch.no_grad()
    def decode(self, prompt: torch.Tensor, cfg: DecodeConfig, *, eos_ids=(), mask_id: int | None = None,
               on_block=None, seed: int = 0) -> DecodeOutput:
        """`orl.decode.decode` for one row with rule "dgemma"; random numbers from ``seed``."""
        self.request_seed = seed
        return super().decode(prompt, cfg, eos_ids=eos_ids, mask_id=mask_id, on_block=on_block)
