"""Decode traces for the explorer: one decode per (model, setting), recorded forward by forward.

Owns turning one reference decode with ``trace=True`` (a `orl.decode.block.StepRecord` per
denoising step) into the explorer's frames: one frame per forward pass as `orl.decode.tpf` counts
them -- every denoising step, and every block's cache-commit pass -- each holding the block's canvas
after that forward, the positions it committed, the positions still unresolved with their
normalised entropy at that step, the norm of the residual input z the step consumed (docs/method.md
3.7: zero at a block's first step), and the generated tokens resolved so far, so that the running
TPF is tokens / forwards and ends at the decode's TPF. Also a run's summary (forwards and TPF with
and without the commit pass, the completion text, its verdict when the prompt is a task's problem).

Decoding is the reference decoder's, called as `orl.serve.llm.LLM` calls it on the CPU (same
protocol, EOS ids and random stream for a seed), so the tokens are the ones `LLM.generate` returns
(tests/test_explore.py); the trace only records, it changes no number.
Does not own: the decoder (`orl.decode`), HTML (`orl.explore.page`), verification
(`orl.eval.pool.rewards`, the one reward path).
Shapes: K block length, D hidden.
"""
from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass, field

import torch

from ..decode import DecodeConfig, DecodeOutput, decode
from ..decode.rng import CounterRNG, TorchRNG

ROUND = 4  # decimals kept for entropies and residual norms in the page's data


@dataclass
class RunSpec:
    """One decode the explorer shows: a model, its role, a label and DecodeConfig overrides."""

    model: str                                     # checkpoint directory or named size ("sdar/tiny")
    role: str = "base"
    label: str | None = None
    overrides: dict = field(default_factory=dict)  # DecodeConfig fields, e.g. {"threshold": 0.7}


def default_label(model: str) -> str:
    """A short name for a model path: ``runs/demo/orl/final`` -> ``orl``; a named size as is."""
    if not os.path.isdir(model):
        return model
    parts = [p for p in os.path.normpath(os.path.abspath(model)).split(os.sep) if p]
    while len(parts) > 1 and (parts[-1] in ("final", "checkpoints") or parts[-1].startswith("step_")):
        parts.pop()
    return parts[-1] if parts else model


def _position_counts(n_generated: int, b: int, K: int) -> int:
    """Generated positions (tokens that count towards TPF) in block ``b``: none after the first EOS."""
    return min(K, max(0, n_generated - b * K))


def frames(out: DecodeOutput, row: int = 0, has_residual: bool = True) -> list[dict]:
    """The frames of row ``row`` of a traced decode, one per forward (module docstring).

    A denoising frame: ``b`` block, ``s`` step, ``canvas`` (K ids after the step), ``new`` (positions
    the step committed, LLaDA's edits included), ``unres`` (positions still unresolved after it),
    ``ent`` (K normalised entropies of the step's distribution), ``rn`` (K norms ||z|| of the residual
    input where it entered; None without a residual pathway), ``tokens`` (generated tokens resolved
    so far) and ``fwd`` (forwards so far). A commit frame: ``b``, ``s`` None, ``commit`` True, the
    block's final ``canvas``, empty ``new`` / ``unres``."""
    if not out.trace:
        raise ValueError("the decode has no trace; decode with trace=True")
    K = out.block_size
    n_gen = len(out.tokens[row])
    if out.block_tokens is None:
        raise ValueError("the decode output has no block_tokens; frames need the reference decoder's output")
    final = out.block_tokens[row]
    by_block: dict[int, list] = {}
    for rec in out.trace:
        if bool(rec.active[row]):
            by_block.setdefault(rec.block, []).append(rec)
    n_blocks = len(out.steps_per_block[row])
    result, fwd, done_tokens = [], 0, 0
    for b in range(n_blocks):
        recs = by_block.get(b, [])
        block_final = final[b * K:(b + 1) * K]
        for i, rec in enumerate(recs):
            nxt = recs[i + 1] if i + 1 < len(recs) else None
            canvas = nxt.canvas[row].tolist() if nxt is not None else list(block_final)
            unres = nxt.unresolved[row] if nxt is not None else torch.zeros(K, dtype=torch.bool)
            resolved = (~unres.cpu()).tolist()
            counted = _position_counts(n_gen, b, K)
            fwd += 1
            result.append({
                "b": b, "s": rec.step, "canvas": canvas,
                "new": rec.committed[row].nonzero().flatten().tolist(),
                "unres": unres.nonzero().flatten().tolist(),
                "ent": [round(float(x), ROUND) for x in rec.entropy[row].float().tolist()],
                "rn": _residual_norms(rec, row, K) if has_residual else None,
                "tokens": done_tokens + sum(resolved[:counted]),
                "fwd": fwd})
        done_tokens += _position_counts(n_gen, b, K)
        fwd += 1  # the cache-commit pass of block b (counted as `orl.decode.tpf.forwards` counts it)
        result.append({"b": b, "s": None, "commit": True, "canvas": list(block_final), "new": [], "unres": [],
                       "ent": None, "rn": None, "tokens": done_tokens, "fwd": fwd})
    return result


def _residual_norms(rec, row: int, K: int) -> list[float]:
    """||z|| per position (K,) where the residual entered this step; zeros at a block's first step."""
    if rec.residual is None:
        return [0.0] * K
    n = rec.residual[row].float().norm(dim=-1)
    if rec.residual_where is not None:
        n = n * rec.residual_where[row].float()
    return [round(float(x), ROUND) for x in n.tolist()]


def _rng(llm, seed: int):
    """The random stream `LLM` gives the reference decoder for ``seed``."""
    if getattr(llm, "rng", "torch") == "counter":
        return CounterRNG(seed)
    return TorchRNG(torch.Generator().manual_seed(seed))


def trace_run(llm, prompt_ids: list[int], cfg: DecodeConfig, *, eos_ids=None, seed: int = 0, label: str = "",
              verdict: float | None = None) -> dict:
    """Decode ``prompt_ids`` with ``llm``'s model under ``cfg`` (reference decoder, traced) and return
    the run's page data: summary, frames (`frames`), the token strings the canvas shows."""
    eos = list(llm.eos_ids if eos_ids is None else eos_ids)
    prompt = torch.tensor([prompt_ids], dtype=torch.long, device=llm.device)
    with torch.inference_mode():
        out = decode(llm.model, prompt, cfg, eos_ids=eos, trace=True, rng=_rng(llm, seed))
    return run_data(llm, out, cfg, label=label, verdict=verdict, eos_ids=eos)


def run_data(llm, out: DecodeOutput, cfg: DecodeConfig, *, label: str = "", verdict: float | None = None,
             eos_ids=()) -> dict:
    """The page data of one traced decode (row 0) of ``llm``'s model."""
    mcfg = llm.model.config
    has_residual = bool(cfg.residual and mcfg.pathway != "none")
    fr = frames(out, 0, has_residual)
    ids = out.tokens[0]
    eos = {int(e) for e in eos_ids}
    text_ids = [i for i in ids if i not in eos]
    seen = sorted({t for f in fr for t in f["canvas"]} | set(ids))
    with _tokenizer_lock(llm):
        vocab = {str(t): llm.tokenizer.decode([t]) for t in seen}
        completion = llm.tokenizer.decode(text_ids, skip_special_tokens=True)
    rn_max = max((max(f["rn"]) for f in fr if f["rn"]), default=0.0)
    f_commit, f_nc = out.forwards(0, True), out.forwards(0, False)
    n = len(ids)
    return {
        "label": label or default_label(llm.name), "model": llm.name, "role": getattr(llm, "role", "base"),
        "family": mcfg.family, "decode": _settings(cfg), "K": out.block_size,
        "mask_id": None if mcfg.noise == "uniform" else mcfg.mask_token_id,
        "eos_ids": sorted(eos | set(getattr(llm, "eos_ids", ()))),  # shown as EOS even when ignored
        "has_residual": has_residual, "rn_max": rn_max,
        "n_tokens": n, "forwards": f_commit, "forwards_no_commit": f_nc,
        "tpf": n / f_commit if f_commit else 0.0, "tpf_no_commit": n / f_nc if f_nc else 0.0,
        "steps_per_block": out.steps_per_block[0], "finish_reason": out.finish_reason[0],
        "completion": completion,
        "token_ids": ids, "blocks": [out.block_tokens[0][b * out.block_size:(b + 1) * out.block_size]
                                     for b in range(len(out.steps_per_block[0]))],
        "verdict": verdict, "vocab": vocab, "frames": fr,
    }


def _tokenizer_lock(llm):
    """`LLM`'s tokenizer lock (fast tokenizers are not safe from two threads: the server's worker
    may be detokenising while /explore runs), or a no-op."""
    return getattr(llm, "_tok_lock", None) or contextlib.nullcontext()


def _settings(cfg: DecodeConfig) -> dict:
    """The DecodeConfig fields that decide this rule's decode (docs/method.md 1.4), for the page."""
    keys = ["rule", "block_size", "max_new_tokens", "max_steps", "temperature"]
    keys += {"threshold": ["threshold"], "topk": [], "llada": ["threshold", "edit_threshold", "max_post_steps"],
             "entropy": ["entropy_bound"], "dgemma": ["entropy_bound", "t_min", "t_max"]}.get(cfg.rule, [])
    out = {k: getattr(cfg, k) for k in keys}
    if cfg.top_p < 1:
        out["top_p"] = cfg.top_p
    if not cfg.residual:
        out["residual"] = False
    return out


def budget(llm, n_prompt: int, max_new_tokens: int | None) -> int:
    """``max_new_tokens`` (None: up to 256, whole blocks that fit the context) checked against it."""
    if max_new_tokens is None:
        max_new_tokens = min(256, llm.max_new_tokens_fit(n_prompt)) or 1
    llm.check_lengths(n_prompt, max_new_tokens)
    return max_new_tokens


def knob_values(text: str | None) -> list[float] | None:
    """``"0.9,0.7"`` -> [0.9, 0.7]; None or "" -> None. Raises ValueError naming a bad value."""
    if not text:
        return None
    vals = []
    for v in text.split(","):
        v = v.strip()
        try:
            x = float(v)
        except ValueError:
            raise ValueError(f"knob value {v!r} is not a number (give them as 0.9,0.7)") from None
        if not math.isfinite(x):
            raise ValueError(f"knob value {v!r} is not finite")
        vals.append(x)
    return vals
