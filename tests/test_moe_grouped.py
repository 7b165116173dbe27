"""The training forward's routed experts (orl.model.layers.MoE): the sorted per-expert loop (CPU)
and the grouped GEMMs (CUDA, bfloat16) against a per-token computation written out here."""
import pytest
import torch
import torch.nn.functional as F

from orl.model.config import ModelConfig
from orl.model.layers import MoE


def _moe(gemma: bool, shared: int, seed: int = 0) -> MoE:
    cfg = ModelConfig(hidden_size=32, intermediate_size=48, num_experts=8, num_experts_per_tok=3,
                      moe_intermediate_size=16, num_shared_experts=shared, router_scale=gemma,
                      hidden_act="silu")
    torch.manual_seed(seed)
    m = MoE(cfg)
    if gemma:  # non-trivial scales, so a wrong weighting shows
        with torch.no_grad():
            m.router_scale.uniform_(0.5, 1.5)
            m.per_expert_scale.uniform_(0.5, 1.5)
    return m


def _per_token(m: MoE, x: torch.Tensor) -> torch.Tensor:
    """out[t] = sum_j w[t, j] * down_e(act(gate_e x_t) * up_e x_t) (+ shared), one token at a time."""
    x2 = x.reshape(-1, x.shape[-1])
    w, idx = m.route(x2)
    rows = []
    for t in range(x2.shape[0]):
        acc = torch.zeros(x2.shape[-1], dtype=torch.float64)
        for j in range(idx.shape[1]):
            e = int(idx[t, j])
            g, u = (m.gate_up_proj[e].double() @ x2[t].double()).chunk(2)
            acc += float(w[t, j].detach()) * (m.down_proj[e].double() @ (F.silu(g) * u))
        rows.append(acc)
    out = torch.stack(rows)
    if m.shared_experts is not None:
        out = out + m.shared_experts(x2).double()
    return out.view(x.shape)


@pytest.mark.parametrize("gemma,shared", [(False, 1), (True, 0)])
def test_sorted_experts_equal_the_per_token_sum(gemma, shared):
    m = _moe(gemma, shared)
    x = torch.randn(2, 13, 32)
    got = m(x)
    ref = _per_token(m, x)
    assert torch.allclose(got.double(), ref, atol=1e-5, rtol=1e-5)
    _, idx = m.route(x.reshape(-1, 32))
    assert len(idx.unique()) >= 4  # several experts touched: the grouping is exercised
    assert got.abs().mean() > 1e-2  # not a degenerate zero output


@pytest.mark.skipif(not torch.cuda.is_available(), reason="grouped GEMMs run on CUDA (bf16) only")
@pytest.mark.parametrize("gemma,shared,N", [(False, 1, 4096), (True, 0, 4096), (False, 0, 2)])
def test_grouped_gemms_equal_the_loop_forward_and_gradients(gemma, shared, N, monkeypatch):
    """N = 2: 6 assignments over 8 experts, so some groups are empty (forward and backward)."""
    m = _moe(gemma, shared).cuda()
    x = torch.randn(1, N, 32, device="cuda")
    outs, grads = [], []
    for grouped in ("1", "0"):
        monkeypatch.setenv("ORL_MOE_GROUPED", grouped)
        m.zero_grad()
        xi = x.clone().requires_grad_(True)
        with torch.autocast("cuda", torch.bfloat16):
            y = m(xi)
        (y.float() * torch.linspace(-1, 1, y.numel(), device="cuda").view_as(y)).sum().backward()
        outs.append(y.float())
        grads.append([xi.grad.float(), m.gate_up_proj.grad.float(), m.down_proj.grad.float()])
    scale = outs[1].abs().max()
    assert scale > 1e-2
    assert (outs[0] - outs[1]).abs().max() <= 2e-2 * scale
    for a, b in zip(*grads):
        assert (a - b).abs().max() <= 3e-2 * b.abs().max()
