"""ORL losses against hand computations (numbers worked out in the comments)."""
import math

import pytest
import torch

from orl.train.losses import (LossConfig, aec_loss, anchor_loss, dense_reverse_kl, entropy_norm, orl_loss,
                              pred_loss, sparse_reverse_kl)


def test_aec_matches_the_worked_example():
    # ORL page: rho 0.25, H_source 0.40, H_next 0.36 -> target 0.30 -> loss (0.06)^2 = 0.0036
    h = torch.tensor([[0.40, 0.40], [0.36, 0.36]], requires_grad=True)
    unres = torch.ones(2, 2, dtype=torch.bool)
    loss, hbar = aec_loss(h, unres, torch.tensor([[0, 1]]), torch.tensor([0, 0]), 1, rho=0.25)
    assert loss.item() == pytest.approx(0.0036, abs=1e-7)
    loss.backward()
    # only the next state carries gradient: d/dh_next = 2 * 0.06 / 2 positions each; source detached
    assert torch.allclose(h.grad[1], torch.tensor([0.06, 0.06]), atol=1e-6)
    assert torch.equal(h.grad[0], torch.zeros(2))
    # contracted enough -> zero; averaged over the state's own unresolved positions only
    h2 = torch.tensor([[0.4, 0.9], [0.2, 0.0]])
    u2 = torch.tensor([[True, False], [True, False]])
    l2, _ = aec_loss(h2, u2, torch.tensor([[0, 1]]), torch.tensor([0, 0]), 1, 0.25)
    assert l2.item() == 0.0


def test_pred_loss_hard_gate_and_response_normalisation():
    V = 4
    logits = torch.zeros(3, 2, V)
    logits[0, 0, 1] = 10.0  # confident position: gated out by the hard gate
    targets = torch.tensor([[1, 2], [3, 0], [0, 0]])
    unres = torch.tensor([[True, True], [True, False], [True, True]])
    resp = torch.tensor([0, 0, 1])
    loss, ce, h = pred_loss(logits, targets, unres, resp, 2, "hard", 0.5)
    lv = math.log(V)
    # response 0: supervised tokens = 3 (2 + 1); gated CE sum = log V (s0 pos1) + log V (s1 pos0) = 2 log V
    # response 1: 2 tokens, both uniform -> 2 log V / 2 = log V; mean over responses
    expect = ((2 * lv) / 3 + lv) / 2
    assert loss.item() == pytest.approx(expect, rel=1e-5)
    soft, _, _ = pred_loss(logits, targets, unres, resp, 2, "soft", 0.5)
    # soft weight of a uniform position is its normalised entropy 1.0; the confident one ~0
    assert soft.item() == pytest.approx(expect, rel=1e-3)


def test_reverse_kl_sparse_equals_dense_when_k_is_V_and_cap_and_gate():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(2, 3, 5, generator=g), torch.randn(2, 3, 5, generator=g)
    lq = torch.log_softmax(b, -1)
    ids = torch.arange(5).expand(2, 3, 5)
    assert torch.allclose(sparse_reverse_kl(a, ids, lq), dense_reverse_kl(a, b), atol=1e-6)
    # hand value for one position: p = [0.5, 0.5], q = [0.9, 0.1]
    p = torch.log(torch.tensor([[[0.5, 0.5]]]))
    q = torch.log(torch.tensor([[[0.9, 0.1]]]))
    kl = dense_reverse_kl(p, q)
    hand = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)
    assert kl.item() == pytest.approx(hand, rel=1e-5)
    unres = torch.ones(1, 1, dtype=torch.bool)
    low = torch.tensor([[0.01]])
    capped, _ = anchor_loss(kl, low, unres, torch.tensor([0]), 1, tau=0.1, cap=0.2)
    assert capped.item() == pytest.approx(0.2)
    gated, _ = anchor_loss(kl, torch.tensor([[0.5]]), unres, torch.tensor([0]), 1, tau=0.1, cap=5.0)
    assert gated.item() == 0.0


def test_full_objective_combines_weights():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 3, 6, generator=g, requires_grad=True)
    ref = torch.randn(2, 3, 6, generator=g)
    targets = torch.randint(6, (2, 3), generator=g)
    unres = torch.ones(2, 3, dtype=torch.bool)
    resp, pairs = torch.tensor([0, 0]), torch.tensor([[0, 1]])
    cfg = LossConfig(gate="none", lambda_aec=2.0, lambda_kl=0.5, kl_gate_tau=2.0, kl_cap=100.0)
    loss, m = orl_loss(logits, targets, unres, resp, pairs, 1, cfg, ref_logits=ref)
    lp, _, _ = pred_loss(logits, targets, unres, resp, 1, "none", 0.0)
    la, _ = aec_loss(entropy_norm(logits), unres, pairs, resp, 1, 0.25)
    lk = dense_reverse_kl(logits, ref).sum() / 6
    assert loss.item() == pytest.approx((lp + 2.0 * la + 0.5 * lk).item(), rel=1e-5)
    loss.backward()
    assert logits.grad.abs().sum() > 0 and "entropy_contraction" in m


def test_supervise_committed_only_counts_what_the_rollout_committed():
    V = 4
    logits = torch.zeros(1, 3, V)
    targets = torch.tensor([[1, 2, 3]])
    unres = torch.ones(1, 3, dtype=torch.bool)
    committed = torch.tensor([[False, True, False]])
    cfg = LossConfig(supervise="committed", gate="none", lambda_aec=0.0, anchor="none")
    loss, _ = orl_loss(logits, targets, unres, torch.tensor([0]), torch.zeros(0, 2, dtype=torch.long), 1, cfg,
                       committed=committed)
    assert loss.item() == pytest.approx(math.log(V), rel=1e-6)  # one supervised token, uniform -> log V
    with pytest.raises(ValueError, match="commits"):
        orl_loss(logits, targets, unres, torch.tensor([0]), torch.zeros(0, 2, dtype=torch.long), 1, cfg)
