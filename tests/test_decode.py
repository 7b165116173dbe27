"""The reference decoder: cached == uncached under greedy for every family's rule; TPF accounting;
trace contents; residual feedback actually reaches the model."""
import pytest
import torch

from orl.decode import DecodeConfig, decode
from orl.model import build_model, get_config

CASES = [("sdar", "threshold"), ("sdar", "topk"), ("sdar", "entropy"), ("llada", "llada"), ("dgemma", "dgemma")]


def _model(family, **kw):
    m = build_model(get_config(family, "tiny", **kw), seed=1).eval()
    if m.residual_pathway is not None:  # make the pathway matter
        torch.nn.init.normal_(m.residual_pathway.mlp.down_proj.weight, std=0.2)
    return m


@pytest.mark.parametrize("family,rule", CASES)
def test_cached_equals_uncached_greedy(family, rule):
    model = _model(family)
    K = model.config.block_size
    prompt = torch.randint(5, 60, (2, 7))
    outs = []
    for use_cache in (True, False):
        cfg = DecodeConfig(rule=rule, block_size=K, max_new_tokens=3 * K, threshold=0.05, edit_threshold=0.2,
                           entropy_bound=0.9, temperature=0.0, use_cache=use_cache, max_post_steps=3)
        g = torch.Generator().manual_seed(0)
        outs.append(decode(model, prompt, cfg, eos_ids=(), trace=True, generator=g))
    a, b = outs
    assert a.tokens == b.tokens
    assert a.steps_per_block == b.steps_per_block
    for ra, rb in zip(a.trace, b.trace):
        assert torch.equal(ra.canvas, rb.canvas)
        assert torch.allclose(ra.entropy, rb.entropy, atol=1e-5)


def test_tpf_accounting_and_trace():
    model = _model("sdar")
    K = model.config.block_size
    cfg = DecodeConfig(rule="threshold", block_size=K, max_new_tokens=2 * K, threshold=0.9)
    out = decode(model, torch.randint(5, 60, (1, 5)), cfg, trace=True)
    n = len(out.tokens[0])
    steps = sum(out.steps_per_block[0])
    assert n == 2 * K
    assert out.tpf(commit=False) == pytest.approx(n / steps)
    assert out.tpf(commit=True) == pytest.approx(n / (steps + 2))
    # each block's records resolve every position exactly once
    for b in range(2):
        recs = [r for r in out.trace if r.block == b]
        total = torch.stack([r.committed[0] for r in recs]).sum(0)
        assert torch.equal(total, torch.ones(K, dtype=total.dtype))
        assert recs[0].residual is None  # zero residual at a block's first step
        assert all(r.residual is not None for r in recs[1:])


def test_eos_stops_and_counts():
    model = _model("sdar")
    K = model.config.block_size
    cfg = DecodeConfig(rule="threshold", block_size=K, max_new_tokens=4 * K)
    probe = decode(model, torch.tensor([[7, 8, 9]]), cfg)
    eos = probe.tokens[0][K + 2]  # a token produced in the second block
    out = decode(model, torch.tensor([[7, 8, 9]]), cfg, eos_ids=[eos])
    assert out.finish_reason == ["stop"]
    assert out.tokens[0][-1] == eos and eos not in out.tokens[0][:-1]
    assert len(out.steps_per_block[0]) <= 2


def test_residual_changes_decoding():
    model = _model("sdar")
    K = model.config.block_size
    prompt = torch.randint(5, 60, (1, 6))
    kw = dict(rule="topk", block_size=K, max_new_tokens=K, steps=K // 2)
    on = decode(model, prompt, DecodeConfig(residual=True, **kw), trace=True, trace_logits=True)
    off = decode(model, prompt, DecodeConfig(residual=False, **kw), trace=True, trace_logits=True)
    assert not torch.allclose(on.trace[1].logits, off.trace[1].logits)


def test_prompt_too_long_is_refused():
    model = _model("sdar")
    with pytest.raises(ValueError, match="exceeds the model context"):
        decode(model, torch.zeros(1, 500, dtype=torch.long), DecodeConfig(block_size=8, max_new_tokens=64))
