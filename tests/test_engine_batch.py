"""The runtime with B rows (eager, CPU) against the reference decoder on the same rows.

Every family's rule -- SDAR threshold / top-k and LLaDA threshold + editing on float64 models with
peaked logits (so no decision sits on a rounding tie), DiffusionGemma's canvas on the float32 model of
tests/test_engine_dgemma.py -- greedy and sampled: the runtime's tokens, rounds per block, finish
reasons and committed blocks equal `orl.decode.decode`'s given the same counter stream
(``rng=CounterRNG(seed)``). Also: rows of one shared prompt (prefilled once) sample different
rollouts; a row decodes the same alone as in a batch (its stream depends on its seed only); an EOS
ends one row while the others go on.
"""
import pytest
import torch

from orl.decode import DecodeConfig, decode
from orl.decode.rng import CounterRNG
from orl.engine.runtime import Runtime
from orl.model import build_model, get_config

FAMILIES = [("sdar", "threshold"), ("sdar", "topk"), ("llada", "llada"), ("dgemma", "dgemma")]


def _model(family):
    if family == "dgemma":
        from test_engine_dgemma import _model as dg_model  # noqa: PLC0415
        return dg_model().double()  # float64: the canvas rule re-judges every position, so float32 noise compounds
    m = build_model(get_config(family, "tiny", tie_embeddings=False), seed=1).double().eval()
    g = torch.Generator().manual_seed(101)
    with torch.no_grad():
        m.lm_head.weight.copy_(torch.randn(m.lm_head.weight.shape, generator=g, dtype=torch.float64) * 0.5)
        if m.residual_pathway is not None:
            m.residual_pathway.mlp.down_proj.weight.normal_(0, 0.2, generator=g)
    return m


def _cfg(rule, K, sampled, **kw):
    if rule == "dgemma":
        from test_engine_dgemma import _cfg as dg_cfg  # noqa: PLC0415
        return dg_cfg(**({} if sampled else {"temperature": 0.0}), **kw)
    base = dict(rule=rule, block_size=K, max_new_tokens=3 * K, threshold=0.5, edit_threshold=0.5,
                max_post_steps=3, temperature=0.8 if sampled else 0.0)
    return DecodeConfig(**{**base, **kw})


def _prompts(B, P, V, seed=3):
    return torch.randint(5, min(V, 60), (B, P), generator=torch.Generator().manual_seed(seed))


def _same(a, b):
    assert a.tokens == b.tokens
    assert a.steps_per_block == b.steps_per_block
    assert a.finish_reason == b.finish_reason
    assert a.block_tokens == b.block_tokens


@pytest.mark.parametrize("sampled", [False, True])
@pytest.mark.parametrize("family,rule", FAMILIES)
def test_batch_equals_reference(family, rule, sampled):
    """B = 3 prompts of equal length, one launch per block for all rows."""
    model = _model(family)
    K = model.config.block_size
    cfg = _cfg(rule, K, sampled)
    prompts = _prompts(3, 7, model.config.vocab_size)
    ref = decode(model, prompts, cfg, rng=CounterRNG(11))
    rt = Runtime(model, K, mode="eager", max_len=160, bucket=32, batch=3)
    out = rt.decode(prompts, cfg, seed=11)
    _same(out, ref)
    toks = [t for row in out.tokens for t in row]
    assert len(set(toks)) >= 4, "degenerate test model"
    assert len({tuple(t) for t in out.tokens}) == 3  # three different rows


@pytest.mark.parametrize("family,rule", FAMILIES)
def test_group_of_one_prompt_samples_different_rollouts(family, rule):
    """G = 4 rollouts of one prompt (prefilled once, its cache copied to every row), sampled."""
    model = _model(family)
    K = model.config.block_size
    cfg = _cfg(rule, K, True)
    prompt = _prompts(1, 6, model.config.vocab_size, seed=4)
    ref = decode(model, prompt.expand(4, -1), cfg, rng=CounterRNG(5))
    rt = Runtime(model, K, mode="eager", max_len=160, bucket=32, batch=4)
    out = rt.decode(prompt, cfg, seed=5)
    _same(out, ref)
    assert len({tuple(t) for t in out.tokens}) >= 3, "the rows' streams should differ"
    # each row alone, with its own seed (5 + r), decodes what it decoded in the batch
    one = Runtime(model, K, mode="eager", max_len=160, bucket=32)
    for r in (0, 3):
        alone = one.decode(prompt, cfg, seed=5 + r)
        assert alone.tokens[0] == out.tokens[r] and alone.steps_per_block[0] == out.steps_per_block[r]


@pytest.mark.parametrize("family,rule", [("sdar", "threshold"), ("llada", "llada"), ("dgemma", "dgemma")])
def test_eos_ends_one_row_the_others_go_on(family, rule):
    model = _model(family)
    K = model.config.block_size
    cfg = _cfg(rule, K, True, max_new_tokens=4 * K)
    prompts = _prompts(3, 7, model.config.vocab_size, seed=8)
    probe = decode(model, prompts, cfg, rng=CounterRNG(2))
    eos = probe.block_tokens[0][K + 2]  # a token row 0 commits in its second block
    ref = decode(model, prompts, cfg, eos_ids=[eos], rng=CounterRNG(2))
    rt = Runtime(model, K, mode="eager", max_len=192, bucket=32, batch=3)
    out = rt.decode(prompts, cfg, eos_ids=[eos], seed=2)
    _same(out, ref)
    assert out.finish_reason[0] == "stop" and len(out.steps_per_block[0]) <= 2
    assert max(len(s) for s in out.steps_per_block) > len(out.steps_per_block[0])  # another row went on


def test_batch_refusals():
    model = _model("sdar")
    K = model.config.block_size
    rt = Runtime(model, K, mode="eager", max_len=64, batch=2)
    with pytest.raises(ValueError, match="rows"):
        rt.decode(_prompts(3, 5, 256), _cfg("threshold", K, False))
    with pytest.raises(ValueError, match="seeds for 2 rows"):
        rt.decode(_prompts(2, 5, 256), _cfg("threshold", K, True), seed=[1, 2, 3])
    with pytest.raises(ValueError, match="launch_block"):
        rt.generate_block()
    with pytest.raises(ValueError, match="batch"):
        Runtime(model, K, mode="eager", batch=0)
