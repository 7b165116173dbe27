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


def _peaked(family, seed=1):
    """A tiny model whose greedy outputs mean something: untied embeddings (tied random ones make
    every position predict its own input, the mask token), an LM head scaled so the logits are
    peaked (std ~4), in float64 so the cached and uncached paths agree to ~1e-13."""
    m = build_model(get_config(family, "tiny", tie_embeddings=False), seed=seed).double().eval()
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        m.lm_head.weight.copy_(torch.randn(m.lm_head.weight.shape, generator=g, dtype=torch.float64) * 0.5)
        if m.residual_pathway is not None:  # make the pathway matter
            m.residual_pathway.mlp.down_proj.weight.normal_(0, 0.2, generator=g)
    return m


GAP = 1e-8  # decisions closer than this to a tie would make the comparison depend on rounding


def _no_near_ties(trace, cfg):
    """Every decision of the cached run is far from a tie (``GAP``): among the positions still open
    the confidences and entropies are pairwise distinct, and none sits on the threshold/bound. With
    float64 paths differing by ~1e-13, equality of the two runs is then exact by construction."""
    for r in trace:
        p = torch.softmax(r.logits.double(), -1)
        conf = p.max(-1).values
        ent = -(p * p.clamp_min(1e-300).log()).sum(-1)
        for row in range(conf.shape[0]):
            open_ = r.unresolved[row] if cfg.rule != "dgemma" else torch.ones_like(r.unresolved[row])
            if not bool(r.active[row]) or int(open_.sum()) < 1:
                continue
            for v, edge in ((conf[row][open_], cfg.threshold), (ent[row][open_], None)):
                srt = v.sort().values
                assert bool(((srt[1:] - srt[:-1]) > GAP).all()), "near tie between positions"
                if edge is not None:
                    assert bool(((v - edge).abs() > GAP).all()), "a confidence on the threshold"


@pytest.mark.parametrize("family,rule", CASES)
def test_cached_equals_uncached_greedy(family, rule):
    """Cached and uncached decoding commit the same positions with the same tokens at every step,
    on a model whose outputs are non-degenerate (varied tokens, no mask id), with no decision
    closer than ``GAP`` to a tie."""
    model = _peaked(family)
    K = model.config.block_size
    prompt = torch.randint(5, 60, (2, 7), generator=torch.Generator().manual_seed(3))
    outs = []
    for use_cache in (True, False):
        cfg = DecodeConfig(rule=rule, block_size=K, max_new_tokens=3 * K, threshold=0.5, edit_threshold=0.5,
                           entropy_bound=0.5, temperature=0.0, use_cache=use_cache, max_post_steps=3)
        g = torch.Generator().manual_seed(0)
        outs.append(decode(model, prompt, cfg, eos_ids=(), trace=True, trace_logits=True, generator=g))
    a, b = outs
    toks = [t for row in a.tokens for t in row]
    assert len(set(toks)) >= 4 and model.config.mask_token_id not in toks, "degenerate test model"
    assert sum(len(s) for s in a.steps_per_block) < len(toks), "every block took one step per token"
    _no_near_ties(a.trace, cfg)
    assert len(a.trace) == len(b.trace)
    for ra, rb in zip(a.trace, b.trace):  # step by step: the same state in, the same commits out
        assert (ra.block, ra.step) == (rb.block, rb.step)
        assert torch.equal(ra.canvas, rb.canvas) and torch.equal(ra.unresolved, rb.unresolved)
        assert torch.equal(ra.committed, rb.committed) and torch.equal(ra.active, rb.active)
        assert float((ra.logits - rb.logits).abs().max()) < 1e-9
    assert a.tokens == b.tokens and a.steps_per_block == b.steps_per_block


def test_tpf_accounting_and_trace():
    model = _model("sdar")
    K = model.config.block_size
    cfg = DecodeConfig(rule="threshold", block_size=K, max_new_tokens=2 * K, threshold=0.9)
    out = decode(model, torch.randint(5, 60, (1, 5), generator=torch.Generator().manual_seed(1)), cfg, trace=True)
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
    prompt = torch.randint(5, 60, (1, 6), generator=torch.Generator().manual_seed(2))
    kw = dict(rule="topk", block_size=K, max_new_tokens=K, steps=K // 2)
    on = decode(model, prompt, DecodeConfig(residual=True, **kw), trace=True, trace_logits=True)
    off = decode(model, prompt, DecodeConfig(residual=False, **kw), trace=True, trace_logits=True)
    assert not torch.allclose(on.trace[1].logits, off.trace[1].logits)


def test_prompt_too_long_is_refused():
    model = _model("sdar")
    with pytest.raises(ValueError, match="exceeds the model context"):
        decode(model, torch.zeros(1, 500, dtype=torch.long), DecodeConfig(block_size=8, max_new_tokens=64))
