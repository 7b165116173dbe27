"""The residual pathway: how the previous step's distribution enters the next step's input.

Owns the input embedding of a denoising step (docs/method.md 2.1-2.3, 3.7):
  z_i     = c * sum_v p_i(v) E_v                    soft embedding of the previous step (``soft_embed``)
  "mlp":  e_i = E[x_i] c + alpha * g_phi(z_i)       ORL / DiffusionGemma self-conditioning,
          g_phi(z) = W_down(act(W_gate n(z)) * W_up n(z)) / gamma,  n = RMSNorm
          optional post-norm e_i <- RMSNorm_noscale(e_i) (DiffusionGemma)
  "rcd":  e_i = (1 - a_i) E[x_i] c + a_i z_i         RCD's entropy-weighted interpolation,
          a_i = normalised entropy of the previous step at i (computed by the decoder)
The residual applies only where ``where`` is True (unresolved positions, or the whole canvas);
z = 0 on a block's first step gives g_phi(0) = 0 (RMSNorm(0) = 0), i.e. no residual.

gamma re-parameterisation (2.3 reading a): W_down is stored multiplied by gamma and the output is
divided by gamma, so the function is unchanged but Adam's per-step change of the pathway's output
shrinks by gamma. `rescale_pathway` is the equivalent of the release's ``make_scrp_base --gamma``.
Does not own: where z comes from (the decoder computes it; ORL replays a captured copy).
"""
from __future__ import annotations

import torch
from torch import nn

from .config import ModelConfig
from .layers import GatedMLP, RMSNorm


class ResidualPathway(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        D = cfg.hidden_size
        self.norm = RMSNorm(D, cfg.rms_eps, cfg.norm_offset)
        self.mlp = GatedMLP(D, cfg.pathway_intermediate or D, cfg.hidden_act)
        self.register_buffer("gamma", torch.tensor(float(cfg.pathway_gamma)), persistent=False)

    def reset_output(self) -> None:
        """Zero W_down: the pathway then adds nothing until trained (start from a model without one)."""
        nn.init.zeros_(self.mlp.down_proj.weight)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """z (B, T, D) -> g_phi(z) (B, T, D)."""
        return self.mlp(self.norm(z)) / self.gamma


def combine(embeds: torch.Tensor, cfg: ModelConfig, pathway: ResidualPathway | None,
            residual: torch.Tensor | None, where: torch.Tensor | None,
            weight: torch.Tensor | None = None) -> torch.Tensor:
    """Input embeddings (B, T, D) of a step: ``embeds`` = c E[x]; residual (B, T, D) = z;
    where (B, T) bool; weight (B, T) = a_i for "rcd". Returns the mixed embeddings."""
    if cfg.pathway == "none" or where is None:
        return embeds
    if cfg.pathway == "mlp":
        mixed = embeds if residual is None else embeds + cfg.pathway_alpha * pathway(residual.to(embeds.dtype))
        if cfg.pathway_post_norm:
            mf = mixed.float()
            mixed = (mf * torch.rsqrt(mf.pow(2).mean(-1, keepdim=True) + cfg.rms_eps)).to(embeds.dtype)
    else:  # rcd
        if residual is None or weight is None:
            return embeds
        a = weight[..., None].to(embeds.dtype)
        mixed = (1 - a) * embeds + a * residual.to(embeds.dtype)
    return torch.where(where[..., None], mixed, embeds)


@torch.no_grad()
def rescale_pathway(model: nn.Module, gamma: float) -> None:
    """Re-parameterise the pathway to ``gamma`` in place without changing the function:
    W_down <- W_down * gamma / gamma_old; config and buffer updated."""
    pw = getattr(model, "residual_pathway", None)
    if pw is None:
        raise ValueError("this model has no residual pathway (config.pathway == 'none'); build it with "
                         "pathway='mlp' first (`orl convert --add-pathway`)")
    if gamma <= 0:
        raise ValueError(f"gamma must be positive, got {gamma}")
    old = float(pw.gamma)
    pw.mlp.down_proj.weight.mul_(gamma / old)
    pw.gamma.fill_(gamma)
    model.config.pathway_gamma = float(gamma)
