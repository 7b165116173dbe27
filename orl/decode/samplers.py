"""Samplers and acceptance rules as pure functions (docs/method.md 1.4).

Every function takes tensors and scalars and returns tensors: no state, no logging. The block
decoder (`orl.decode.block`) calls them once per denoising step.
Shapes: B batch, K block length, V vocab. ``unresolved`` (B, K) bool is True where a position is
not yet committed.
"""
from __future__ import annotations

import math

import torch


def _default_draw(probs: torch.Tensor) -> torch.Tensor:
    return torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1).view(probs.shape[:-1])


def top_p_filter(probs: torch.Tensor, top_p) -> torch.Tensor:
    """Nucleus filter of probs (..., V): keep the most probable tokens while the mass before each is
    below ``top_p`` (a float or a tensor; the most probable token always stays), renormalised.
    Graph-safe (sort, cumsum, scatter)."""
    sp, idx = probs.sort(-1, descending=True)
    keep = torch.zeros_like(sp, dtype=torch.bool).scatter(-1, idx, (sp.cumsum(-1) - sp) < top_p)
    out = probs * keep
    return out / out.sum(-1, keepdim=True)


def divide(x: torch.Tensor, t) -> torch.Tensor:
    """x / t with t (a number or a 0-d host tensor) on x's device: CUDA divides by a host scalar as
    a multiplication by its reciprocal (one ulp from true division for ~28 % of float32 elements,
    measured on an H200), the runtime (`orl.engine.rules`) by a device tensor; with t on the device
    both decoders round the same. On the CPU it is ``x / t`` unchanged."""
    if x.device.type == "cpu":
        return x / t
    return x / torch.as_tensor(t, dtype=x.dtype).to(x.device, non_blocking=True)


def step_distribution(logits: torch.Tensor, temperature: float, draw=None, top_p: float = 1.0):
    """From logits (B, K, V): probs (B, K, V) of the processed distribution, chosen tokens (B, K),
    their probability ``conf`` (B, K) and the normalised entropy (B, K) in [0, 1].

    temperature 0 means greedy: tokens are the argmax of softmax(logits). ``draw`` (B, K, V) ->
    (B, K): one sample per position (an RNG object's ``sample``, `orl.decode.rng`; None: torch's
    default stream). ``top_p`` < 1 (sampling only): the distribution is `top_p_filter`'s."""
    lf = logits.float()
    probs = torch.softmax(divide(lf, temperature) if temperature > 0 else lf, dim=-1)
    if temperature > 0 and top_p < 1:
        probs = top_p_filter(probs, top_p)
    if temperature > 0:
        tokens = (draw or _default_draw)(probs)
    else:
        tokens = probs.argmax(-1)
    conf = probs.gather(-1, tokens[..., None]).squeeze(-1)
    return probs, tokens, conf, normalized_entropy(probs)


def normalized_entropy(probs: torch.Tensor) -> torch.Tensor:
    """H(p) / log V over the last axis; (..., V) -> (...)."""
    logp = torch.log(probs.clamp_min(1e-30))
    return -(probs * logp).sum(-1) / math.log(probs.shape[-1])


def step_quota(K: int, steps: int, step: int) -> int:
    """Tokens to commit at ``step`` when K is split evenly over ``steps`` (remainder first)."""
    base, rem = divmod(K, steps)
    return max(1, base + (1 if step < rem else 0))


def _top_n(score: torch.Tensor, allowed: torch.Tensor, n: torch.Tensor | int) -> torch.Tensor:
    """(B, K) bool: the n highest-scoring allowed positions per row (n (B,) or int)."""
    s = score.masked_fill(~allowed, float("-inf"))
    order = torch.sort(s, dim=-1, descending=True, stable=True).indices
    rank = torch.empty_like(order)
    rank.scatter_(-1, order, torch.arange(s.shape[-1], device=s.device).expand_as(order))
    n = torch.as_tensor(n, device=s.device).view(-1, 1) if not isinstance(n, int) else n
    return allowed & (rank < n)


def select_threshold(conf: torch.Tensor, unresolved: torch.Tensor, threshold: float, quota: int) -> torch.Tensor:
    """SDAR ``low_confidence_dynamic``: all unresolved positions with conf > threshold; if fewer
    than ``quota``, the top-``quota`` by confidence instead."""
    above = unresolved & (conf > threshold)
    fallback = _top_n(conf, unresolved, quota)
    enough = above.sum(-1, keepdim=True) >= torch.clamp(unresolved.sum(-1, keepdim=True), max=quota)
    return torch.where(enough, above, fallback)


def select_topk(conf: torch.Tensor, unresolved: torch.Tensor, quota: int) -> torch.Tensor:
    """SDAR ``low_confidence_static``: the top-``quota`` unresolved positions by confidence."""
    return _top_n(conf, unresolved, quota)


def select_entropy_bounded(entropy: torch.Tensor, unresolved: torch.Tensor, bound: float) -> torch.Tensor:
    """EB-sampler: sort unresolved positions by entropy (ascending) and take the largest prefix whose
    cumulative entropy stays <= ``bound``; at least one position per row with any unresolved."""
    e = entropy.masked_fill(~unresolved, float("inf"))
    order = torch.sort(e, dim=-1, stable=True).indices
    cum = e.gather(-1, order).cumsum(-1)
    take_sorted = cum <= bound
    take_sorted[:, 0] = True
    take = torch.zeros_like(unresolved)
    take.scatter_(-1, order, take_sorted)
    return take & unresolved


def llada_transfer(conf: torch.Tensor, masked: torch.Tensor, threshold: float) -> torch.Tensor:
    """LLaDA-2.1 mask->token: masked positions with conf > threshold, else the single best one."""
    return select_threshold(conf, masked, threshold, 1)


def llada_edits(probs: torch.Tensor, canvas: torch.Tensor, editable: torch.Tensor, edit_threshold: float):
    """LLaDA-2.1 token->token editing: editable positions whose argmax differs from the current
    token with probability > edit_threshold. Returns (edit mask (B, K), new tokens (B, K))."""
    p, arg = probs.max(-1)
    return llada_edits_at(p, arg, canvas, editable, edit_threshold)


def llada_edits_at(p_arg: torch.Tensor, arg: torch.Tensor, canvas: torch.Tensor, editable: torch.Tensor,
                   edit_threshold) -> tuple[torch.Tensor, torch.Tensor]:
    """`llada_edits` from the argmax ``arg`` (B, K) and its probability ``p_arg`` (B, K)."""
    return editable & (arg != canvas) & (p_arg > edit_threshold), arg


# --- DiffusionGemma (HF ``DiffusionGemmaGenerationMixin.generate``; docs/diffusiongemma-spec.md 9) ---
def dgemma_temperature(steps_left: int, max_steps: int, t_min: float, t_max: float) -> torch.Tensor:
    """T(n) = t_min + (t_max - t_min) * (n / N), n = steps remaining (N at the first step, 1 at the
    last). A float32 scalar tensor computed as HF does (int32 n / N in float32), so that
    ``logits / T`` is bit-identical to HF's processed logits."""
    n = torch.tensor(steps_left, dtype=torch.int32)
    return t_min + (t_max - t_min) * (n / max_steps)


def dgemma_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy in nats (not normalised), (..., V) -> (...), exactly HF's
    ``Categorical(logits=...).entropy()``."""
    return torch.distributions.Categorical(logits=logits, validate_args=False).entropy()


def dgemma_step(logits: torch.Tensor, temperature: torch.Tensor, greedy: bool = False, draw=None):
    """One step's processed distribution. logits (B, K, V) raw; returns processed logits
    ``lg = logits / T`` (B, K, V) float32, probs softmax(lg) (B, K, V), the sampled tokens (B, K)
    (one draw over all B*K rows, as HF's ``multinomial``; ``draw`` as in `step_distribution`;
    ``greedy``: the argmax, no draw) and the entropy in nats (B, K)."""
    lg = divide(logits.float(), temperature)
    probs = torch.softmax(lg, dim=-1)
    if greedy:
        tokens = lg.argmax(-1)
    else:
        tokens = (draw or _default_draw)(probs)
    return lg, probs, tokens, dgemma_entropy(lg)


def dgemma_accept(entropy: torch.Tensor, bound: float) -> torch.Tensor:
    """Entropy-bound acceptance over ALL K positions (nothing stays fixed): sort entropies (nats)
    ascending and accept while cumsum(H) - H <= bound, i.e. sum - max of the accepted set (the
    sorted entry is the running max). The lowest-entropy position is always accepted.
    entropy (B, K) -> (B, K) bool. Non-stable sort, as HF."""
    sorted_h, order = torch.sort(entropy, dim=-1)
    take_sorted = (sorted_h.cumsum(-1) - sorted_h) <= bound
    return torch.zeros_like(take_sorted).scatter(-1, order, take_sorted)


def dgemma_stable(history: torch.Tensor, argmax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Stability test of the early stop: the argmax canvas equals each of the last s ones.
    history (s, B, K) (filled with -1 at a block's start), argmax (B, K). Returns (stable (B,) bool,
    the new history: rolled, newest last). s = 0: always stable."""
    if history.shape[0] == 0:
        return torch.ones(argmax.shape[0], dtype=torch.bool, device=argmax.device), history
    stable = (history == argmax[None]).all(-1).all(0)
    history = torch.roll(history, -1, 0)
    history[-1] = argmax
    return stable, history


def dgemma_selfcond_probs(processed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The distribution of the next step's self-conditioning input, as HF: the processed
    (temperature-scaled) logits (B, K, V) cast to the embedding dtype, softmaxed in float32."""
    return torch.softmax(processed.to(dtype), dim=-1, dtype=torch.float32)
