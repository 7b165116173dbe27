"""Block-diffusion SFT batches and loss as pure functions (docs/method.md 1.2, 2.2).

Owns: turning (prompt, response) id pairs into the two-copy layout [prompt | clean | noisy] with
mask-token or uniform-state corruption, and the SFT loss.
  mask noise:    t ~ U(0,1), p = (1-eps) t + eps per sample; each response token of the noisy copy
                 becomes [MASK] with prob p (at least one); L = sum_masked CE / p / N_ans.
  uniform noise: each noisy token becomes a uniform random id with prob p (DiffusionGemma); the
                 model cannot tell which were replaced, so CE is taken at every noisy position,
                 L = sum CE / N_ans (our choice; DiffusionGemma's recipe trains on clean targets).
Does not own: the optimiser loop (`orl.train.sft`) or the model.
Shapes: B rows, T = P + 2R tokens per row (rows right-padded), V vocab.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..model.masks import Layout, two_copy_layout


@dataclass
class SFTBatch:
    tokens: torch.Tensor       # (B, T) noisy copy already corrupted
    positions: torch.Tensor    # (B, T)
    mask: torch.Tensor         # (B, T, T) bool
    targets: torch.Tensor      # (B, T) clean ids at noisy-copy positions, -100 elsewhere
    weight: torch.Tensor       # (B, T) per-token loss weight (1/p at masked positions)
    corrupted: torch.Tensor    # (B, T) bool positions whose input was corrupted
    noisy: torch.Tensor        # (B, T) bool noisy-copy positions
    n_ans: int                 # response tokens in the batch


def make_batch(pairs: list[tuple[list[int], list[int]]], K: int, *, noise: str, mask_id: int | None,
               vocab_size: int, pad_id: int, clean_attention: str = "block", eps: float = 1e-3,
               generator: torch.Generator | None = None) -> SFTBatch:
    """Corrupt and lay out a list of (prompt ids, response ids); responses should already be padded
    to a multiple of K (with EOS) by the caller."""
    rows = []
    for prompt, resp in pairs:
        P, R = len(prompt), len(resp)
        lay = two_copy_layout(P, R, K, clean_attention)
        clean = torch.tensor(list(prompt) + list(resp), dtype=torch.long)
        target = torch.tensor(resp, dtype=torch.long)
        t = torch.rand((), generator=generator)
        p = (1 - eps) * t + eps
        hit = torch.rand(R, generator=generator) < p
        if not hit.any():
            hit[torch.randint(R, (), generator=generator)] = True
        if noise == "mask":
            noisy = torch.where(hit, torch.full_like(target, mask_id), target)
            w = hit.float() / p
        else:
            noisy = torch.where(hit, torch.randint(vocab_size, (R,), generator=generator), target)
            w = torch.ones(R)
        rows.append((lay, torch.cat([clean, noisy]), target, w, hit, P, R))
    T = max(len(r[1]) for r in rows)
    B = len(rows)
    tokens = torch.full((B, T), pad_id, dtype=torch.long)
    positions = torch.zeros(B, T, dtype=torch.long)
    targets = torch.full((B, T), -100, dtype=torch.long)
    weight = torch.zeros(B, T)
    corrupted = torch.zeros(B, T, dtype=torch.bool)
    noisy_pos = torch.zeros(B, T, dtype=torch.bool)
    masks = torch.zeros(B, T, T, dtype=torch.bool)
    for i, (lay, toks, target, w, hit, P, R) in enumerate(rows):
        n = len(toks)
        pad = T - n
        if pad:  # each pad token is its own segment: it sees only itself
            lay = lay.cat(Layout(torch.zeros(pad, dtype=torch.long), torch.full((pad,), -1),
                                 -1 - torch.arange(pad), torch.zeros(pad, dtype=torch.long)))
        tokens[i, :n] = toks
        positions[i] = lay.positions
        masks[i] = lay.mask()
        s = P + R
        targets[i, s:s + R] = target
        weight[i, s:s + R] = w
        corrupted[i, s:s + R] = hit
        noisy_pos[i, s:s + R] = True
    n_ans = sum(r[6] for r in rows)
    return SFTBatch(tokens, positions, masks, targets, weight, corrupted, noisy_pos, n_ans)


def sft_loss(logits: torch.Tensor, batch: SFTBatch, noise: str, weighting: str = "elbo") -> tuple[torch.Tensor, dict]:
    """Block-diffusion SFT loss of logits (B, T, V); returns (loss, metrics).

    ``weighting="elbo"``: sum CE/p / N_ans (SDAR, the diffusion ELBO); ``"flat"``: the plain mean CE
    over supervised positions (lower variance: the 1/p weight reaches 1/eps = 1000 at tiny mask rates).
    """
    V = logits.shape[-1]
    ce = F.cross_entropy(logits.float().reshape(-1, V), batch.targets.reshape(-1).clamp_min(0),
                         reduction="none").view_as(batch.weight)
    sel = batch.corrupted if noise == "mask" else batch.noisy
    if weighting == "flat":
        loss = (ce * sel).sum() / sel.sum().clamp_min(1)
    elif weighting == "elbo":
        loss = (ce * batch.weight * sel).sum() / max(batch.n_ans, 1)
    else:
        raise ValueError(f"unknown SFT loss weighting {weighting!r}; use 'elbo' or 'flat'")
    with torch.no_grad():
        acc = ((logits.argmax(-1) == batch.targets) & sel).sum() / sel.sum().clamp_min(1)
        plain = (ce * sel).sum() / sel.sum().clamp_min(1)
    return loss, {"loss": float(loss.detach()), "ce": float(plain), "token_acc": float(acc)}
