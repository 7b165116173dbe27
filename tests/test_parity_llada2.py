"""Parity with the published LLaDA-2.x architecture (`llada2_moe`): a checkpoint written in its own
names (tests/llada2_reference.py, an independent float64 forward) loads through
``orl.model.load_pretrained`` and gives the reference's logits under block-causal and causal masks;
saving it again writes the same tensors and config. Both routers: the softmax one (``TINY``) and
the published gate (``PUBLISHED``: sigmoid scores, a non-zero expert bias for the choice, top 2 of
4 expert groups, scale 2.5), each shown to change the logits. What is still unsupported is refused."""
import json
import os
import sys

import pytest
import torch

from orl.model import CheckpointError, load_pretrained, save_pretrained
from orl.model.checkpoint import read_tensors

sys.path.insert(0, os.path.dirname(__file__))
import llada2_reference as R  # noqa: E402

TOL = 1e-4


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("llada2") / "ref")
    state = R.random_state(R.TINY, seed=0)
    R.write_checkpoint(d, R.TINY, state)
    return d, state


# the published gate on 8 experts: top-3 within the best 2 of 4 groups of 2
PUBLISHED = dict(R.TINY, score_function="sigmoid", num_experts=8, num_experts_per_tok=3, n_group=4, topk_group=2,
                 routed_scaling_factor=2.5, moe_router_enable_expert_bias=True)


def published_state(seed: int = 0) -> dict[str, torch.Tensor]:
    """`R.random_state` of PUBLISHED with a router whose logits are ~N(0, 1.5^2) (not saturating the
    sigmoid: no float32 ties) and a non-zero expert bias ~N(0, 0.2^2)."""
    state = R.random_state(PUBLISHED, seed=seed)
    g = torch.Generator().manual_seed(seed + 7)
    for i in range(PUBLISHED["first_k_dense_replace"], PUBLISHED["num_hidden_layers"]):
        state[f"model.layers.{i}.mlp.gate.weight"] *= 0.25
        state[f"model.layers.{i}.mlp.gate.expert_bias"] = 0.2 * torch.randn(8, generator=g)
    return state


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("llada2") / "published")
    state = published_state()
    R.write_checkpoint(d, PUBLISHED, state)
    return d, state


def _block_causal(T: int, K: int) -> torch.Tensor:
    b = torch.arange(T) // K
    return b[:, None] >= b[None, :]


def test_logits_match_the_reference(ckpt):
    d, state = ckpt
    ours = load_pretrained(d).eval()
    cfg = ours.config
    assert (cfg.family, cfg.num_experts, cfg.first_dense_layers, cfg.mask_token_id, cfg.block_size) == ("llada", 4, 1, 95, 8)
    assert cfg.full_rotary_fraction == 0.5 and cfg.full_rope_theta == 1e4 ** 2  # theta' = theta^(hd/r)
    ids = torch.randint(0, 96, (2, 20), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(20)
    for mask in (_block_causal(20, 8), torch.ones(20, 20, dtype=torch.bool).tril()):
        ref = R.logits(R.TINY, state, ids, mask)
        with torch.no_grad():
            got = ours(ids, pos, mask)
        assert (got - ref).abs().max().item() <= TOL, (got - ref).abs().max()
        assert ref.std() > 0.5  # not a degenerate comparison


def test_save_writes_the_same_checkpoint(ckpt, tmp_path):
    d, state = ckpt
    ours = load_pretrained(d)
    save_pretrained(ours, str(tmp_path / "again"))
    back = read_tensors(str(tmp_path / "again"))
    assert set(back) == set(state) and all(torch.equal(back[k], state[k]) for k in state)
    c = json.load(open(tmp_path / "again" / "config.json"))
    assert all(c[k] == v for k, v in R.TINY.items())  # every key of the source kept as written
    assert "orl" not in c  # nothing of orl's own: no pathway
    again = load_pretrained(str(tmp_path / "again"))
    assert again.config == ours.config
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), ours.state_dict().values()))


def test_published_router_matches_the_reference(published):
    d, state = published
    ours = load_pretrained(d).eval()
    cfg = ours.config
    assert (cfg.router_score, cfg.router_bias, cfg.router_groups, cfg.router_topk_groups, cfg.router_scaling,
            cfg.router_norm_topk) == ("sigmoid", True, 4, 2, 2.5, True)
    assert torch.equal(ours.model.layers[1].mlp.expert_bias, state["model.layers.1.mlp.gate.expert_bias"])
    ids = torch.randint(0, 96, (2, 20), generator=torch.Generator().manual_seed(1))
    no_bias = {k: torch.zeros_like(v) if k.endswith("expert_bias") else v for k, v in state.items()}
    for mask in (_block_causal(20, 8), torch.ones(20, 20, dtype=torch.bool).tril()):
        ref = R.logits(PUBLISHED, state, ids, mask)
        with torch.no_grad():
            got = ours(ids, torch.arange(20), mask)
        assert (got - ref).abs().max().item() <= TOL, (got - ref).abs().max()
        # each part of the gate matters here: without the bias, or with every group kept, logits move
        assert (R.logits(PUBLISHED, no_bias, ids, mask) - ref).abs().max() > 0.1
        assert (R.logits(dict(PUBLISHED, topk_group=4), state, ids, mask) - ref).abs().max() > 0.1


def test_published_router_round_trip(published, tmp_path):
    d, state = published
    ours = load_pretrained(d)
    save_pretrained(ours, str(tmp_path / "again"))
    back = read_tensors(str(tmp_path / "again"))
    assert set(back) == set(state) and all(torch.equal(back[k], state[k]) for k in state)  # the bias too
    c = json.load(open(tmp_path / "again" / "config.json"))
    assert all(c[k] == v for k, v in PUBLISHED.items())
    again = load_pretrained(str(tmp_path / "again"))
    assert again.config == ours.config
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), ours.state_dict().values()))


def test_absent_router_keys_read_as_the_published_gate(tmp_path):
    """A config without router keys is the published gate: sigmoid, expert bias, 8 groups of which
    4 kept, scale 2.5 (here 8 experts: one per group)."""
    c = {k: v for k, v in PUBLISHED.items() if k not in ("score_function", "n_group", "topk_group",
                                                       "routed_scaling_factor", "moe_router_enable_expert_bias")}
    R.write_checkpoint(str(tmp_path / "p"), c, published_state())
    cfg = load_pretrained(str(tmp_path / "p")).config
    assert (cfg.router_score, cfg.router_bias, cfg.router_groups, cfg.router_topk_groups,
            cfg.router_scaling) == ("sigmoid", True, 8, 4, 2.5)


def test_what_is_still_unsupported_is_refused(tmp_path):
    bad = dict(PUBLISHED, score_function="tanh", n_group=3, use_bias=True)
    R.write_checkpoint(str(tmp_path / "p"), bad, {})
    with pytest.raises(CheckpointError) as e:
        load_pretrained(str(tmp_path / "p"))
    assert all(s in str(e.value) for s in ("score_function 'tanh'", "n_group 3 / topk_group 2 with 8 experts",
                                           "use_bias=True"))
    state = R.random_state(R.TINY, seed=0)
    state["model.layers.1.mlp.gate.expert_bias"][2] = 0.5
    R.write_checkpoint(str(tmp_path / "b"), dict(R.TINY, moe_router_enable_expert_bias=False), state)
    with pytest.raises(CheckpointError, match="expert_bias is not zero but config.json sets "
                                              "moe_router_enable_expert_bias false"):
        load_pretrained(str(tmp_path / "b"))
    del state["model.layers.2.mlp.gate.expert_bias"]
    R.write_checkpoint(str(tmp_path / "m"), R.TINY, state)
    with pytest.raises(CheckpointError, match=r"model.layers.2.mlp.gate.expert_bias is missing"):
        load_pretrained(str(tmp_path / "m"))
    no_diffusion = {k: v for k, v in R.TINY.items() if k not in ("mask_token_id", "block_size")}
    R.write_checkpoint(str(tmp_path / "n"), no_diffusion, R.random_state(R.TINY, seed=0))
    with pytest.raises(CheckpointError, match="no 'mask_token_id' and no 'block_size'"):
        load_pretrained(str(tmp_path / "n"))
    m = load_pretrained(str(tmp_path / "n"), mask_token_id=95, block_size=32)
    assert (m.config.mask_token_id, m.config.block_size) == (95, 32)
