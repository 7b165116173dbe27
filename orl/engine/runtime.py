"""Single-request runtime: static buffers, one block per launch, the denoising loop on the GPU.

Owns the fast twin of `orl.decode.decode` for the SDAR rules ("threshold": dynamic threshold with
top-quota fallback, and "topk") and LLaDA-2.1's "llada" (mask->token threshold with a one-token
fallback, token->token editing of committed positions, editing-only post steps after the last
mask), greedy, batch 1, with or without the residual pathway, dense or mixture-of-experts layers:

  prefill (eager)  ->  per block:  start  ->  round*  ->  end  ->  host reads K tokens + steps
    start  fresh canvas of mask tokens, first round (with ``fold_commit``: the previous block's
           commit pass is folded into it, one forward over [previous block | canvas])
    round  forward over the canvas attending cache + canvas -> logits -> confidence -> commit
           (threshold / top-quota; llada: + edits) -> residual z for the next round -> device
           flag "go on?"
    end    the commit pass (without ``fold_commit``) and the output copy
Every piece reads and writes only static device buffers (canvas, unresolved set, z, step, cache
length, the per-request threshold and quota schedule), so the same Python functions run three
ways (``EngineConfig.mode``):
  "eager"  plain PyTorch, host loop reading the flag each round (runs on CPU; the slow twin)
  "graph"  start / round / end each a CUDA graph, host loop reading the flag each round
  "while"  the whole block one CUDA graph; rounds loop on the device through a conditional
           WHILE node (`orl.engine.graphs.WhileLoop`); the host launches and reads back once.
Graphs are captured lazily per (attended cache slots S rounded up to ``bucket``, rule, residual,
folded start) and reused for every later block and request.
Under greedy decoding the tokens equal the reference decoder's (tests/test_engine_cpu.py,
tests/test_engine_gpu.py), up to floating-point ties.
Does not own: tokenizers, text or streaming (`orl.engine.llm`), the samplers' numerics
(`orl.decode.samplers`, called as is), the model's numerics (`orl.engine.forward`).
Shapes: P prompt length, K block length, D hidden, V vocab, S attended cache slots.
"""
from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass
from typing import Callable

import torch

from ..decode import samplers as Smp
from ..decode.block import DecodeOutput
from ..decode.config import DecodeConfig
from . import forward as F_
from .graphs import WhileLoop, capture, conditional_nodes_available

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
    kernels: str = "torch"        # "torch": the forward above; "triton": `orl.engine.kernels` (dense
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


class Runtime:
    """Runtime(model, block_size) -> ``decode(prompt_ids, DecodeConfig)`` -> `DecodeOutput`.

    Lower level: ``prefill(prompt_ids)``, then ``generate_block()`` per block (returns the K tokens
    and the rounds used), ``flush()`` to commit a pending block. A DiffusionGemma model
    (``config.noise == "uniform"``) gets an `orl.engine.dgemma.DGemmaRuntime`."""

    def __new__(cls, model, *args, **kwargs):
        if cls is Runtime and model.config.noise == "uniform":
            from .dgemma import DGemmaRuntime  # noqa: PLC0415 - a subclass of this one
            cls = DGemmaRuntime
        return super().__new__(cls)

    def __init__(self, model, block_size: int | None = None, config: EngineConfig | None = None, **overrides):
        self.config = dataclasses.replace(config or EngineConfig(), **overrides)
        ec = self.config
        self.mcfg = mcfg = model.config
        self.K = K = block_size or mcfg.block_size
        dtype = DTYPES[ec.dtype] if ec.dtype else None
        self.w = F_.bake(model, dtype, ec.max_len, ec.moe_backend)
        if ec.tp:
            from .tp import shard  # noqa: PLC0415
            self.w = shard(self.w)
        self.device = dev = self.w.embed.device
        self.kv = F_.StaticKV(self.w.cfg, ec.max_len, self.w.dtype, dev)  # local KV heads under tp
        self.mode = self._pick_mode(ec.mode)
        self._layer, self._kernels = F_.layer, None
        if ec.kernels == "triton":  # the whole layer stack runs as Triton kernels: nothing to compile
            from .kernels import TritonKernels  # noqa: PLC0415 - optional dependency
            self._kernels = TritonKernels(self.w)
        elif ec.compile or (ec.compile is None and dev.type == "cuda" and not ec.tp):
            self._layer = torch.compile(F_.layer, dynamic=False)  # T static: one kernel set per T
        D = mcfg.hidden_size
        z = lambda *s, dt=torch.long: torch.zeros(*s, dtype=dt, device=dev)  # noqa: E731
        # ---- static state, allocated once (graphs read and write only these) ----
        self.cache_len = z(1)                    # committed slots in the KV cache
        self.canvas, self.prev = z(1, K), z(1, K)  # current canvas; previous block (pending commit)
        self.unresolved = z(1, K, dt=torch.bool)
        self.z, self.where = z(1, K, D, dt=self.w.dtype), z(1, K, dt=torch.bool)
        self.weight = z(1, K, dt=torch.float32)  # rcd interpolation weight
        self.step, self.flag = z(1), z(1, dt=torch.bool)
        self.active, self.post = z(1, dt=torch.bool), z(1)  # llada: block still denoising; post steps taken
        self.out = z(K + 1)                      # block tokens, then the rounds used
        # ---- per-request numbers, on the device so graphs never bake them ----
        self.threshold = z(1, dt=torch.float32)
        self.quota_base, self.quota_rem, self.max_steps, self.mask_id = z(1), z(1), z(1), z(1)
        self.edit_threshold, self.post_cap = z(1, dt=torch.float32), z(1)  # llada editing
        # visibility limits (see orl.engine.forward): canvas rows see the canvas; committed block
        # rows see their block ("block") or the slots up to themselves ("causal")
        blk = torch.full((K,), K) if mcfg.clean_attention == "block" else torch.arange(1, K + 1)
        self.lim_canvas = torch.full((K,), K, device=dev)
        self.lim_block = blk.to(dev)
        self.lim_fold = torch.cat([blk, torch.full((K,), 2 * K)]).to(dev)
        self.length, self.pending = 0, False     # host mirrors of cache_len and "prev not committed"
        self._key_extra = None                   # (rule, residual, residual temperature) of the request
        self._graphs: dict = {}
        self._loop = None
        self._cap_stream = torch.cuda.Stream(dev) if dev.type == "cuda" else None
        self._pool = torch.cuda.graph_pool_handle() if dev.type == "cuda" else None
        self._out_host = torch.zeros(K + 1, dtype=torch.long, pin_memory=dev.type == "cuda")

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

    def set_request(self, cfg: DecodeConfig, mask_id: int | None = None) -> None:
        """Copy one request's decoding numbers into the device buffers (no recapture needed)."""
        if cfg.rule not in ("threshold", "topk", "llada"):
            raise NotImplementedError(f"the engine runs the SDAR rules 'threshold' and 'topk' and LLaDA's 'llada', "
                                      f"not {cfg.rule!r}; use orl.decode.decode for the others")
        if cfg.temperature != 0:
            raise NotImplementedError("the engine decodes greedily (temperature 0); sampling needs a counter-based "
                                      "RNG inside the graph (shared/docs/engine-notes.md 4.4) and is not built yet")
        if cfg.block_size != self.K:
            raise ValueError(f"DecodeConfig.block_size {cfg.block_size} != the runtime's block size {self.K}")
        mask_id = self.mcfg.mask_token_id if mask_id is None else mask_id
        base, rem = divmod(self.K, cfg.max_steps)
        post = cfg.max_post_steps if cfg.rule == "llada" else 0
        # max_steps holds the cap on rounds per block: llada adds its editing-only post steps
        for buf, v in ((self.threshold, cfg.threshold), (self.quota_base, base), (self.quota_rem, rem),
                       (self.max_steps, cfg.max_steps + post), (self.mask_id, mask_id),
                       (self.edit_threshold, cfg.edit_threshold), (self.post_cap, post)):
            buf.fill_(v)
        use_res = cfg.residual and self.mcfg.pathway != "none"
        self._key_extra = (cfg.rule, use_res, cfg.residual_temperature if use_res else 1.0)

    # ------------------------------------------------------------ block pieces
    # These run eagerly or are captured; they touch only static buffers (STYLE.md 10).
    def _embed_forward(self, tokens, lim, S, residual=None, where=None, weight=None, logits_from=0):
        h = F_.embed(self.w, tokens, residual, where, weight)
        return F_.forward(self.w, h, self.cache_len, lim, self.kv, S, logits_from, self._layer,
                          kernels=self._kernels)

    def _decide(self, logits: torch.Tensor) -> None:
        """One round's decision from logits (1, K, V): commit tokens, feed the residual, set the flag.
        The same operations as `orl.decode.block.decode` for the threshold/topk/llada rules."""
        rule, use_res, rtemp = self._key_extra
        lf = logits.float()
        probs = torch.softmax(lf, dim=-1)
        tok = probs.argmax(-1)
        conf = probs.gather(-1, tok[..., None]).squeeze(-1)
        if rule == "llada":
            self._decide_llada(probs, tok, conf)
        else:
            self._decide_sdar(rule, tok, conf)
        if use_res:
            pr = probs if rtemp == 1.0 else torch.softmax(lf / rtemp, -1)
            self.z.copy_(F_.soft_embed(self.w, pr))
            if self.mcfg.pathway_where == "canvas":
                self.where.fill_(True)
            else:
                self.where.copy_(self.unresolved)
            if self.mcfg.pathway == "rcd":
                self.weight.copy_(Smp.normalized_entropy(pr))
        go = self.active if rule == "llada" else self.unresolved.any(-1)
        torch.logical_and(go, self.step < self.max_steps, out=self.flag)

    def _decide_llada(self, probs, tok, conf) -> None:
        """LLaDA-2.1 (`orl.decode.block.decode`, rule "llada"): commit masks above the threshold
        (else the single best), edit committed tokens whose argmax differs with probability above
        the edit threshold; after the last mask, editing-only post steps until a round edits
        nothing or ``max_post_steps`` of them ran."""
        act = self.active[:, None]
        had_masks = self.unresolved.any(-1)
        take = Smp.llada_transfer(conf, self.unresolved, self.threshold) & act
        edits, arg = Smp.llada_edits(probs, self.canvas, ~self.unresolved & act, self.edit_threshold)
        self.canvas.copy_(torch.where(take, tok, torch.where(edits, arg, self.canvas)))
        self.unresolved.logical_and_(~take)
        self.post.add_((~had_masks & self.active).long())
        finished = ~had_masks & (~edits.any(-1) | (self.post >= self.post_cap))
        self.step.add_(self.active.long())
        self.active.logical_and_(~finished)

    def _decide_sdar(self, rule, tok, conf) -> None:
        quota = (self.quota_base + (self.step < self.quota_rem).long()).clamp_min(1)  # step_quota on device
        if rule == "threshold":
            take = Smp.select_threshold(conf, self.unresolved, self.threshold, quota)
        else:
            take = Smp.select_topk(conf, self.unresolved, quota)
        active = self.unresolved.any(-1, keepdim=True)
        take = take & active
        self.canvas.copy_(torch.where(take, tok, self.canvas))
        self.unresolved.logical_and_(~take)
        self.step.add_(active.view(1).long())

    def _start(self, fold: bool, S: int) -> None:
        """Fresh canvas and the first round (no residual yet); with ``fold`` the previous block is
        committed in the same forward and the cache length advances by K."""
        _, use_res, _ = self._key_extra
        K = self.K
        self.canvas.copy_(self.mask_id.expand(1, K))
        self.unresolved.fill_(True)
        self.step.zero_()
        self.active.fill_(True)
        self.post.zero_()
        where = None
        if use_res:
            self.z.zero_()
            self.weight.zero_()
            self.where.fill_(True)
            where = self.where
        if fold:
            tokens = torch.cat([self.prev, self.canvas], 1)
            if where is not None:
                where = torch.cat([torch.zeros_like(where), where], 1)
            logits = self._embed_forward(tokens, self.lim_fold, S, None, where, None, logits_from=K)
            self.cache_len.add_(K)
        else:
            logits = self._embed_forward(self.canvas, self.lim_canvas, S, None, where, None)
        self._decide(logits)

    def _round(self, S: int) -> None:
        _, use_res, _ = self._key_extra
        rcd = self.mcfg.pathway == "rcd"
        logits = self._embed_forward(self.canvas, self.lim_canvas, S, self.z if use_res else None,
                                     self.where if use_res else None, self.weight if use_res and rcd else None)
        self._decide(logits)

    def _end(self, S: int) -> None:
        """With ``fold_commit`` the finished block waits in ``prev`` for the next block's start;
        without, the commit pass runs here."""
        if self.config.fold_commit:
            self.prev.copy_(self.canvas)
        else:  # the cache-commit pass: the finished block as clean text
            self._embed_forward(self.canvas, self.lim_block, S, logits_from=None)
            self.cache_len.add_(self.K)
        self.out[:self.K].copy_(self.canvas[0])
        self.out[self.K:].copy_(self.step)

    # ------------------------------------------------------------------ graphs
    def _graph(self, kind: str, fold: bool, S: int):
        key = (kind, fold, S, self._key_extra)
        g = self._graphs.get(key)
        if g is not None:
            return g
        saved = (self.cache_len.clone(), self.prev.clone())  # the warm-up runs the pieces once
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
    def prefill(self, prompt: torch.Tensor) -> None:
        """Reset the runtime to ``prompt`` (P,) or (1, P) int64: its keys/values fill the cache."""
        prompt = prompt.view(1, -1).to(self.device)
        P = prompt.shape[1]
        self._slots(P + self.K)
        self.cache_len.zero_()
        self._prefill_forward(prompt)  # eager
        self.cache_len.fill_(P)
        self.length, self.pending = P, False

    def _prefill_forward(self, prompt: torch.Tensor) -> None:
        """The prompt's keys/values into the cache from slot 0 (prompt tokens: one block each = causal)."""
        P = prompt.shape[1]
        lim = torch.arange(1, P + 1, device=self.device)
        F_.forward(self.w, F_.embed(self.w, prompt), self.cache_len, lim, self.kv, P, logits_from=None,
                   kernels=self._kernels)

    @torch.no_grad()
    def generate_block(self) -> tuple[list[int], int]:
        """Denoise the next block (one launch in mode "while"); returns its K tokens and the rounds
        it took. Needs `prefill` and `set_request` first."""
        if self._key_extra is None:
            raise RuntimeError("call set_request(DecodeConfig) before generate_block()")
        fold = self.config.fold_commit and self.pending
        S = self._slots(self.length + (2 if fold else 1) * self.K)
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
                return self.generate_block()
            g.replay()
        self._out_host.copy_(self.out, non_blocking=True)
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        if fold or not self.config.fold_commit:  # a block was committed in this launch
            self.length += self.K
        self.pending = self.config.fold_commit
        vals = self._out_host.tolist()
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
        """Commit K given tokens as a finished block (a forced prefix, or teacher forcing in
        `orl.engine.parity`), after any pending one."""
        self.flush()
        t = torch.as_tensor(tokens, dtype=torch.long).view(1, self.K).to(self.device)
        self._embed_forward(t, self.lim_block, self._slots(self.length + self.K), logits_from=None)
        self.cache_len.add_(self.K)
        self.length += self.K

    @torch.no_grad()
    def decode(self, prompt: torch.Tensor, cfg: DecodeConfig, *, eos_ids=(), mask_id: int | None = None,
               on_block: Callable[[int, torch.Tensor], bool] | None = None) -> DecodeOutput:
        """`orl.decode.decode` for one row: same arguments (greedy threshold/topk/llada), same output."""
        if prompt.dim() == 2 and prompt.shape[0] != 1:
            raise ValueError(f"the runtime decodes one request at a time; got {prompt.shape[0]} rows")
        prompt = prompt.reshape(1, -1)
        P, K = prompt.shape[1], self.K
        n_blocks = math.ceil(cfg.max_new_tokens / K)
        if P + n_blocks * K > self.mcfg.max_position:
            raise ValueError(f"prompt ({P} tokens) + max_new_tokens rounded to blocks ({n_blocks * K}) exceeds "
                             f"the model context {self.mcfg.max_position}; shorten the prompt or lower max_new_tokens")
        self._slots(P + n_blocks * K)
        self.set_request(cfg, mask_id)
        self.prefill(prompt)
        eos = set(int(e) for e in eos_ids)
        finish, gen, steps = "length", [], []
        for b in range(n_blocks):
            toks, n = self.generate_block()
            gen += toks
            steps.append(n)
            done = bool(eos) and any(t in eos for t in toks)
            if done:
                finish = "stop"
            if on_block is not None and on_block(b, torch.tensor([toks])) is False:
                finish = finish if done else "cancelled"
                break
            if done:
                break
        out = gen[:cfg.max_new_tokens]
        for i, t in enumerate(out):
            if t in eos:
                out = out[:i + 1]
                break
        return DecodeOutput([out], [finish], [steps], P, K, [], [gen[:K * len(steps)]])

