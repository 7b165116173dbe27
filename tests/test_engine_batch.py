"""The runtime with B rows (eager, CPU) against the reference decoder on the same rows.

Every family's rule -- SDAR threshold / top-k and LLaDA threshold + editing on float64 models with
peaked logits (so no decision sits on a rounding tie), DiffusionGemma's canvas on the float32 model of
tests/test_engine_dgemma.py -- greedy and sampled: the runtime's tokens, rounds per block, finish
reasons and committed blocks equal `orl.decode.decode`'s given the same counter stream
(``rng=CounterRNG(seed)``). Also: rows of one shared prompt (prefilled once) sample different
rollouts; a row decodes the same alone as in a batch (its stream depends on its seed only); an EOS
ends one row while the others go on.
"""
import dataclasses
import os

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
    cfg = _cfg(rule, K, True, max_new_tokens=3 * K)  # row 0 stops in block 2 of 3, the others go on
    prompts = _prompts(3, 7, model.config.vocab_size, seed=8)
    probe = decode(model, prompts, dataclasses.replace(cfg, max_new_tokens=2 * K), rng=CounterRNG(2))
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


# ------------------------------------------------------------------------------ capture
@pytest.mark.parametrize("rule,sampled", [("threshold", True), ("topk", False), ("llada", True), ("dgemma", True)])
def test_capture_equals_the_reference_trace(rule, sampled):
    """Every step the runtime's graphs captured (canvas, unresolved set -- for DiffusionGemma the
    re-noised positions --, the residual z consumed, where, entropy, committed positions, active
    rows, top-k log-probs) equals the reference decoder's trace on the same stream (float64: to 1e-12)."""
    family = {"llada": "llada", "dgemma": "dgemma"}.get(rule, "sdar")
    model = _model(family)
    K, k = model.config.block_size, 5
    kw = {} if rule == "dgemma" else dict(threshold=0.95, temperature=1.5 if sampled else 0.0)  # several steps a block
    cfg = _cfg(rule, K, sampled, **kw)
    prompt = _prompts(1, 6, model.config.vocab_size, seed=9)
    ref = decode(model, prompt.expand(3, -1), cfg, rng=CounterRNG(21), trace=True, trace_logits=True)
    rt = Runtime(model, K, mode="eager", max_len=160, bucket=32, batch=3)
    out = rt.decode(prompt, cfg, seed=21, capture_topk=k)
    _same(out, ref)
    assert len(out.trace) == len(ref.trace) > 6
    assert len({t for row in out.tokens for t in row}) >= 4, "degenerate test model"
    for a, b in zip(out.trace, ref.trace):
        assert (a.block, a.step) == (b.block, b.step)
        for f in ("canvas", "unresolved", "committed", "active", "residual_where"):
            assert torch.equal(getattr(a, f), getattr(b, f)), f
        assert (a.residual is None) == (b.residual is None) and (b.step == 0) == (b.residual is None)
        if a.residual is not None:
            torch.testing.assert_close(a.residual, b.residual, rtol=0, atol=1e-12)
        torch.testing.assert_close(a.entropy, b.entropy.float(), rtol=0, atol=1e-6)
        lp, ids = torch.log_softmax(b.logits.float(), -1).topk(k, -1)
        assert torch.equal(a.topk_ids, ids)
        torch.testing.assert_close(a.topk_logp, lp, rtol=0, atol=1e-6)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="Triton's CPU interpreter is off (a CUDA machine): test_engine_gpu.py runs this on CUDA")
@pytest.mark.parametrize("rule,sampled,temp,threshold", [("threshold", True, 1.0, 0.95), ("llada", True, 1.5, 0.5)])
def test_fused_mask_sampler_equals_the_torch_one(rule, sampled, temp, threshold):
    # fewer interpreter rounds than the CUDA twin (3 rows, threshold 0.95), the same paths: two rows
    # (one program per position, row and round) that end a block at different rounds, so an idle row
    # rides along; LLaDA at threshold 0.5 still takes 5-9 rounds a block (0.95: 11, of them 3 post steps)
    out = fused_vs_torch(rule, sampled, temp, "cpu", "eager", batch=2, threshold=threshold)
    assert any(len(set(s)) > 1 for s in zip(*out.steps_per_block)), "rows should end a block at different rounds"


def fused_vs_torch(rule, sampled, temp, device, mode, batch=3, threshold=0.95):
    """The mask rules' fused logits pass (`sampler="triton"`: `orl.kernels.canvas.round_rows` with
    the logsumexp; Triton's interpreter on CPU) decodes the torch sampler's tokens and rounds, and
    captures the same states: canvases and commits equal at every step; at a block's first step
    (no residual yet: the same logits reach both) entropies and top-k log-probs to float32 rounding
    (1e-5); the z the fused pass feeds back to 1e-4 (it is float32-close, and this peaked model
    amplifies a 1e-6 change of z into 1e-3 of the next logits, so later steps' statistics compare
    the model's sensitivity, not the kernel). T = 1.5 takes the residual's own pass (temperature 1).
    ``batch`` rows of one prompt; returns the fused run's `DecodeOutput`."""
    family = "llada" if rule == "llada" else "sdar"
    model = _model(family).float().to(device)  # the interpreter's kernels run float32
    K, k = model.config.block_size, 5
    cfg = _cfg(rule, K, sampled, threshold=threshold, temperature=temp, max_new_tokens=2 * K)
    prompt = _prompts(1, 6, model.config.vocab_size, seed=9).to(device)
    outs = {}
    for sampler in ("torch", "triton"):
        rt = Runtime(model, K, mode=mode, max_len=160, bucket=32, batch=batch, sampler=sampler)
        assert rt.rule.sampler == sampler
        outs[sampler] = rt.decode(prompt, cfg, seed=21, capture_topk=k)
    a, b = outs["triton"], outs["torch"]
    _same(a, b)
    assert len({t for row in a.tokens for t in row}) >= 4 and len(a.trace) == len(b.trace) > 6
    for x, y in zip(a.trace, b.trace):
        for f in ("canvas", "unresolved", "committed", "active"):
            assert torch.equal(getattr(x, f), getattr(y, f)), f
        assert torch.equal(x.topk_ids, y.topk_ids)
        if x.step == 0:
            torch.testing.assert_close(x.entropy, y.entropy, rtol=0, atol=1e-5)
            torch.testing.assert_close(x.topk_logp, y.topk_logp, rtol=0, atol=1e-5)
        if y.residual is not None:
            torch.testing.assert_close(x.residual, y.residual, rtol=0, atol=1e-4)
    return a


def test_runtime_rollouts_replay_through_the_training_forward():
    """`rollout_group` through the runtime (capture), then packed replay through the model with the
    captured residuals: the rollout's top-k log-probs come back (the ORL replay of docs/method.md 3.4)."""
    import random  # noqa: PLC0415

    from orl.tasks.arith import ArithTask  # noqa: PLC0415
    from orl.tokenizer import build_char_tokenizer  # noqa: PLC0415
    from orl.train.pack import pack, select_states  # noqa: PLC0415
    from orl.train.rollout import rollout_group  # noqa: PLC0415
    tok = build_char_tokenizer()
    cfg = get_config("sdar", "tiny", vocab_size=len(tok), mask_token_id=tok.mask_token_id, block_size=8,
                     tie_embeddings=False)
    model = build_model(cfg, seed=3).double().eval()
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        model.lm_head.weight.copy_(torch.randn(model.lm_head.weight.shape, generator=g, dtype=torch.float64) * 0.4)
        model.residual_pathway.mlp.down_proj.weight.normal_(0, 0.3, generator=g)
    task = ArithTask(terms=2, digits=2)
    dcfg = DecodeConfig(rule="threshold", block_size=8, max_new_tokens=16, temperature=1.0, threshold=0.2)
    rt = Runtime(model, 8, mode="eager", max_len=96, bucket=32, batch=3)
    rolls = rollout_group(model, tok, task, task.sample("train", 0), 3, dcfg, topk=8, runtime=rt, seed=4)
    assert len({tuple(r.response) for r in rolls}) >= 2
    sels = [select_states(r, budget=100, rng=random.Random(0)) for r in rolls]
    assert sum(len(s.states) for s in sels) > 6 and any(s.residual is not None for r in rolls for s in r.states)
    b = pack(sels, 8, model.config.clean_attention, "packed")
    with torch.no_grad():
        lg = b.gather(model(b.tokens, b.positions, b.mask, residual=b.residual, residual_where=b.residual_where))
    replay = torch.log_softmax(lg.float(), -1).gather(-1, b.ref_ids)
    assert (replay - b.ref_logp).abs().max().item() <= 1e-5


def test_orl_loop_through_the_runtime_matches_its_reference_twin(tmp_path, monkeypatch):  # monkeypatch: sys.path
    """The ORL loop with ``rollout_engine="runtime"`` (the CUDA path, here eager on the CPU): rollouts
    through the runtime, weights reloaded in place after each update, training moves the weights.
    A loop on the reference decoder with the same counter streams takes the same rollouts, so the
    two runs end with the same weights (float32: to 1e-5)."""
    import os  # noqa: PLC0415

    from orl.model import save_pretrained  # noqa: PLC0415
    from orl.model.checkpoint import read_state_dict  # noqa: PLC0415
    from orl.model.convert import ensure_pathway  # noqa: PLC0415
    from orl.recipes.orl_arith import orl_arith_smoke  # noqa: PLC0415
    from orl.tokenizer import build_char_tokenizer  # noqa: PLC0415
    from orl.train import loop as L  # noqa: PLC0415
    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(__file__), "fixtures"))
    tok = build_char_tokenizer()
    m = build_model(get_config("sdar", "tiny", vocab_size=len(tok), mask_token_id=tok.mask_token_id, block_size=8,
                               tie_embeddings=False), seed=2)
    ensure_pathway(m)
    with torch.no_grad():
        m.residual_pathway.mlp.down_proj.weight.normal_(0, 0.1, generator=torch.Generator().manual_seed(1))
    save_pretrained(m, str(tmp_path / "start"), tokenizer=tok)
    runs = {}
    for engine in ("runtime", "reference"):
        cfg = orl_arith_smoke(str(tmp_path / "start"), str(tmp_path / engine))
        cfg.task, cfg.task_kwargs, cfg.rollout_engine = "coin_task:make_task", {}, engine
        cfg.decode.block_size, cfg.decode.max_new_tokens, cfg.max_prompt_tokens = 8, 16, 64
        cfg.loss.anchor = "none"
        cfg.rollout_rng = "counter"  # the reference decoder on the runtime's counter streams
        L.train_orl(cfg, resume=False, quiet=True)
        runs[engine] = read_state_dict(str(tmp_path / engine / "final"))
    a, b = runs["runtime"], runs["reference"]
    start = read_state_dict(str(tmp_path / "start"))
    assert any(not torch.equal(a[k], start[k]) for k in a)  # it trained
    assert all(torch.allclose(a[k], b[k], atol=1e-5, rtol=0) for k in a)


def test_two_stage_topk_equals_topk():
    from orl.engine.capture import topk_lastdim  # noqa: PLC0415
    x = torch.randn(3, 5, 64 * 40, generator=torch.Generator().manual_seed(0))
    for k in (1, 16, 40):
        a, b = topk_lastdim(x, k), x.topk(k, -1)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert torch.equal(topk_lastdim(x[..., :100], 7)[1], x[..., :100].topk(7, -1)[1])  # 100 % 64: one stage


def test_top_p_filter_hand_case():
    from orl.decode.samplers import top_p_filter  # noqa: PLC0415
    p = torch.tensor([[0.1, 0.5, 0.15, 0.25]])
    # sorted 0.5, 0.25, 0.15, 0.1: mass before each 0, 0.5, 0.75, 0.9 -> top_p 0.7 keeps {0.5, 0.25}
    torch.testing.assert_close(top_p_filter(p, 0.7), torch.tensor([[0.0, 2 / 3, 0.0, 1 / 3]]))
    torch.testing.assert_close(top_p_filter(p, 0.01), torch.tensor([[0.0, 1.0, 0.0, 0.0]]))  # the top one stays
    torch.testing.assert_close(top_p_filter(p, 1.0), p)
    with pytest.raises(ValueError, match="top_p"):
        DecodeConfig(top_p=0.0)


@pytest.mark.parametrize("family,rule", [("sdar", "threshold"), ("llada", "llada")])
def test_top_p_sampling_equals_reference(family, rule):
    """Nucleus sampling in the runtime's graph (a device top_p, the same filter) draws the reference
    decoder's tokens on the same counter stream; a tight nucleus changes what is sampled."""
    model = _model(family)
    K = model.config.block_size
    prompt = _prompts(1, 6, model.config.vocab_size, seed=6)
    rt = Runtime(model, K, mode="eager", max_len=160, bucket=32, batch=3)
    outs = {}
    for top_p in (1.0, 0.5):
        cfg = _cfg(rule, K, True, temperature=1.5, top_p=top_p)
        ref = decode(model, prompt.expand(3, -1), cfg, rng=CounterRNG(13))
        outs[top_p] = rt.decode(prompt, cfg, seed=13)
        _same(outs[top_p], ref)
    assert outs[0.5].tokens != outs[1.0].tokens


@pytest.mark.parametrize("sampled", [False, True])
@pytest.mark.parametrize("family,rule", [("sdar", "threshold"), ("llada", "llada")])
def test_ragged_prompts_left_padded_equal_each_alone(family, rule, sampled):
    """Prompts of different lengths in one batch (left-padded; positions start after the padding,
    padded slots unseen): each row decodes what its prompt decodes alone, on its own stream."""
    model = _model(family)
    K = model.config.block_size
    cfg = _cfg(rule, K, sampled)
    g = torch.Generator().manual_seed(12)
    prompts = [torch.randint(5, 60, (n,), generator=g).tolist() for n in (4, 9, 6)]
    rt = Runtime(model, K, mode="eager", max_len=160, bucket=32, batch=3)
    out = rt.decode(prompts, cfg, seed=30)
    assert rt._padded
    for r, p in enumerate(prompts):
        alone = decode(model, torch.tensor([p]), cfg, rng=CounterRNG(30 + r))
        assert out.tokens[r] == alone.tokens[0] and out.steps_per_block[r] == alone.steps_per_block[0], r
    assert len({tuple(t) for t in out.tokens}) == 3
    # the same runtime then takes equal-length prompts again (no padding)
    eq = _prompts(3, 7, model.config.vocab_size)
    _same(rt.decode(eq, cfg, seed=11), decode(model, eq, cfg, rng=CounterRNG(11)))
    assert not rt._padded
