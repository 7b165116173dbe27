"""Per-step diagnosis of an ORL update (docs/method.md 3.10): how far the step moved the weights and what it trained on.

Pure functions over a model's parameters and a step's rollouts and selections; `orl.train.loop` logs
what they return in ``metrics.jsonl``. Does not own: the step itself (`orl.train.loop`), the losses'
own metrics (`orl.train.losses`).
"""
from __future__ import annotations

import torch


def _is_pathway(name: str) -> bool:
    return name.startswith("residual_pathway.") or ".residual_pathway." in name


def _sq(t: torch.Tensor) -> float:
    """Sum of squares of a tensor (a DTensor shard's summed over ranks)."""
    v = t.detach().float().pow(2).sum()
    return float(v.full_tensor() if hasattr(v, "full_tensor") else v)


def _params_before(model, max_params: int) -> dict:
    """Copies of the parameters whose update the step logs: the residual pathway's always, the rest
    when the model has at most ``max_params`` parameters."""
    every = sum(p.numel() for p in model.parameters()) <= max_params
    return {n: p.detach().clone() for n, p in model.named_parameters() if every or _is_pathway(n)}


@torch.no_grad()
def _update_sizes(model, before: dict) -> dict:
    """The step's relative update ||theta_after - theta_before|| / ||theta_before|| of the residual
    pathway (``update_pathway``) and of every other parameter (``update_model``), for the parameters
    in ``before``."""
    acc = {"pathway": [0.0, 0.0], "model": [0.0, 0.0]}
    for n, p in model.named_parameters():
        if n in before:
            a = acc["pathway" if _is_pathway(n) else "model"]
            a[0] += _sq(p - before[n])
            a[1] += _sq(before[n])
    return {f"update_{k}": (d / max(b, 1e-30)) ** 0.5 for k, (d, b) in acc.items() if b > 0}


def _supervision_shares(rolls: list, verified: list, sels: list, K: int) -> dict:
    """What the step trained on: the share of rollouts verified (only those supervise), the states and
    unresolved positions replayed, and the share of those positions after the response's EOS (targets
    the verifier never read: whatever the rollout committed there)."""
    n_pos = n_post = n_states = 0
    for sel in sels:
        r = sel.rollout
        for i in sel.states:
            st = r.states[i]
            pos = st.block * K + torch.nonzero(st.unresolved).flatten()
            n_pos += int(pos.numel())
            n_post += int((pos >= r.n_generated).sum())
            n_states += 1
    return {"verified_share": len(verified) / max(len(rolls), 1), "train_states": n_states,
            "train_positions": n_pos, "post_eos_frac": n_post / max(n_pos, 1)}
