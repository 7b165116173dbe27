"""The DiffusionGemma runtime in eager mode (CPU, float32) against the model and the reference decoder.

  * forward: the engine's logits equal the model's in encoder mode (prompt and a committed canvas,
    causal, longer than the sliding window) and canvas mode (with a self-conditioning input), also
    with the commit folded into the canvas's forward; the cached keys equal the model's.
  * decode: `orl.decode.decode` driven by the runtime's counter RNG (``rng=CounterRNG(seed)``)
    and `Runtime.decode` with the same seed give the same canvases, tokens and rounds -- sampled
    and greedy, with early stopping, re-noising, EOS, with and without fold_commit.
  * the device sampler's pieces: temperature bit for bit, the counter RNG, a finished round is a no-op.
  * the fused sampler (`orl.kernels.canvas`, Triton interpreter, float32): per position the
    argmax, the inverse-CDF token, the entropy (1e-5) and the self-conditioning probabilities (1e-6)
    of `canvas_round`'s torch ops, over several vocab sizes, block splits, temperatures, greedy and
    sampled, near-ties, -inf logits and exact CDF boundaries; `canvas_round_fused`'s canvas, history
    and stop equal `canvas_round`'s; and a whole decode with ``sampler="triton"`` equals the reference.
"""
import math

import pytest
import torch

from orl.decode import DecodeConfig, decode
from orl.decode import samplers as Smp
from orl.kernels import canvas as DK
from orl.decode import rng as DS
from orl.decode.rng import CounterRNG
from orl.engine import rules as DR
from orl.engine.forward import StaticKV, bake, embed, forward
from orl.engine.rules import CanvasRule
from orl.engine.runtime import Runtime
from orl.model import build_model, get_config
from orl.model.masks import commit_layout, decode_layout, step_mask


def _model(seed=0, **kw):
    """dgemma/tiny with weights of tests/dg_reference.py's scales (logit std ~2.5, every branch and
    the self-conditioning pathway non-zero, distinct encoder/canvas layer scalars)."""
    m = build_model(get_config("dgemma", "tiny", **kw), seed=seed).eval()
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("embed_tokens.weight"):
                new = torch.randn(p.shape, generator=g) * 0.3
            elif name.endswith(("q_norm.weight", "k_norm.weight")):
                new = 0.4 + 0.4 * torch.rand(p.shape, generator=g)
            elif p.ndim == 1:  # other norms, router scale, per-expert scale
                new = 0.5 + torch.rand(p.shape, generator=g)
            elif name.endswith("moe.gate.weight"):
                new = torch.randn(p.shape, generator=g) * 2.0
            else:  # (out, in) matrices and stacked experts (E, out, in)
                new = torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1])
            p.copy_(new)
        for layer in m.model.layers:
            layer.layer_scalar.copy_(0.5 + torch.rand(1, generator=g))
            layer.canvas_layer_scalar.copy_(0.5 + torch.rand(1, generator=g))
    return m


@pytest.fixture(scope="module")
def model():
    return _model()


def _ids(n, seed, V=256):
    return torch.randint(0, V, (1, n), generator=torch.Generator().manual_seed(seed))


def test_forward_matches_model(model):
    """Encoder logits over a prompt longer than the window and a committed canvas, then canvas logits
    with a self-conditioning input; the engine folds the commit into the canvas forward."""
    cfg, K, P = model.config, model.config.block_size, 12
    assert P > cfg.sliding_window
    prompt, block, canvas = _ids(P, 1), _ids(K, 2), _ids(K, 3)
    z = model.soft_embed(torch.softmax(torch.randn(1, K, cfg.vocab_size, generator=torch.Generator().manual_seed(4))
                                       * 3, -1))
    ones = torch.ones(1, K, dtype=torch.bool)
    cache = model.new_cache(1, P + 2 * K)
    lay = commit_layout(P, 0, K, "causal")
    ref_p = model(prompt, lay.positions, lay.mask(), cache=cache, store_kv=True)
    lay = commit_layout(P, K, K, "causal")
    ref_b = model(block, lay.positions[P:], step_mask(lay, P), cache=cache, store_kv=True)
    lay = decode_layout(P, K, K, K, "causal")
    ref_c = model(canvas, lay.positions[P + K:], step_mask(lay, P + K), residual=z, residual_where=ones, cache=cache)

    w, kv = bake(model, max_len=64), StaticKV(cfg, 64, torch.float32, "cpu")
    start = torch.zeros(1, dtype=torch.long)
    lim = torch.arange(1, P + 1)
    got_p = forward(w, embed(w, prompt), start, lim, kv, 64, canvas_rows=torch.zeros(1, P, dtype=torch.bool), anc=lim - 1)
    torch.testing.assert_close(got_p, ref_p, rtol=1e-4, atol=1e-4)
    # folded: [committed canvas (encoder rows) | canvas (decoder rows)] in one forward
    start += P
    blk = torch.arange(1, K + 1)
    lim, anc = torch.cat([blk, torch.full((K,), 2 * K)]), torch.cat([blk - 1, torch.full((K,), K)])
    rows = torch.cat([torch.zeros(1, K, dtype=torch.bool), ones], 1)
    h = embed(w, torch.cat([block, canvas], 1), torch.cat([torch.zeros_like(z), z], 1), rows)
    got = forward(w, h, start, lim, kv, 64, canvas_rows=rows, anc=anc)
    torch.testing.assert_close(got[:, :K], ref_b, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got[:, K:], ref_c, rtol=1e-4, atol=1e-4)
    for i in range(cfg.num_layers):
        torch.testing.assert_close(kv.k[i][:, :, :P + K], cache.k[i][:, :, :P + K], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(kv.v[i][:, :, :P + K], cache.v[i][:, :, :P + K], rtol=1e-5, atol=1e-5)
    # the same canvas over the cache alone (not folded)
    start += K
    got_c = forward(w, embed(w, canvas, z, ones), start, torch.full((K,), K), kv, 64, canvas_rows=ones,
                    anc=torch.zeros(K, dtype=torch.long))
    torch.testing.assert_close(got_c, ref_c, rtol=1e-4, atol=1e-4)


CASES = {  # name: (prompt length, DecodeConfig fields, fold_commit, eos probe)
    "sampled, schedule": (12, dict(steps=6, max_new_tokens=48), True, False),
    "sampled, not folded": (12, dict(steps=6, max_new_tokens=32), False, False),
    "sampled, wide bound, stability 2": (20, dict(steps=5, entropy_bound=2.0, stability_threshold=2), True, False),
    "low temperature: early stop": (9, dict(steps=12, t_min=0.01, t_max=0.02, max_new_tokens=48), True, False),
    "greedy, stability 0": (12, dict(steps=5, temperature=0.0, stability_threshold=0), True, False),
    "no self-conditioning": (12, dict(steps=6, residual=False), True, False),
    "eos ends decoding": (12, dict(steps=4, t_min=0.05, t_max=0.1, max_new_tokens=64), True, True),
}


def _cfg(**kw):
    base = dict(rule="dgemma", block_size=16, max_new_tokens=32, entropy_bound=0.1, temperature=0.8, t_min=0.4,
                t_max=0.8, stability_threshold=1, confidence_threshold=0.005)
    return DecodeConfig(**{**base, **kw})


def _reference(model, prompt, cfg, seed, eos=()):
    return decode(model, prompt, cfg, eos_ids=eos, rng=CounterRNG(seed))


@pytest.mark.parametrize("name", list(CASES))
def test_decode_matches_reference(model, name):
    P, kw, fold, probe = CASES[name]
    cfg, prompt, seed = _cfg(**kw), _ids(P, 7), 11
    eos = ()
    if probe:  # a token of the second canvas becomes the EOS
        eos = (_reference(model, prompt, cfg, seed).block_tokens[0][16 + 3],)
    ref = _reference(model, prompt, cfg, seed, eos)
    rt = Runtime(model, 16, mode="eager", max_len=160, fold_commit=fold, bucket=32)
    assert isinstance(rt.rule, CanvasRule)
    out = rt.decode(prompt, cfg, eos_ids=eos, seed=seed)
    assert len(set(ref.tokens[0])) >= 4, "degenerate test model"
    assert out.block_tokens == ref.block_tokens
    assert out.tokens == ref.tokens
    assert out.steps_per_block == ref.steps_per_block
    assert out.finish_reason == ref.finish_reason
    if name == "low temperature: early stop":
        assert max(ref.steps_per_block[0]) < cfg.max_steps
    elif name == "eos ends decoding":
        assert ref.finish_reason == ["stop"] and len(ref.steps_per_block[0]) == 2
    elif not name.startswith("greedy"):
        assert all(s == cfg.max_steps for s in ref.steps_per_block[0])  # the sampler ran every round
    # the same request again on the same runtime, and another seed gives other tokens
    assert rt.decode(prompt, cfg, eos_ids=eos, seed=seed).tokens == out.tokens
    if not name.startswith("low"):
        assert rt.decode(prompt, cfg, eos_ids=eos, seed=seed + 1).block_tokens != out.block_tokens


def test_temperature_is_the_reference_bitwise():
    for N, lo, hi in ((48, 0.4, 0.8), (7, 0.01, 0.02), (5, 0.3, 1.7)):
        f = lambda v: torch.tensor([v], dtype=torch.float32)  # noqa: E731
        for step in range(N):
            got = DR.temperature(torch.tensor([step]), torch.tensor([N]), f(lo), f(hi - lo))
            assert torch.equal(got[0], Smp.dgemma_temperature(N - step, N, lo, hi)), (N, step)


def test_counter_rng():
    seed = torch.tensor([5])
    a = DS.counter_bits(seed, torch.tensor([3]), 1, 4096)
    assert torch.equal(a, DS.counter_bits(seed, torch.tensor([3]), 1, 4096))  # a pure function
    for other in (DS.counter_bits(seed, torch.tensor([4]), 1, 4096), DS.counter_bits(seed, torch.tensor([3]), 2, 4096),
                  DS.counter_bits(torch.tensor([6]), torch.tensor([3]), 1, 4096)):
        assert (a == other).float().mean() < 0.01
    assert int(a.min()) >= 0 and int(a.max()) < 1 << 32
    u = DS.uniform(seed, torch.tensor([9]), 1, 1 << 16)
    assert 0 <= float(u.min()) and float(u.max()) < 1 and abs(float(u.mean()) - 0.5) < 0.01
    r = DS.randint(seed, torch.tensor([9]), 2, 1 << 16, 256)
    counts = torch.bincount(r, minlength=256).float()
    assert int(r.max()) < 256 and counts.min() > 0.6 * counts.mean()
    bits = (a[:, None] >> torch.arange(32)) & 1  # every bit fair
    assert ((bits.float().mean(0) - 0.5).abs() < 0.04).all()
    probs = torch.tensor([[0.0, 0.25, 0.0, 0.75]])
    assert DS.sample_inverse_cdf(probs, torch.tensor([0.1])).tolist() == [1]
    assert DS.sample_inverse_cdf(probs, torch.tensor([0.3])).tolist() == [3]


def test_finished_round_is_a_noop(model):
    rt = Runtime(model, 16, mode="eager", max_len=64)
    cfg = _cfg(steps=3)
    rt.set_request(cfg, seed=1)
    rt.prefill(_ids(10, 1))
    rt.generate_block()
    state = [t.clone() for t in (rt.canvas, rt.rule.hist, rt.step, rt.rule.counter, rt.flag)]
    assert not bool(rt.flag)
    rt._round(rt._slots(rt.length + 2 * rt.K))
    assert all(torch.equal(a, b) for a, b in zip(state, (rt.canvas, rt.rule.hist, rt.step, rt.rule.counter, rt.flag)))


def test_refusals(model):
    rt = Runtime(model, 16, mode="eager", max_len=64)
    with pytest.raises(NotImplementedError, match="dgemma"):
        rt.decode(_ids(3, 1), DecodeConfig(rule="threshold", block_size=16, max_new_tokens=16))
    with pytest.raises(ValueError, match="canvas length"):
        rt.decode(_ids(3, 1), _cfg(block_size=8))
    with pytest.raises(ValueError, match="max_len"):
        rt.decode(_ids(3, 1), _cfg(max_new_tokens=64))


# ------------------------------------------------------------------------------ fused sampler
def _hard_rows(K, V, seed):
    """(1, K, V) float32 logits, std ~3, with the rows that stress the rules: an exact tie of the max
    (first index wins), maxima one ulp apart (a tie after / T), a peaked row (low entropy), a flat
    row, the max at the first / last index, -inf logits and a whole block of them."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, K, V, generator=g) * 3
    r = x[0]
    r[0, 5] = r[0, V - 3] = r[0].max() + 1
    r[1, 7] = r[1].max() + 1
    r[1, 2] = torch.nextafter(r[1, 7], torch.tensor(-1e9))
    r[2, V // 2] = 40.0
    r[3] = 0.5
    r[4, 0] = r[4].max() + 0.5
    r[5, V - 1] = r[5].max() + 0.5
    r[6, 3:9] = float("-inf")
    r[7, 16:32] = float("-inf")
    return x


def _torch_rows(x, T, u, dtype=torch.float32):
    lg = x.float() / T
    tok = lg.argmax(-1) if u is None else DS.sample_inverse_cdf(torch.softmax(lg, -1), u)
    return lg.argmax(-1), tok, Smp.dgemma_entropy(lg), Smp.dgemma_selfcond_probs(lg, dtype)


def _assert_same_accept(ent, r_ent, bound, tol=1e-4):
    """The same accepted positions, except between positions whose entropies tie to within the
    float32 error (rows 0 and 1 of `_hard_rows` are both ln 2 at a low temperature: the order of an
    exact tie decides, and torch's values carry ~1e-5 of rounding)."""
    a, b = Smp.dgemma_accept(ent, bound)[0], Smp.dgemma_accept(r_ent, bound)[0]
    diff = (a != b).nonzero().flatten().tolist()
    assert int(a.sum()) == int(b.sum())
    for i in diff:
        assert any(j != i and abs(float(r_ent[0, i] - r_ent[0, j])) < tol for j in diff), (i, r_ent)


# The fused-sampler tests below run the kernel on CPU tensors in Triton's interpreter; on a CUDA
# machine the fused path is exercised by tests/test_engine_gpu.py (the runtime's default there).
interpreter_only = pytest.mark.skipif(torch.cuda.is_available(),
                                      reason="CPU-interpreter test; CUDA covers the fused sampler in test_engine_gpu.py")


@interpreter_only
# the smallest shapes that cover each path of the kernel: several vocab blocks per row (64/16), one block
# (64), a non-power-of-two vocab padded inside one block (100) and split with a one-column last block (257/64,
# 5 blocks padded to 8); K = 8 rows: the hard rows of `_hard_rows` (more rows add programs, not paths)
@pytest.mark.parametrize("V,K,block", [(64, 8, 16), (64, 8, None), (100, 8, None), (257, 8, 64)])
@pytest.mark.parametrize("greedy", [False, True])
def test_fused_rows_match_torch(V, K, block, greedy):
    x = _hard_rows(K, V, V + K)
    seed, f = torch.tensor([3]), lambda v: torch.tensor([v], dtype=torch.float32)  # noqa: E731
    for step, N, lo, hi in ((0, 6, 0.4, 0.8), (5, 6, 0.4, 0.8), (2, 7, 0.01, 0.02), (0, 3, 1.0, 2.5)):
        T = DR.temperature(torch.tensor([step]), torch.tensor([N]), f(lo), f(hi - lo))
        for counter in range(1 if greedy else 3):  # greedy draws no u: one pass is the whole case
            u = None if greedy else DS.uniform(seed, torch.tensor([counter]), DS.STREAM_SAMPLE, K).view(1, K)
            arg, tok, ent, probs = DK.round_rows(x, T, u, torch.float32, block=block)
            r_arg, r_tok, r_ent, r_probs = _torch_rows(x, T, u)
            assert torch.equal(arg, r_arg) and torch.equal(tok, r_tok), (step, counter)
            # the entropy: within 1e-5 of torch's, beyond that only by torch's own float32 error (at low
            # temperatures |lg| ~ 1e3 and torch's lg - logsumexp(lg) loses ~1e-5; the kernel works
            # relative to the max); within 2e-6 of float64
            e64 = Smp.dgemma_entropy(x.double() / T.double())
            assert ((ent - r_ent).abs() <= 1e-5 + (r_ent - e64).abs()).all()
            torch.testing.assert_close(ent, e64.float(), rtol=0, atol=2e-6)
            torch.testing.assert_close(probs, r_probs, rtol=0, atol=1e-6)
            for bound in (0.1, 2.0, 8.0):
                _assert_same_accept(ent, r_ent, f(bound))
            if counter == 0:  # without the probabilities (pass 2 off; the rest is the same code for every u)
                a2, t2, e2, p2 = DK.round_rows(x, T, u, block=block)
                assert p2 is None and torch.equal(a2, arg) and torch.equal(t2, tok) and torch.equal(e2, ent)
    assert int(arg[0, 0]) == 5 and int(arg[0, 1]) in (2, 7) and int(arg[0, 4]) == 0 and int(arg[0, 5]) == V - 1


@interpreter_only
def test_fused_rows_cdf_boundaries():
    """Where float rounding cannot differ (probabilities 1/4 exactly): the first index whose
    cumulative probability EXCEEDS u * total; u = 1 gives V - 1 (torch's clamp), u = 0 the first
    index of non-zero probability; also across blocks."""
    V = 96
    x = torch.full((1, 5, V), -200.0)  # exp(-200 - max) is 0 in float32
    x[..., [10, 40, 41, 70]] = 1.0
    u = torch.tensor([[0.5, 1.0, 0.0, 0.25, 0.75]])
    want = [41, V - 1, 10, 40, 70]
    for block in (16, 32, None):
        _, tok, _, _ = DK.round_rows(x, torch.tensor([1.0]), u, block=block)
        assert tok[0].tolist() == want == DS.sample_inverse_cdf(torch.softmax(x, -1), u)[0].tolist()


@interpreter_only
def test_fused_rows_rounded_probs():
    """The self-conditioning distribution over logits rounded to a half dtype (fp16 here: bf16 is
    unreliable in the interpreter), written in that dtype."""
    x, T = _hard_rows(8, 300, 1), torch.tensor([0.6])
    lg = x / T
    _, _, _, p = DK.round_rows(x, T, None, torch.float16, block=64)
    assert p.dtype == torch.float16
    torch.testing.assert_close(p.float(), Smp.dgemma_selfcond_probs(lg, torch.float16), rtol=1e-3, atol=1e-6)
    _, _, _, p = DK.round_rows(x, T, None, torch.float32, torch.float16, block=64)
    torch.testing.assert_close(p, Smp.dgemma_selfcond_probs(lg, torch.float16), rtol=0, atol=1e-6)


@interpreter_only
@pytest.mark.parametrize("greedy", [False, True])
def test_fused_round_matches_torch(greedy):
    K, V = 16, 500
    f = lambda v: torch.tensor([v], dtype=torch.float32)  # noqa: E731
    i = lambda v: torch.tensor([v])  # noqa: E731
    rounds = ((0, 6, 0.4, 0.8, 0.1, 0.005, 1), (3, 6, 0.4, 0.8, 2.0, 5.0, 2), (5, 6, 0.4, 0.8, 0.5, 5.0, 0),
              (1, 9, 0.01, 0.02, 1.0, 3.0, 1))  # step, N, t_min, t_max, bound, conf, stability window
    for n, (step, N, lo, hi, bound, conf, s) in enumerate(rounds):
        x = _hard_rows(K, V, 50 + n)
        x[0, 8:] = x[0, 8:] * 0.1  # some flatter rows
        x[0, 0, 5] += 1  # no exact tie of two rows' entropies (ln 2 at a low temperature)
        hist = torch.full((s, 1, K), -1)
        if s:
            hist[-1] = (x / DR.temperature(i(step), i(N), f(lo), f(hi - lo))).argmax(-1)  # stable when s = 1
        args = (x, hist, i(step), i(N), f(lo), f(hi - lo), f(bound), f(conf), i(9), i(n), greedy)
        lg, canvas, new_hist, fin, take, ent = DR.canvas_round(*args)
        probs, canvas2, new_hist2, fin2, take2, ent2 = DR.canvas_round_fused(*args, probs_dtype=torch.float32)
        assert torch.equal(canvas2, canvas) and torch.equal(new_hist2, new_hist) and torch.equal(fin2, fin), n
        assert torch.equal(take2, take)
        torch.testing.assert_close(ent2, ent, rtol=0, atol=5e-5)  # nats; low temperatures: 1.4e-5 seen
        torch.testing.assert_close(probs, Smp.dgemma_selfcond_probs(lg, torch.float32), rtol=0, atol=1e-6)
        assert DR.canvas_round_fused(*args)[0] is None


@interpreter_only
@pytest.mark.parametrize("name", ["sampled, not folded", "low temperature: early stop", "no self-conditioning"])
def test_decode_fused_sampler_matches_reference(model, name, monkeypatch):
    monkeypatch.setattr(DK, "BLOCK", 128)  # vocab 256: two blocks a row (1, 4, 5 blocks: test_fused_rows_match_torch)
    P, kw, fold, _ = CASES[name]
    cfg, prompt, seed = _cfg(**kw), _ids(P, 7), 11
    ref = _reference(model, prompt, cfg, seed)
    rt = Runtime(model, 16, mode="eager", max_len=160, fold_commit=fold, bucket=32, sampler="triton")
    assert rt.sampler == "triton"
    out = rt.decode(prompt, cfg, seed=seed)
    assert out.block_tokens == ref.block_tokens
    assert out.tokens == ref.tokens
    assert out.steps_per_block == ref.steps_per_block
    assert out.finish_reason == ref.finish_reason


def test_sampler_choice(model, monkeypatch):
    assert Runtime(model, 16, mode="eager", max_len=64).sampler == "torch"  # the CPU default
    with pytest.raises(ValueError, match="sampler"):
        Runtime(model, 16, mode="eager", max_len=64, sampler="cuda")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="CUDA"):
        Runtime(model, 16, mode="eager", max_len=64, sampler="triton")
