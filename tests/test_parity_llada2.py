"""Parity with the published LLaDA-2.x architecture (`llada2_moe`): a checkpoint written in its own
names (tests/llada2_reference.py, an independent float64 forward) loads through
``orl.model.load_pretrained`` and gives the reference's logits under block-causal and causal masks;
saving it again writes the same tensors and config; what our router cannot express is refused."""
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


def test_what_the_router_cannot_express_is_refused(tmp_path):
    published = {k: v for k, v in R.TINY.items() if k not in ("score_function", "n_group", "topk_group",
                                                                "routed_scaling_factor")}
    R.write_checkpoint(str(tmp_path / "p"), published, {})  # the published defaults: sigmoid, 8 groups / 4, x2.5
    with pytest.raises(CheckpointError) as e:
        load_pretrained(str(tmp_path / "p"))
    assert all(s in str(e.value) for s in ("'sigmoid'", "routed_scaling_factor 2.5", "top 4 of 8 groups"))
    state = R.random_state(R.TINY, seed=0)
    state["model.layers.1.mlp.gate.expert_bias"][2] = 0.5
    R.write_checkpoint(str(tmp_path / "b"), R.TINY, state)
    with pytest.raises(CheckpointError, match="expert_bias is not zero"):
        load_pretrained(str(tmp_path / "b"))
    no_diffusion = {k: v for k, v in R.TINY.items() if k not in ("mask_token_id", "block_size")}
    R.write_checkpoint(str(tmp_path / "n"), no_diffusion, R.random_state(R.TINY, seed=0))
    with pytest.raises(CheckpointError, match="no 'mask_token_id' and no 'block_size'"):
        load_pretrained(str(tmp_path / "n"))
    m = load_pretrained(str(tmp_path / "n"), mask_token_id=95, block_size=32)
    assert (m.config.mask_token_id, m.config.block_size) == (95, 32)
