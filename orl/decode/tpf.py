"""Tokens per forward (TPF), computed here and nowhere else (docs/method.md 1.5).

A block of K tokens costs its denoising forwards (steps) plus, in ORL's and the paper's count, one
cache-commit forward that writes the finished block's keys/values; HF / DiffusionGemma count the
denoising forwards only. Every TPF the project reports -- a decode (`DecodeOutput.tpf`), an ORL
step's rollouts, a held-out evaluation, a benchmark's scored generations -- is total generated
tokens / total forwards over the set, from these functions.

Generated tokens are counted one way everywhere (`generated_tokens`): the completion's tokens plus
the EOS that ended it, if one did; nothing after that EOS (the rest of its block) counts. The EOS
is a token the decoder committed with the same forwards as the text before it, and the decoder's
own outputs (`DecodeOutput.tokens`, ORL rollouts' ``n_generated``) already count it.
"""
from __future__ import annotations

from collections.abc import Iterable


def generated_tokens(completion_tokens: int, ended_at_eos: bool) -> int:
    """The TPF numerator of one response: ``completion_tokens`` (the text's tokens, EOS excluded)
    plus one for the EOS when the response ended at one (not at the token budget)."""
    return completion_tokens + int(bool(ended_at_eos))


def forwards(steps_per_block: Iterable[int], commit: bool = True) -> int:
    """Forwards of one response: its denoising steps, plus one commit pass per block when ``commit``."""
    steps = list(steps_per_block)
    return sum(steps) + (len(steps) if commit else 0)


def tpf(tokens: int, n_forwards: int) -> float | None:
    """tokens / forwards; None when nothing ran (no forwards)."""
    return tokens / n_forwards if n_forwards else None


def summary(rows: Iterable[tuple[int, Iterable[int]]]) -> dict:
    """Over responses given as (generated tokens, steps per block): ``tpf`` (commit passes
    counted), ``tpf_no_commit``, ``steps_per_block`` (mean denoising steps per block), ``tokens``
    and ``forwards``. Empty sets give TPF 0.0 and 0.0 steps."""
    tokens = fwd = fwd_nc = n_blocks = n_steps = 0
    for n, steps in rows:
        steps = list(steps)
        tokens += n
        fwd += forwards(steps, True)
        fwd_nc += forwards(steps, False)
        n_blocks += len(steps)
        n_steps += sum(steps)
    return {"tpf": tpf(tokens, fwd) or 0.0, "tpf_no_commit": tpf(tokens, fwd_nc) or 0.0,
            "steps_per_block": n_steps / max(n_blocks, 1), "tokens": tokens, "forwards": fwd}
