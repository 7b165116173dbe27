"""The reference block decoder: one loop for every family's rule, with cache, trace and TPF.

Owns the denoising loop of docs/method.md 1.3 (prefill, per-block steps, cache-commit pass),
the residual feedback of 3.7 (z of step k feeds step k+1; zero at a block's first step), the
per-step trace (canvas, unresolved set, the exact residual input consumed, entropy, optionally
logits) that ORL rollouts capture, and TPF accounting both with the commit forward (ORL's count)
and without it (HF/DiffusionGemma's count) (1.5).
Uncached decoding recomputes the whole prefix every step with the same block-causal mask; under
greedy decoding it gives the same tokens as cached decoding (tested). Works on token ids only.
Does not own: acceptance rules (`samplers`), protocols (`config`), text (callers detokenize).
Shapes: B rows, P prompt length, K block length, D hidden, V vocab.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..model.masks import commit_layout, decode_layout, step_mask
from . import samplers as S
from .config import DecodeConfig
from .rng import TorchRNG
from .tpf import forwards as count_forwards
from .tpf import tpf


@dataclass
class StepRecord:
    """One denoising step of one block, for all B rows (inputs as consumed, outputs as chosen)."""

    block: int
    step: int
    canvas: torch.Tensor              # (B, K) tokens fed to this step
    unresolved: torch.Tensor          # (B, K) bool before this step
    residual: torch.Tensor | None     # (B, K, D) z consumed by this step (None: no residual)
    residual_where: torch.Tensor | None  # (B, K) bool
    residual_weight: torch.Tensor | None  # (B, K) rcd interpolation weight
    entropy: torch.Tensor             # (B, K) normalised entropy of this step's distribution
    committed: torch.Tensor           # (B, K) bool positions resolved at this step
    active: torch.Tensor              # (B,) bool rows that were still denoising this block
    logits: torch.Tensor | None = None  # (B, K, V) when trace_logits
    topk_ids: torch.Tensor | None = None   # (B, K, k) the step's top-k token ids (the runtime's capture)
    topk_logp: torch.Tensor | None = None  # (B, K, k) their log-probabilities (of the raw logits)


@dataclass
class DecodeOutput:
    tokens: list[list[int]]           # generated ids per row, up to and including the first EOS
    finish_reason: list[str]          # "stop" (EOS), "length" or "cancelled"
    steps_per_block: list[list[int]]  # denoising forwards per block, per row
    prompt_len: int
    block_size: int
    trace: list[StepRecord] = field(default_factory=list)
    block_tokens: list[list[int]] | None = None  # every committed block of each row, EOS padding included

    def forwards(self, row: int, commit: bool = True) -> int:
        return count_forwards(self.steps_per_block[row], commit)

    def tpf(self, commit: bool = True) -> float:
        """Generated tokens / forwards over all rows (commit=True: + one commit pass per block)."""
        f = sum(self.forwards(r, commit) for r in range(len(self.tokens)))
        return tpf(sum(len(t) for t in self.tokens), f) or 0.0


def _forward_canvas(model, cfg: DecodeConfig, committed, canvas, z, where, weight, cache, P):
    """Logits (B, K, V) of the canvas after ``committed`` (B, P + bK) tokens."""
    B, K = canvas.shape
    n = committed.shape[1]
    ca = model.config.clean_attention
    lay = decode_layout(P, n - P, K, cfg.block_size, ca)
    dev = canvas.device
    if cache is not None:
        mask = step_mask(lay, n).to(dev)
        return model(canvas, lay.positions[n:].to(dev), mask, residual=z, residual_where=where,
                     residual_weight=weight, cache=cache)
    tokens = torch.cat([committed, canvas], 1)
    full_z = full_w = full_where = None
    if where is not None:
        full_where = torch.cat([torch.zeros(B, n, dtype=torch.bool, device=dev), where], 1)
    if z is not None:
        full_z = torch.cat([z.new_zeros(B, n, z.shape[-1]), z], 1)
    if weight is not None:
        full_w = torch.cat([weight.new_zeros(B, n), weight], 1)
    logits = model(tokens, lay.positions.to(dev), lay.mask().to(dev), residual=full_z,
                   residual_where=full_where, residual_weight=full_w)
    return logits[:, n:]


def _commit(model, cfg: DecodeConfig, P: int, committed_len: int, block_tokens, cache):
    """The cache-commit forward: write the finished block's K/V (clean, block-causal)."""
    K = block_tokens.shape[1]
    lay = commit_layout(P, committed_len - P + K, cfg.block_size, model.config.clean_attention)
    dev = block_tokens.device
    model(block_tokens, lay.positions[committed_len:].to(dev), step_mask(lay, committed_len).to(dev),
          cache=cache, store_kv=True)


@torch.no_grad()
def decode(model, prompt: torch.Tensor, cfg: DecodeConfig, *, eos_ids=(), mask_id: int | None = None,
           trace: bool = False, trace_logits: bool = False, generator: torch.Generator | None = None,
           rng=None, on_block: Callable[[int, torch.Tensor], bool] | None = None) -> DecodeOutput:
    """Decode B rows sharing one prompt length. prompt (B, P) int64; returns a DecodeOutput.

    Random numbers come from ``rng`` (an `orl.decode.rng` object: ``TorchRNG``, or ``CounterRNG``
    for the engine's stream); without one, from ``generator`` through ``TorchRNG(generator)``.
    ``on_block(b, tokens (B, K))`` is called after each block commits; returning False cancels.
    """
    rng = rng if rng is not None else TorchRNG(generator)
    mcfg = model.config
    if prompt.dim() == 1:
        prompt = prompt[None]
    B, P = prompt.shape
    K = cfg.block_size
    uniform = mcfg.noise == "uniform"
    if not uniform and mask_id is None:
        mask_id = mcfg.mask_token_id
    if cfg.rule == "dgemma" and not uniform:
        raise ValueError("rule 'dgemma' needs a uniform-state model (config.noise='uniform')")
    if uniform and cfg.rule != "dgemma":
        raise ValueError(f"uniform-state models decode with rule 'dgemma', not {cfg.rule!r}")
    n_blocks = math.ceil(cfg.max_new_tokens / K)
    if P + n_blocks * K > mcfg.max_position:
        raise ValueError(f"prompt ({P} tokens) + max_new_tokens rounded to blocks ({n_blocks * K}) exceeds "
                         f"the model context {mcfg.max_position}; shorten the prompt or lower max_new_tokens")
    dev = prompt.device
    eos = torch.tensor(sorted(set(int(e) for e in eos_ids)), dtype=torch.long, device=dev)

    cache = None
    if cfg.use_cache:
        cache = model.new_cache(B, P + n_blocks * K)
        lay = commit_layout(P, 0, K, mcfg.clean_attention)
        model(prompt, lay.positions.to(dev), lay.mask().to(dev), cache=cache, store_kv=True)

    committed = prompt
    done = torch.zeros(B, dtype=torch.bool, device=dev)
    finish = ["length"] * B
    steps_per_block: list[list[int]] = [[] for _ in range(B)]
    records: list[StepRecord] = []

    for b in range(n_blocks):
        canvas, steps = _decode_block(model, cfg, b, committed, ~done, cache, P, rng, mask_id, records,
                                      trace, trace_logits)
        for r in range(B):
            if not bool(done[r]):
                steps_per_block[r].append(int(steps[r]))
        if cache is not None:
            _commit(model, cfg, P, committed.shape[1], canvas, cache)
        committed = torch.cat([committed, canvas], 1)
        if eos.numel():
            hit = torch.isin(canvas, eos).any(-1) & ~done
            for r in hit.nonzero().flatten().tolist():
                finish[r] = "stop"
            done |= hit
        if on_block is not None and on_block(b, canvas) is False:
            finish = [f if bool(d) else "cancelled" for f, d in zip(finish, done.tolist())]
            break
        if bool(done.all()):
            break

    return _output(committed[:, P:].tolist(), cfg, eos, finish, steps_per_block, P, records)


def _output(gen, cfg, eos, finish, steps_per_block, P, records) -> DecodeOutput:
    """Each row's tokens up to ``max_new_tokens`` and its first EOS, and every committed block."""
    B, K = len(gen), cfg.block_size
    out_tokens = []
    for r in range(B):
        t = gen[r][:cfg.max_new_tokens]
        if eos.numel():
            for i, x in enumerate(t):
                if x in set(eos.tolist()):
                    t = t[:i + 1]
                    break
        out_tokens.append(t)
    blocks = [gen[r][:K * len(steps_per_block[r])] for r in range(B)]
    return DecodeOutput(out_tokens, finish, steps_per_block, P, K, records, blocks)


def _decode_block(model, cfg: DecodeConfig, b: int, committed, active, cache, P: int, rng, mask_id,
                  records: list, trace: bool, trace_logits: bool):
    """Denoise block ``b`` for the ``active`` rows (B,) after ``committed`` (B, n): the steps of
    docs/method.md 1.3 with the residual feedback of 3.7. Returns (canvas (B, K), steps (B,))."""
    mcfg, K, B, dev = model.config, cfg.block_size, committed.shape[0], committed.device
    max_steps = cfg.max_steps
    post_cap = cfg.max_post_steps if cfg.rule == "llada" else 0
    use_res = cfg.residual and mcfg.pathway != "none"
    where_canvas = mcfg.pathway_where == "canvas"
    if mcfg.noise == "uniform":
        canvas = rng.canvas(mcfg.vocab_size, (B, K), dev)
    else:
        canvas = torch.full((B, K), mask_id, dtype=torch.long, device=dev)
    unresolved = torch.ones(B, K, dtype=torch.bool, device=dev)
    steps = torch.zeros(B, dtype=torch.long, device=dev)
    post = torch.zeros(B, dtype=torch.long, device=dev)
    prev_arg = None
    z = weight = None
    # canvas pathways (DiffusionGemma) always mark the canvas: the post-norm applies even with z = 0
    where = (torch.ones(B, K, dtype=torch.bool, device=dev) if where_canvas else unresolved.clone()) \
        if (use_res or (where_canvas and mcfg.pathway != "none")) else None
    for step in range(max_steps + post_cap):
        if not active.any():
            break
        logits = _forward_canvas(model, cfg, committed, canvas, z, where, weight, cache, P)
        temp = cfg.temperature
        if cfg.rule == "dgemma":  # processed logits lg = raw / T(n), n = steps remaining (HF)
            temp = S.dgemma_temperature(max_steps - step, max_steps, cfg.t_min, cfg.t_max)
            lg, probs, tok, conf = S.dgemma_step(logits, temp, cfg.temperature == 0, rng.sample)  # conf: nats
            ent = S.normalized_entropy(probs)
        else:
            lg = None
            probs, tok, conf, ent = S.step_distribution(logits, temp, rng.sample, cfg.top_p)
        rec_canvas, rec_unres = canvas.clone(), unresolved.clone()
        canvas, unresolved, take, finished, post, prev_arg = _rule_step(
            cfg, step, active, canvas, unresolved, post, prev_arg, probs, tok, conf, ent, lg, rng, mcfg.vocab_size)
        rng.advance(active)
        steps += active.long()
        if trace:
            records.append(StepRecord(b, step, rec_canvas, rec_unres, z, where, weight, ent,
                                      take & active[:, None], active.clone(), logits if trace_logits else None))
        active = active & ~finished
        if use_res:  # residual of this step feeds the next one (3.7)
            if cfg.rule == "dgemma":  # HF: from the processed (temperature-scaled) logits
                pr = S.dgemma_selfcond_probs(lg, model.model.embed_tokens.weight.dtype)
            else:
                pr = probs if cfg.residual_temperature == 1.0 and temp in (0.0, 1.0) and cfg.top_p >= 1 else \
                    torch.softmax(logits.float() / cfg.residual_temperature, -1)
            z = model.soft_embed(pr)
            where = torch.ones_like(unresolved) if where_canvas else unresolved.clone()
            weight = S.normalized_entropy(pr) if mcfg.pathway == "rcd" else None
    return canvas, steps


def _rule_step(cfg: DecodeConfig, step: int, active, canvas, unresolved, post, prev_arg, probs, tok, conf, ent,
               lg, rng, vocab_size: int):
    """One step of the rule (docs/method.md 1.4) for the active rows. ``conf`` is the chosen
    tokens' probability (B, K), or for "dgemma" the entropy in nats; ``ent`` the normalised
    entropy; ``lg`` the processed logits ("dgemma"). Returns (canvas, unresolved, take: positions
    resolved this step, finished (B,), post steps, argmax history)."""
    B, K = canvas.shape
    act = active[:, None]
    finished = torch.zeros(B, dtype=torch.bool, device=canvas.device)
    if cfg.rule in ("threshold", "topk", "entropy"):
        quota = S.step_quota(K, cfg.max_steps, step)
        if cfg.rule == "threshold":
            take = S.select_threshold(conf, unresolved, cfg.threshold, quota)
        elif cfg.rule == "topk":
            take = S.select_topk(conf, unresolved, quota)
        else:
            take = S.select_entropy_bounded(ent, unresolved, cfg.entropy_bound)
        take &= act
        canvas = torch.where(take, tok, canvas)
        unresolved = unresolved & ~take
        finished = ~unresolved.any(-1)
    elif cfg.rule == "llada":
        had_masks = unresolved.any(-1)
        take = S.llada_transfer(conf, unresolved, cfg.threshold) & act
        edits, arg = S.llada_edits(probs, canvas, ~unresolved & act, cfg.edit_threshold)
        canvas = torch.where(take, tok, torch.where(edits, arg, canvas))
        unresolved = unresolved & ~take
        post = post + (~had_masks & active).long()
        finished = ~had_masks & (~edits.any(-1) | (post >= cfg.max_post_steps))
        take = take | edits
    else:  # dgemma: HF DiffusionGemma generate (docs/diffusiongemma-spec.md 9)
        # Every position is re-judged each step: the lowest-entropy sampled tokens are
        # accepted (entropy bound), all others re-noised uniformly; nothing stays fixed.
        # A row stops when its argmax canvas is stable and confident, or at the last step,
        # and commits the argmax canvas (not the sampled one). ``prev_arg`` holds the
        # argmax history (s, B, K) of the stability test; rows already stopped are frozen.
        ent_nats = conf
        take = S.dgemma_accept(ent_nats, cfg.entropy_bound)
        noise = rng.noise(vocab_size, (B, K), canvas.device)
        arg = torch.where(act, lg.argmax(-1), canvas)
        if prev_arg is None:
            prev_arg = torch.full((cfg.stability_threshold, B, K), -1, dtype=torch.long, device=canvas.device)
        stable, prev_arg = S.dgemma_stable(prev_arg, arg)
        early = stable & (ent_nats.mean(-1) < cfg.confidence_threshold)
        finished = early | (step + 1 >= cfg.max_steps)
        stop = finished[:, None]
        canvas = torch.where(act, torch.where(stop, arg, torch.where(take, tok, noise)), canvas)
        unresolved = torch.where(act, ~take & ~stop, unresolved)  # re-noised positions
        take = take | stop
    return canvas, unresolved, take, finished, post, prev_arg
