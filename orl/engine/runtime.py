"""The runtime: static buffers, one block per launch, the denoising loop on the GPU, every family.

Owns the fast twin of `orl.decode.decode` (batch 1) for the rules of `orl.engine.rules`: SDAR's
"threshold" / "topk" and LLaDA-2.1's "llada" on mask-diffusion models (`MaskRule`, greedy), and
DiffusionGemma's "dgemma" on uniform-state models (`CanvasRule`, sampled or greedy from a seed),
with or without the residual pathway, dense or mixture-of-experts layers:

  prefill (eager)  ->  per block:  start  ->  round*  ->  end  ->  host reads K tokens + steps
    start  fresh canvas (the rule's ``begin``) and the first round (with ``fold_commit``: the
           previous block's commit pass is folded into it, one forward over [previous block | canvas])
    round  forward over the canvas attending cache + canvas -> logits -> the rule's ``decide``
           (commit / accept / re-noise, the residual z for the next round, the device flag "go on?")
    end    the commit pass (without ``fold_commit``) and the output copy
Every piece reads and writes only static device buffers (canvas, z, step, cache length, the
rule's state and per-request numbers), so the same Python functions run three ways
(``EngineConfig.mode``):
  "eager"  plain PyTorch, host loop reading the flag each round (runs on CPU; the slow twin)
  "graph"  start / round / end each a CUDA graph, host loop reading the flag each round
  "while"  the whole block one CUDA graph; rounds loop on the device through a conditional
           WHILE node (`orl.engine.graphs.WhileLoop`); the host launches and reads back once.
Graphs are captured lazily per (attended cache slots S rounded up to ``bucket``, the request's
rule key, folded start) and reused for every later block and request.
Greedy tokens equal the reference decoder's (tests/test_engine_cpu.py, tests/test_engine_gpu.py),
up to floating-point ties; "dgemma" with ``rng=CounterRNG(seed)`` in the reference decoder gives
the runtime's tokens for ``seed`` (tests/test_engine_dgemma.py).
Does not own: tokenizers, text or streaming (`orl.serve.llm`), the rules' numerics
(`orl.engine.rules`, `orl.decode.samplers`), the model's numerics (`orl.engine.forward`).
Shapes: P prompt length, K block length, D hidden, V vocab, S attended cache slots.
"""
from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass
from typing import Callable

import torch

from ..decode.block import DecodeOutput
from ..decode.config import DecodeConfig
from . import forward as F_
from .graphs import WhileLoop, capture, conditional_nodes_available
from ..decode.rng import row_seeds
from .capture import Capture
from .rules import CanvasRule, MaskRule

MODES = ("auto", "eager", "graph", "while")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class EngineConfig:
    mode: str = "auto"            # see MODES; "auto": "while" on CUDA when possible, else "graph" / "eager"
    max_len: int = 4096           # static KV slots: prompt + generated tokens + one block
    dtype: str | None = None      # weights and activations; None: the model's dtype
    fold_commit: bool = True      # commit block b inside block b+1's first round (one forward fewer per block)
    bucket: int = 128             # attended cache slots S are rounded up to a multiple of this (one
                                  # set of graphs per bucket, sharing one memory pool)
    compile: bool | None = None   # torch.compile each layer (no CUDA-graph trees) before capture;
                                  # None: on CUDA (about 2x faster rounds, ~10 s of compilation per
                                  # canvas length on first use), not on CPU
    moe_backend: str = "auto"     # MoE layers (orl.engine.moe): "triton" grouped kernels, "torch"
                                  # twin; "auto": Triton on CUDA when importable
    kernels: str = "torch"        # "torch": the forward above; "triton": `orl.kernels.layers` (dense
                                  # layers; fewer, fused kernels; numerics within rounding, not bitwise)
    tp: bool = False              # tensor parallel over the torch.distributed group (torchrun; orl.engine.tp):
                                  # every rank runs the same loop on its shard; no compile by default

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)} or None, got {self.dtype!r}")
        if self.bucket < 1 or self.max_len < 1:
            raise ValueError("bucket and max_len must be positive")
        if self.kernels not in ("torch", "triton"):
            raise ValueError(f"kernels must be 'torch' or 'triton', got {self.kernels!r}")



# One compiled ``layer`` serves every (rows, cache bucket) shape, every layer kind (a dense first layer,
# MoE layers: their guards differ) and both grad modes, in every runtime of the process: a rollout at
# 4 batch sizes x 7 cache buckets needs ~60 entries. Dynamo's default of 8 then silently ran the
# later shapes eagerly (measured 2026-12-01 on the H200: B = 16 rounds at 1.7x the compiled time).
RECOMPILE_LIMIT = 512


def _allow_recompiles() -> None:
    import torch._dynamo  # noqa: PLC0415
    cfg = torch._dynamo.config
    for name, value in (("recompile_limit", RECOMPILE_LIMIT), ("cache_size_limit", RECOMPILE_LIMIT),
                        ("accumulated_recompile_limit", 8 * RECOMPILE_LIMIT),
                        ("accumulated_cache_size_limit", 8 * RECOMPILE_LIMIT)):
        if hasattr(cfg, name) and getattr(cfg, name) < value:
            setattr(cfg, name, value)

class Runtime:
    """Runtime(model, block_size) -> ``decode(prompt_ids, DecodeConfig)`` -> `DecodeOutput`.

    Lower level: ``prefill(prompt_ids)``, then ``generate_block()`` per block (returns the K tokens
    and the rounds used), ``flush()`` to commit a pending block. The rule comes from the model:
    `CanvasRule` for a uniform-state model (``config.noise == "uniform"``; ``sampler`` picks its
    logits pass), `MaskRule` otherwise. ``compile`` None compiles on CUDA except for uniform-state
    (MoE-heavy DiffusionGemma) models, where compiling 30 MoE layers is left to callers."""

    def __init__(self, model, block_size: int | None = None, config: EngineConfig | None = None, *,
                 batch: int = 1, sampler: str = "auto", **overrides):
        self.config = dataclasses.replace(config or EngineConfig(), **overrides)
        ec = self.config
        self.mcfg = mcfg = model.config
        self.K = K = block_size or mcfg.block_size
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        self.B = B = batch
        self.uniform = mcfg.noise == "uniform"
        if self.uniform and ec.kernels != "torch":
            raise NotImplementedError("the Triton layer kernels (EngineConfig.kernels='triton') cover dense and MoE "
                                      "layers; DiffusionGemma runs with kernels='torch'")
        dtype = DTYPES[ec.dtype] if ec.dtype else None
        self.w = F_.bake(model, dtype, ec.max_len, ec.moe_backend)
        if ec.tp:
            from .tp import shard  # noqa: PLC0415
            self.w = shard(self.w)
        self.device = dev = self.w.embed.device
        self.kv = F_.StaticKV(self.w.cfg, ec.max_len, self.w.dtype, dev, batch=B)  # local KV heads under tp
        self.mode = self._pick_mode(ec.mode)
        self._layer, self._kernels = F_.layer, None
        if ec.kernels == "triton" and B > 1:
            raise NotImplementedError("the Triton layer kernels run batch 1; use kernels='torch' for batch > 1")
        if ec.kernels == "triton":  # the whole layer stack runs as Triton kernels: nothing to compile
            from ..kernels.layers import TritonKernels  # noqa: PLC0415 - optional dependency
            self._kernels = TritonKernels(self.w)
        elif ec.compile or (ec.compile is None and dev.type == "cuda" and not ec.tp and not self.uniform):
            _allow_recompiles()
            self._layer = torch.compile(F_.layer, dynamic=False)  # T static: one kernel set per T
        D = mcfg.hidden_size
        z = lambda *s, dt=torch.long: torch.zeros(*s, dtype=dt, device=dev)  # noqa: E731
        # ---- static state, allocated once (graphs read and write only these) ----
        self.cache_len = z(1)                    # committed slots in the KV cache (every row: same length)
        self.canvas, self.prev = z(B, K), z(B, K)  # current canvas; previous block (pending commit)
        self.z, self.where = z(B, K, D, dt=self.w.dtype), z(B, K, dt=torch.bool)
        self.weight = z(B, K, dt=torch.float32)  # rcd interpolation weight
        self.step = z(B)                         # rounds each row took in this block
        self.rnd = z(1)                          # rounds run in this block (every active row's step)
        self.flag = z(1, dt=torch.bool)          # "go on?": some row still denoising
        self.done = z(B, dt=torch.bool)          # rows that ended (EOS) in an earlier block: idle
        self.pad = z(B)                          # left padding of each row's prompt (ragged prompts)
        self._padded = False                     # host mirror: some row is padded (its own graphs)
        self.out = z(B, K + 1)                   # per row: block tokens, then the rounds used
        self.rule = CanvasRule(self, sampler) if self.uniform else MaskRule(self, sampler)
        if self.uniform:
            self.where.fill_(True)               # every canvas position is a decoder row (pathway_where="canvas")
        # visibility limits (see orl.engine.forward): canvas rows see the canvas; committed block
        # rows see their block (block-causal) or the slots up to themselves (causal)
        blk = torch.arange(1, K + 1) if self.rule.block_causal else torch.full((K,), K)
        self.lim_canvas = torch.full((K,), K, device=dev)
        self.lim_block = blk.to(dev)
        self.lim_fold = torch.cat([blk, torch.full((K,), 2 * K)]).to(dev)
        self.no_canvas = z(B, K, dt=torch.bool)
        self.length, self.pending = 0, False     # host mirrors of cache_len and "prev not committed"
        self._key_extra = None                   # the request's rule key (part of every graph key)
        self._cap, self._caps = None, {}         # step capture of the request (orl.engine.capture)
        self.request_seed = 0
        self._graphs: dict = {}
        self._loop = None
        self._cap_stream = torch.cuda.Stream(dev) if dev.type == "cuda" else None
        self._pool = torch.cuda.graph_pool_handle() if dev.type == "cuda" else None
        self._out_host = torch.zeros(B, K + 1, dtype=torch.long, pin_memory=dev.type == "cuda")

    @torch.no_grad()
    def load_weights(self, model) -> None:
        """Take ``model``'s current weights (same architecture), in place: graphs stay valid."""
        F_.refresh(self.w, model)

    @property
    def sampler(self) -> str | None:
        return getattr(self.rule, "sampler", None)

    # ------------------------------------------------------------------ setup
    def _pick_mode(self, mode: str) -> str:
        cuda = self.device.type == "cuda"
        if mode == "auto":
            return ("while" if conditional_nodes_available()[0] else "graph") if cuda else "eager"
        if mode in ("graph", "while") and not cuda:
            raise ValueError(f"mode {mode!r} needs the model on a CUDA device; use mode='eager' on CPU")
        if mode == "while":
            ok, why = conditional_nodes_available()
            if not ok:
                raise RuntimeError(f"mode 'while' unavailable: {why}; use mode='graph'")
        return mode

    def set_request(self, cfg: DecodeConfig, mask_id: int | None = None, seed=None,
                    capture_topk: int | None = None) -> None:
        """Copy one request's decoding numbers into the device buffers (no recapture needed).
        ``seed``: the counter RNG's (`orl.decode.rng.row_seeds`: an int, or one per row; read when
        sampling and by uniform-state models); None: ``self.request_seed``. ``capture_topk``: capture
        every step for the loss (`orl.engine.capture`, with that many top-k log-probs; None: off)."""
        if cfg.block_size != self.K:
            raise ValueError(f"DecodeConfig.block_size {cfg.block_size} != the runtime's block size (canvas length) {self.K}")
        seeds = row_seeds(self.request_seed if seed is None else seed, self.B)
        rule_key = self.rule.set_request(self, cfg, mask_id, seeds)
        self.done.zero_()
        self._cap = None
        if capture_topk is not None:
            R = cfg.max_steps + (cfg.max_post_steps if cfg.rule == "llada" else 0)
            key = (R, capture_topk)
            if key not in self._caps:  # kept: the graphs captured with them write into these buffers
                self._caps[key] = Capture(R, self.B, self.K, self.mcfg.hidden_size, capture_topk, self.w.dtype,
                                          self.device, self.mcfg.pathway == "rcd")
            self._cap = self._caps[key]
            self._cap.start()
        self._key_extra = (*rule_key, None if self._cap is None else self._cap.key())

    # ------------------------------------------------------------ block pieces
    # These run eagerly or are captured; they touch only static buffers (docs/STYLE.md 10).
    def _embed_forward(self, tokens, lim, S, residual=None, where=None, weight=None, logits_from=0, rows=None):
        """Forward of ``tokens`` (B, T) at the cache end. ``rows`` (B, T) bool marks canvas (decoder)
        rows -- layer scalars, the sliding window anchored at the canvas start (their ``lim`` minus
        K) -- the others are committed text (causal anchors)."""
        h = F_.embed(self.w, tokens, residual, where, weight)
        anc = None
        if "sliding" in self.mcfg.layer_types:
            anc = lim - 1 if rows is None else torch.where(rows[0], lim - self.K, lim - 1)
        return F_.forward(self.w, h, self.cache_len, lim, self.kv, S, logits_from, self._layer,
                          kernels=self._kernels, canvas_rows=rows, anc=anc, pad=self.pad if self._padded else None)

    def _start(self, fold: bool, S: int) -> None:
        """Fresh canvas and the first round (no residual yet); with ``fold`` the previous block is
        committed in the same forward and the cache length advances by K."""
        self.rnd.zero_()
        self.rule.begin(self)
        self._denoise(S, first=True, fold=fold)

    def _round(self, S: int) -> None:
        """One more round; a no-op once the flag is down (a graph warm-up, or an extra replay)."""
        self._denoise(S, first=False, fold=False)

    def _denoise(self, S: int, first: bool, fold: bool) -> None:
        """One round over the canvas (folded after the previous block's commit rows when ``fold``):
        capture what it consumes, forward, the rule's decision, capture what it chose."""
        K = self.K
        go = self.flag.clone()
        residual, where, weight = self.rule.canvas_inputs(self, first=first)
        if self._cap is not None:
            slot = self._cap.slot(self.rnd, go)
            self._cap.inputs(slot, self.canvas, self.rule.unresolved, self.z, self.where, self.weight)
        rows = self.where if self.uniform else None
        if fold:
            tokens = torch.cat([self.prev, self.canvas], 1)
            if where is not None:
                where = torch.cat([self.no_canvas, where], 1)
            if rows is not None:
                rows = torch.cat([self.no_canvas, rows], 1)
            logits = self._embed_forward(tokens, self.lim_fold, S, residual, where, weight, logits_from=K, rows=rows)
            self.cache_len.add_(K)
        else:
            logits = self._embed_forward(self.canvas, self.lim_canvas, S, residual, where, weight, rows=rows)
        self.rule.decide(self, logits)
        if self._cap is not None:
            self._capture_outputs(slot, logits)
        self.rnd.add_(go.long())

    def _capture_outputs(self, slot, logits) -> None:
        d, stepping = self.rule.last
        self._cap.outputs(slot, logits, d, self.rule.last_take & stepping[:, None], stepping, lse=self.rule.raw_lse(d))

    def _end(self, S: int) -> None:
        """With ``fold_commit`` the finished block waits in ``prev`` for the next block's start;
        without, the commit pass runs here."""
        if self.config.fold_commit:
            self.prev.copy_(self.canvas)
        else:  # the cache-commit pass: the finished block as clean text
            self._embed_forward(self.canvas, self.lim_block, S, logits_from=None)
            self.cache_len.add_(self.K)
        self.out[:, :self.K].copy_(self.canvas)
        self.out[:, self.K].copy_(self.step)

    # ------------------------------------------------------------------ graphs
    def _graph(self, kind: str, fold: bool, S: int):
        key = (kind, fold, S, self._key_extra, self._padded)
        g = self._graphs.get(key)
        if g is not None:
            return g
        saved = (self.cache_len.clone(), self.prev.clone())  # the warm-up runs the pieces once
        rule_saved = [t.clone() for t in self.rule.saved()]  # e.g. the RNG counter: warm-ups draw nothing
        if kind == "start":
            g = capture(lambda: self._start(fold, S), self._cap_stream, pool=self._pool)
        elif kind == "round":
            g = capture(lambda: self._round(S), self._cap_stream, pool=self._pool)
        elif kind == "end":
            g = capture(lambda: self._end(S), self._cap_stream, pool=self._pool)
        else:  # "block": start -> WHILE(round) -> end, one launch
            if self._loop is None:
                self._loop = WhileLoop(self.device)
            cs, bs = self._cap_stream, self._loop.body_stream
            for stream, piece in ((cs, lambda: self._start(fold, S)), (bs, lambda: self._round(S)),
                                  (cs, lambda: self._end(S))):  # warm-up, each on its stream
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    piece()
                torch.cuda.current_stream().wait_stream(stream)
            self.cache_len.copy_(saved[0])
            self.prev.copy_(saved[1])

            def block():
                self._start(fold, S)
                with self._loop.loop(self.flag):
                    self._round(S)
                self._end(S)
            g = capture(block, cs, warmup=False, pool=self._pool)
        self.cache_len.copy_(saved[0])
        self.prev.copy_(saved[1])
        if kind != "round":  # graph mode keeps the warm-up round as a real one (a no-op once finished)
            for t, v in zip(self.rule.saved(), rule_saved):
                t.copy_(v)
        self._graphs[key] = g
        return g

    def _slots(self, need: int) -> int:
        S = min(math.ceil(need / self.config.bucket) * self.config.bucket, self.config.max_len)
        if need > S:
            raise ValueError(f"the KV cache holds {self.config.max_len} slots but this block needs {need}; "
                             "raise EngineConfig.max_len (prompt + max_new_tokens + one block)")
        return S

    # --------------------------------------------------------------- public API
    @torch.no_grad()
    def prefill(self, prompt) -> None:
        """Reset the runtime to ``prompt``: (P,) or (1, P) int64 for one prompt shared by every row
        (prefilled once, its keys/values copied to the other rows), (B, P) for B prompts of equal
        length (one batched prefill), or a list of B token lists of any lengths (left-padded to the
        longest: a row's positions start after its padding and nothing sees the padded slots)."""
        prompt = self._pad_prompts(prompt)
        if prompt.shape[0] not in (1, self.B):
            raise ValueError(f"prompt has {prompt.shape[0]} rows; the runtime has {self.B} (pass 1 or {self.B})")
        shared = prompt.shape[0] == 1 or bool((prompt == prompt[:1]).all())
        P = prompt.shape[1]
        self._slots(P + self.K)
        self.cache_len.zero_()
        self._prefill_forward(prompt[:1] if shared else prompt, self.kv.rows(0, 1) if shared else self.kv,
                              None if shared or not self._padded else self.pad)  # eager
        if shared and self.B > 1:
            self.kv.broadcast_prefix(P)
        self.cache_len.fill_(P)
        self.length, self.pending = P, False

    def _pad_prompts(self, prompt) -> torch.Tensor:
        """(rows, P) int64 on the device; ragged lists are left-padded, ``pad`` says by how much."""
        if isinstance(prompt, (list, tuple)) and prompt and isinstance(prompt[0], (list, tuple)):
            if len(prompt) != self.B:
                raise ValueError(f"{len(prompt)} prompts for a runtime of {self.B} rows")
            if self.uniform:
                raise NotImplementedError("ragged prompts cover the mask-diffusion rules; pad them yourself or "
                                          "decode DiffusionGemma prompts of equal length")
            P = max(len(p) for p in prompt)
            if min(len(p) for p in prompt) < 1:
                raise ValueError("every prompt needs at least one token")
            pads = [P - len(p) for p in prompt]
            self.pad.copy_(torch.tensor(pads))
            self._padded = any(pads)
            rows = [[int(p[0])] * n + list(p) for p, n in zip(prompt, pads)]  # any token: padded slots are unseen
            return torch.tensor(rows, dtype=torch.long, device=self.device)
        self.pad.zero_()
        self._padded = False
        prompt = torch.as_tensor(prompt)
        return prompt.reshape(-1, prompt.shape[-1]).to(self.device)

    def _prefill_forward(self, prompt: torch.Tensor, kv, pad=None) -> None:
        """The prompt's keys/values into ``kv`` from slot 0 (prompt tokens: one block each =
        causal; DiffusionGemma's encoder mode)."""
        P = prompt.shape[1]
        lim = torch.arange(1, P + 1, device=self.device)
        rows = torch.zeros(1, P, dtype=torch.bool, device=self.device) if self.uniform else None
        anc = lim - 1 if "sliding" in self.mcfg.layer_types else None
        F_.forward(self.w, F_.embed(self.w, prompt), self.cache_len, lim, kv, P, logits_from=None,
                   kernels=self._kernels, canvas_rows=rows, anc=anc, pad=pad)

    @torch.no_grad()
    def launch_block(self) -> list[list[int]]:
        """Denoise the next block of every row (one launch and one read-back in mode "while");
        returns per row its K tokens followed by the rounds it took. Needs `prefill` and
        `set_request` first; rows in ``done`` stay idle (their canvas is not denoised)."""
        if self._key_extra is None:
            raise RuntimeError("call set_request(DecodeConfig) before generating a block")
        fold = self.config.fold_commit and self.pending
        S = self._slots(self.length + (2 if fold else 1) * self.K)
        if self._cap is not None:
            self._cap.wait()  # the previous block's capture is on its way to the host
        if self.mode == "eager":
            self._start(fold, S)
            while bool(self.flag):
                self._round(S)
            self._end(S)
        elif self.mode == "graph":
            self._graph("start", fold, S).replay()
            rnd = self._graph("round", False, S)
            while bool(self.flag):  # one host sync per round: the fallback
                rnd.replay()
            self._graph("end", False, S).replay()
        else:
            try:
                g = self._graph("block", fold, S)
            except Exception as exc:  # noqa: BLE001 - "auto" prefers a slower path to an error
                if self.config.mode != "auto":
                    raise
                warnings.warn(f"device WHILE loop unavailable ({exc}); falling back to mode='graph'")
                self.mode = "graph"
                return self.launch_block()
            g.replay()
        self._out_host.copy_(self.out, non_blocking=True)
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        if fold or not self.config.fold_commit:  # a block was committed in this launch
            self.length += self.K
        self.pending = self.config.fold_commit
        vals = self._out_host.tolist()
        if self._cap is not None:
            self._cap.take(max(v[self.K] for v in vals))
        return vals

    @torch.no_grad()
    def generate_block(self) -> tuple[list[int], int]:
        """`launch_block` for batch 1: the K tokens and the rounds the block took."""
        if self.B != 1:
            raise ValueError(f"generate_block is the batch-1 call; this runtime has {self.B} rows: use launch_block")
        vals = self.launch_block()[0]
        return vals[:self.K], vals[self.K]

    @torch.no_grad()
    def flush(self) -> None:
        """Commit a pending block (``fold_commit``) so the cache holds every generated token."""
        if self.pending:
            self._embed_forward(self.prev, self.lim_block, self._slots(self.length + self.K), logits_from=None)
            self.cache_len.add_(self.K)
            self.length += self.K
            self.pending = False

    def truncate(self, length: int) -> None:
        """Forget everything after ``length`` committed tokens (a pending block too); the buffers
        stay (e.g. to decode again after a shared prefix)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"can truncate to 0..{self.length} tokens, not {length}")
        self.cache_len.fill_(length)
        self.length, self.pending = length, False

    @torch.no_grad()
    def append_block(self, tokens) -> None:
        """Commit K given tokens ((K,) for every row, or (B, K)) as a finished block (a forced
        prefix, or teacher forcing in `orl.engine.parity`), after any pending one."""
        self.flush()
        t = torch.as_tensor(tokens, dtype=torch.long).to(self.device).reshape(-1, self.K).expand(self.B, -1)
        self._embed_forward(t.contiguous(), self.lim_block, self._slots(self.length + self.K), logits_from=None)
        self.cache_len.add_(self.K)
        self.length += self.K

    @torch.no_grad()
    def decode(self, prompt: torch.Tensor, cfg: DecodeConfig, *, eos_ids=(), mask_id: int | None = None,
               on_block: Callable[[int, torch.Tensor], bool] | None = None, seed=0,
               capture_topk: int | None = None) -> DecodeOutput:
        """`orl.decode.decode` for the runtime's B rows: same arguments, same output. ``prompt`` (P,),
        (1, P) (one prompt for every row: the G rollouts of a group), (B, P), or B token lists of any
        lengths (left-padded; ``prompt_len`` is the longest). ``seed``: the counter
        RNG's (an int, or one per row; read when sampling and by uniform-state models); the reference
        decoder draws the same numbers with ``rng=CounterRNG(seed)``. ``capture_topk`` (not None):
        the output's ``trace`` holds every step, as ``decode(trace=True)``'s, with that many top-k
        log-probs per position instead of whole logits (`orl.engine.capture`)."""
        self.request_seed = seed
        if not (isinstance(prompt, (list, tuple)) and prompt and isinstance(prompt[0], (list, tuple))):
            prompt = torch.as_tensor(prompt)
            prompt = prompt.reshape(-1, prompt.shape[-1])
            P = prompt.shape[1]
        else:
            P = max(len(p) for p in prompt)
        B, K = self.B, self.K
        n_blocks = math.ceil(cfg.max_new_tokens / K)
        if P + n_blocks * K > self.mcfg.max_position:
            raise ValueError(f"prompt ({P} tokens) + max_new_tokens rounded to blocks ({n_blocks * K}) exceeds "
                             f"the model context {self.mcfg.max_position}; shorten the prompt or lower max_new_tokens")
        self._slots(P + n_blocks * K)
        self.set_request(cfg, mask_id, capture_topk=capture_topk)
        self.prefill(prompt)
        eos = set(int(e) for e in eos_ids)
        done, finish = [False] * B, ["length"] * B
        gen: list[list[int]] = [[] for _ in range(B)]
        steps: list[list[int]] = [[] for _ in range(B)]
        for b in range(n_blocks):
            vals = self.launch_block()
            hit = []
            for r in range(B):
                gen[r] += vals[r][:K]
                if not done[r]:
                    steps[r].append(vals[r][K])
                    if eos and any(t in eos for t in vals[r][:K]):
                        hit.append(r)
            for r in hit:
                done[r], finish[r] = True, "stop"
            if hit:
                self.done.copy_(torch.tensor(done, device=self.device))
            if on_block is not None and on_block(b, torch.tensor([v[:K] for v in vals])) is False:
                finish = [f if d else "cancelled" for f, d in zip(finish, done)]
                break
            if all(done):
                break
        tokens = []
        for r in range(B):
            t = gen[r][:cfg.max_new_tokens]
            for i, x in enumerate(t):
                if x in eos:
                    t = t[:i + 1]
                    break
            tokens.append(t)
        trace = [] if self._cap is None else self._cap.records(self.rule.use_residual)
        return DecodeOutput(tokens, finish, steps, P, K, trace, [gen[r][:K * len(steps[r])] for r in range(B)])
