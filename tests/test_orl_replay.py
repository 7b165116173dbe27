"""Exact residual capture and replay; packed replay == per-state replay (losses and gradients)."""
import random

import pytest
import torch

from orl.decode import DecodeConfig
from orl.model import build_model, get_config
from orl.tasks.arith import ArithTask
from orl.tokenizer import build_char_tokenizer
from orl.train.losses import LossConfig, orl_loss
from orl.train.pack import pack, select_states
from orl.train.rollout import rollout_group


@pytest.fixture(scope="module")
def setup():
    tok = build_char_tokenizer()
    cfg = get_config("sdar", "tiny", vocab_size=len(tok), mask_token_id=tok.mask_token_id, block_size=8)
    model = build_model(cfg, seed=3).eval()
    g = torch.Generator().manual_seed(3)
    torch.nn.init.normal_(model.residual_pathway.mlp.down_proj.weight, std=0.3, generator=g)  # pathway matters
    task = ArithTask(terms=2, digits=2)
    dcfg = DecodeConfig(rule="threshold", block_size=8, max_new_tokens=16, temperature=1.0, threshold=0.2)
    rolls = rollout_group(model, tok, task, task.sample("train", 0), 3, dcfg,
                          generator=torch.Generator().manual_seed(0), topk=len(tok))
    return tok, model, rolls


def test_replay_reproduces_rollout_logits(setup):
    tok, model, rolls = setup
    sels = [select_states(r, budget=100, rng=random.Random(0)) for r in rolls]
    assert sum(len(s.states) for s in sels) > 6 and any(r.states[1].residual is not None for r in rolls)
    for mode in ("per_state", "packed"):
        b = pack(sels, 8, model.config.clean_attention, mode)
        with torch.no_grad():
            lg = b.gather(model(b.tokens, b.positions, b.mask, residual=b.residual,
                                residual_where=b.residual_where, residual_weight=b.residual_weight))
        replay = torch.log_softmax(lg.float(), -1).gather(-1, b.ref_ids)
        assert (replay - b.ref_logp).abs().max().item() <= 1e-6, mode
    # the captured z is the soft embedding of the previous step's distribution, not recomputed
    s0, s1 = rolls[0].states[0], rolls[0].states[1]
    assert s0.residual is None and s1.residual is not None and s1.residual.shape == (8, model.config.hidden_size)


def test_packed_equals_unpacked_losses_and_gradients(setup):
    tok, model, rolls = setup
    sels = [select_states(r, budget=4, rng=random.Random(1)) for r in rolls]
    cfg = LossConfig(gate="soft", anchor="none")
    out = {}
    for mode in ("packed", "per_response", "per_state"):
        model.zero_grad()
        b = pack(sels, 8, model.config.clean_attention, mode, max_row_tokens=60)
        lg = b.gather(model(b.tokens, b.positions, b.mask, residual=b.residual,
                            residual_where=b.residual_where))
        loss, m = orl_loss(lg, b.targets, b.unresolved, b.resp, b.pairs, b.n_responses, cfg)
        loss.backward()
        out[mode] = (loss.item(), [p.grad.clone() for p in model.parameters()], b.tokens.shape)
    ref_loss, ref_grads, _ = out["per_state"]
    assert out["packed"][2][0] < out["per_state"][2][0]  # packing really packed
    for mode in ("packed", "per_response"):
        assert out[mode][0] == pytest.approx(ref_loss, rel=1e-5, abs=1e-6)
        for g, r in zip(out[mode][1], ref_grads):
            assert torch.allclose(g, r, atol=1e-6), mode


def test_flex_block_mask_equals_the_dense_mask(setup):
    """The staircase visibility as a FlexAttention BlockMask (the replay's fast path) gives the dense
    SDPA mask's logits and losses on a packed batch (and gradients, on CUDA); its mask_mod is the
    dense mask, and the BlockMask skips tiles."""
    from orl.model.masks import staircase_block_mask  # noqa: PLC0415
    tok, model, rolls = setup
    sels = [select_states(r, budget=4, rng=random.Random(2)) for r in rolls]
    b = pack(sels, 8, model.config.clean_attention, "packed", max_row_tokens=80)
    bm = b.block_mask(block_size=16)
    dense = bm.to_dense()  # (B, 1, T/16, T/16) tiles with any visible pair
    assert dense.shape[0] == b.tokens.shape[0] and bool((dense == 0).any())  # some tiles are skipped
    from torch.nn.attention.flex_attention import create_mask  # noqa: PLC0415
    B, T = b.tokens.shape
    m = staircase_block_mask(b.meta[:, 0], b.meta[:, 1], b.meta[:, 2], 16)
    assert torch.equal(create_mask(m.mask_mod, B, None, T, T, device=b.mask.device)[:, 0], b.mask)
    cfg = LossConfig(gate="soft", anchor="none")
    out = {}
    grads = torch.cuda.is_available()  # FlexAttention has no backward on the CPU: gradients on CUDA only
    dev = "cuda" if grads else "cpu"
    m_ = model.to(dev)
    bb = b.to(dev)
    for name, mask in (("dense", bb.mask), ("flex", bb.block_mask(block_size=16))):
        m_.zero_grad()
        with torch.set_grad_enabled(grads):
            lg = bb.gather(m_(bb.tokens, bb.positions, mask, residual=bb.residual, residual_where=bb.residual_where))
            loss, _ = orl_loss(lg, bb.targets, bb.unresolved, bb.resp, bb.pairs, bb.n_responses, cfg)
        if grads:
            loss.backward()
        out[name] = (lg.detach(), loss.item(), [p.grad.clone() for p in m_.parameters()] if grads else [])
    model.to("cpu")
    torch.testing.assert_close(out["flex"][0], out["dense"][0], rtol=1e-5, atol=1e-5)
    assert out["flex"][1] == pytest.approx(out["dense"][1], rel=1e-6, abs=1e-7)
    for gf, gd in zip(out["flex"][2], out["dense"][2]):
        torch.testing.assert_close(gf, gd, rtol=1e-4, atol=1e-6)


def test_cost_ordered_packing_keeps_the_losses(setup):
    """Rows filled by estimated cost (`orl.train.balance.pack_by_cost`) instead of in order: the same
    states, the same per-response losses (the loss is a sum over responses), within the budget."""
    tok, model, rolls = setup
    sels = [select_states(r, budget=4, rng=random.Random(1)) for r in rolls]
    cfg = LossConfig(gate="soft", anchor="none")
    losses = {}
    for name, cc in (("order", None), ("cost", model.config)):
        b = pack(sels, 8, model.config.clean_attention, "packed", max_row_tokens=60, cost_cfg=cc)
        seg = b.meta[:, 2]  # padding has negative segments
        for row in seg:
            real = row[row >= 0]
            assert real.numel() <= 60 or real.unique().numel() == 1  # within budget, or one unit alone
        with torch.no_grad():
            lg = b.gather(model(b.tokens, b.positions, b.mask, residual=b.residual, residual_where=b.residual_where))
        losses[name] = orl_loss(lg, b.targets, b.unresolved, b.resp, b.pairs, b.n_responses, cfg)[0].item()
    assert losses["cost"] == pytest.approx(losses["order"], rel=1e-6)
