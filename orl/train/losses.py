"""The ORL objective as pure functions (docs/method.md 3.3).

  L = L_pred + lambda_aec * L_AEC + lambda_kl * L_anchor, each normalised per response (3.3.5):
  a response's loss is the sum over its selected states divided by its supervised tokens (pairs for
  AEC), and responses are averaged, so a response with more packed states does not weigh more.

  L_pred(s)   = sum_{i in U_s} w_i * -log p_i(y_i)        w_i = 1[H_i >= tau] (hard), H_i (soft), 1 (none)
                (gate from the current forward, detached; no 1/t weighting: on-policy states)  [G]
  L_AEC(k,k+1)= max(0, Hbar(s_{k+1}) - (1 - rho) * sg(Hbar(s_k)))^2,  Hbar = mean normalised entropy
                over the state's own unresolved positions; pairs whose next state has none are skipped.
  L_anchor(s) = sum_{i in U_s} 1[Hq_i < tau_kl] * min(KL(p_i || q_i), C)   reverse KL, capped.
                q = a frozen copy of the start model on the same replayed input ("frozen", default),
                or the rollout policy's top-k distribution ("rollout"; note: with one update per fresh
                rollout batch, q equals the current model at the update, so its gradient is exactly
                zero -- it only acts with stale rollouts).  [G]

No `self`, no globals, no logging: tensors in, (loss, metrics) out (docs/STYLE.md convention 3).
Shapes: S states, K block length, V vocab, k top-k, N pairs, R responses.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class LossConfig:
    supervise: str = "unresolved"  # CE on every unresolved position, or "committed": only on what the
                                   # rollout committed at that step (TraceRL-style slicing)        [G]
    gate: str = "hard"          # "hard" | "soft" | "none"                                     [G]
    gate_tau: float = 0.02      # normalised-entropy threshold of the hard gate                  [G]
    rho: float = 0.25           # AEC contraction target per step                               [S illustrative]
    lambda_aec: float = 1.0     # [G]
    anchor: str = "frozen"      # "frozen" | "rollout" | "none"                                  [G]
    lambda_kl: float = 0.1      # [G]
    kl_cap: float = 1.0         # nats per token                                                [G]
    kl_gate_tau: float = 0.1    # anchor only where the anchor's normalised entropy is below this [G]


def entropy_norm(logits: torch.Tensor) -> torch.Tensor:
    """Normalised entropy H(p)/log V of softmax(logits); (..., V) -> (...)."""
    lp = torch.log_softmax(logits.float(), -1)
    return -(lp.exp() * lp).sum(-1) / math.log(logits.shape[-1])


def _per_response(values: torch.Tensor, counts: torch.Tensor, resp: torch.Tensor, R: int) -> torch.Tensor:
    """Mean over all R responses of sum(values of r) / sum(counts of r) (0 for a response with no
    count), so the result is a plain average over responses and sums exactly across data-parallel ranks."""
    num = torch.zeros(R, dtype=values.dtype, device=values.device).index_add(0, resp, values)
    den = torch.zeros(R, dtype=values.dtype, device=values.device).index_add(0, resp, counts.to(values.dtype))
    return (num / den.clamp_min(1e-12) * (den > 0)).sum() / max(R, 1)


def pred_loss(logits, targets, unresolved, resp, R: int, gate: str, gate_tau: float):
    """Uncertainty-gated CE. logits (S, K, V), targets (S, K), unresolved (S, K) bool, resp (S,)."""
    ce = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="none").view_as(targets)
    h = entropy_norm(logits).detach()
    w = {"hard": (h >= gate_tau).float(), "soft": h, "none": torch.ones_like(h)}[gate] * unresolved
    return _per_response((ce * w).sum(-1), unresolved.sum(-1), resp, R), ce, h


def aec_loss(h: torch.Tensor, unresolved: torch.Tensor, pairs: torch.Tensor, resp: torch.Tensor, R: int, rho: float):
    """h (S, K) normalised entropies WITH grad; pairs (N, 2) state ids (source, next)."""
    n = unresolved.sum(-1)
    hbar = (h * unresolved).sum(-1) / n.clamp_min(1)
    if pairs.numel() == 0:
        return h.sum() * 0.0, hbar
    src, nxt = pairs[:, 0], pairs[:, 1]
    keep = n[nxt] > 0
    src, nxt = src[keep], nxt[keep]
    per = torch.clamp(hbar[nxt] - (1 - rho) * hbar[src].detach(), min=0) ** 2
    return _per_response(per, torch.ones_like(per), resp[nxt], R), hbar


def sparse_reverse_kl(logits: torch.Tensor, ref_ids: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """KL(p || q) with q known on top-k ids and the rest lumped into one bucket (exact when k = V).
    logits (S, K, V); ref_ids, ref_logp (S, K, k) -> (S, K)."""
    lp = torch.log_softmax(logits.float(), -1)
    p_top_log = lp.gather(-1, ref_ids)
    p_top = p_top_log.exp()
    q_top = ref_logp.exp()
    p_rest = (1 - p_top.sum(-1)).clamp_min(1e-12)
    q_rest = (1 - q_top.sum(-1)).clamp_min(1e-12)
    kl = (p_top * (p_top_log - ref_logp)).sum(-1) + p_rest * (p_rest.log() - q_rest.log())
    return kl.clamp_min(0)


def dense_reverse_kl(logits: torch.Tensor, ref_logits: torch.Tensor) -> torch.Tensor:
    """KL(softmax(logits) || softmax(ref_logits)) per position; (S, K, V) -> (S, K)."""
    lp = torch.log_softmax(logits.float(), -1)
    lq = torch.log_softmax(ref_logits.float(), -1)
    return (lp.exp() * (lp - lq)).sum(-1)


def anchor_loss(kl: torch.Tensor, q_entropy: torch.Tensor, unresolved, resp, R: int, tau: float, cap: float):
    """Capped, entropy-gated reverse KL; kl, q_entropy (S, K)."""
    g = (q_entropy < tau) & unresolved
    return _per_response((kl.clamp(max=cap) * g).sum(-1), unresolved.sum(-1), resp, R), g


def orl_loss(logits, targets, unresolved, resp, pairs, R: int, cfg: LossConfig, *, ref_logits=None,
             ref_ids=None, ref_logp=None, ref_entropy=None, committed=None):
    """The full objective. logits (S, K, V) of the replayed states; targets (S, K) verified tokens;
    unresolved (S, K); resp (S,) response index in [0, R); pairs (N, 2). Anchor inputs: ref_logits
    (S, K, V) of the frozen model, or ref_ids/ref_logp (S, K, k) + ref_entropy (S, K) of the rollout."""
    if cfg.supervise not in ("unresolved", "committed"):
        raise ValueError(f"unknown supervise {cfg.supervise!r}; use 'unresolved' or 'committed'")
    if cfg.supervise == "committed" and committed is None:
        raise ValueError("supervise='committed' needs the rollout's per-step commits")
    sup = unresolved if cfg.supervise == "unresolved" else committed & unresolved
    lp, ce, h_det = pred_loss(logits, targets, sup, resp, R, cfg.gate, cfg.gate_tau)
    h = entropy_norm(logits)
    la, hbar = aec_loss(h, unresolved, pairs, resp, R, cfg.rho)
    lk = logits.sum() * 0.0
    kl_frac = 0.0
    if cfg.anchor != "none" and cfg.lambda_kl > 0:
        if cfg.anchor == "frozen":
            if ref_logits is None:
                raise ValueError("anchor='frozen' needs ref_logits from the frozen start model")
            kl, qh = dense_reverse_kl(logits, ref_logits), entropy_norm(ref_logits)
        elif cfg.anchor == "rollout":
            if ref_ids is None or ref_logp is None or ref_entropy is None:
                raise ValueError("anchor='rollout' needs the rollout's top-k ids/log-probs and entropy")
            kl, qh = sparse_reverse_kl(logits, ref_ids, ref_logp), ref_entropy
        else:
            raise ValueError(f"unknown anchor {cfg.anchor!r}; use 'frozen', 'rollout' or 'none'")
        lk, g = anchor_loss(kl, qh, unresolved, resp, R, cfg.kl_gate_tau, cfg.kl_cap)
        kl_frac = float(g.sum()) / max(int(unresolved.sum()), 1)
    loss = lp + cfg.lambda_aec * la + cfg.lambda_kl * lk
    with torch.no_grad():
        u = unresolved
        nu = u.sum().clamp_min(1)
        gated = (h_det >= cfg.gate_tau) & sup if cfg.gate == "hard" else sup
        metrics = {"loss": loss.item(), "loss_pred": lp.item(), "loss_aec": la.item(), "loss_anchor": lk.item(),
                   "ce_unresolved": float((ce * u).sum() / nu),
                   "entropy_unresolved": float((h_det * u).sum() / nu),
                   "gate_frac": float(((h_det >= cfg.gate_tau) & u).sum() / nu),
                   "anchor_frac": kl_frac,
                   # where the CE acts: its mean over the gated positions, and over the ones the gate leaves out
                   "ce_gated": float((ce * gated).sum() / gated.sum().clamp_min(1)),
                   "ce_ungated": float((ce * (u & ~gated)).sum() / (u & ~gated).sum().clamp_min(1)),
                   # how wrong the model's confident guesses are: unresolved positions whose argmax is not the target
                   "argmax_wrong": float(((logits.argmax(-1) != targets) & u).sum() / nu)}
        if cfg.anchor != "none" and cfg.lambda_kl > 0:
            metrics["kl_unresolved"] = float((kl * u).sum() / nu)            # uncapped, every unresolved position
            metrics["kl_anchored"] = float((kl * g).sum() / g.sum().clamp_min(1))   # where the anchor holds
            metrics["kl_free"] = float((kl * (u & ~g)).sum() / (u & ~g).sum().clamp_min(1))  # where it does not
        if pairs.numel():
            ok = u[pairs[:, 1]].any(-1) & (hbar[pairs[:, 0]] > 0)
            if bool(ok.any()):
                metrics["entropy_contraction"] = float(1 - (hbar[pairs[ok, 1]] / hbar[pairs[ok, 0]]).mean())
                metrics["aec_active"] = float((hbar[pairs[ok, 1]] > (1 - cfg.rho) * hbar[pairs[ok, 0]]).float().mean())
    return loss, metrics
