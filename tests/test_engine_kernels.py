"""The engine's Triton kernels (`orl.kernels.layers`) against their PyTorch twins: each kernel on
small ragged shapes (split-K, masks, visibility limits, a device-side start), then the whole
forward and the runtime's tokens. Float32 (bf16 arithmetic is broken in Triton's interpreter), on
CPU under ``TRITON_INTERPRET=1`` (set here before Triton loads) or on a GPU when there is one.
Skipped when Triton is not importable."""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

import torch.nn.functional as F  # noqa: E402

from orl.decode import DecodeConfig, decode  # noqa: E402
from orl.kernels import layers as Kn  # noqa: E402
from orl.engine.forward import StaticKV, attention_bias, bake, embed, forward, rms_norm  # noqa: E402
from orl.engine.runtime import Runtime  # noqa: E402
from orl.model import build_model, get_config  # noqa: E402
from orl.model.layers import apply_rope  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = dict(rtol=1e-4, atol=1e-4)


def _model(size="tiny", **kw):
    kw.setdefault("tie_embeddings", False)
    # built on the CPU so the random weights (and so the test's tokens) are the same on every device
    m = build_model(get_config("sdar", size, **kw), seed=1).eval()
    if m.residual_pathway is not None:
        torch.nn.init.normal_(m.residual_pathway.mlp.down_proj.weight, std=0.2, generator=torch.Generator().manual_seed(2))
    return m.to(DEV)


def _ops(size="tiny", **kw):
    return Kn.TritonKernels(bake(_model(size, **kw), max_len=64))


@pytest.mark.parametrize("M,N,K,split,bias", [(5, 40, 70, 1, False), (33, 64, 300, 3, True), (17, 48, 128, 2, False),
                                              (1, 96, 64, 1, True)])
def test_gemm_split_k(M, N, K, split, bias):
    ops = _ops()
    g = torch.Generator(device=DEV).manual_seed(0)
    x, W = torch.randn(M, K, device=DEV, generator=g), torch.randn(N, K, device=DEV, generator=g)
    b = torch.randn(N, device=DEV, generator=g) if bias else None
    y = ops.linear(x, W, b, cfg=Kn.GemmConfig(BM=16, BN=32, BK=32, SPLIT=split))
    assert y.shape == (split, M, N)
    torch.testing.assert_close(y.sum(0), F.linear(x, W, b), **TOL)
    # the heuristic's own tiles, and a strided row view (the LM head reads h[logits_from:])
    xs = torch.randn(M + 3, K, device=DEV, generator=g)[3:]
    torch.testing.assert_close(ops.linear(xs, W).sum(0), F.linear(xs, W), **TOL)


@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_gemm_gated_epilogue(act):
    ops = _ops(hidden_act=act)
    g = torch.Generator(device=DEV).manual_seed(1)
    x, W = torch.randn(19, 72, device=DEV, generator=g), torch.randn(2 * 40, 72, device=DEV, generator=g) / 8
    y = ops.linear(x, W, gated=True, cfg=Kn.GemmConfig(BM=16, BN=16, BK=32))
    gate, up = F.linear(x, W).chunk(2, -1)
    ref = (F.silu(gate) if act == "silu" else F.gelu(gate, approximate="tanh")) * up
    torch.testing.assert_close(y, ref, **TOL)
    # split-K: partials over all 2N rows, the epilogue in its own kernel
    y = ops.linear(x, W, gated=True, cfg=Kn.GemmConfig(BM=16, BN=16, BK=16, SPLIT=3))
    torch.testing.assert_close(y, ref, **TOL)


@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_act_mul_and_cublas_rows(act):
    """The cuBLAS path's one-kernel act(gate) * up equals PyTorch's three ops; on a GPU, from
    ``cublas_min_m`` rows on, `linear` returns F.linear's result (plain) or that product (gated)."""
    ops = _ops(hidden_act=act)
    g = torch.Generator(device=DEV).manual_seed(4)
    y = torch.randn(7, 2 * 1500, device=DEV, generator=g)
    gate, up = y.chunk(2, -1)
    want = (F.silu(gate) if act == "silu" else F.gelu(gate, approximate="tanh")) * up
    torch.testing.assert_close(ops.act_mul(y), want, **TOL)
    if DEV == "cuda":
        ops.cublas_min_m = 4
        x, W = torch.randn(9, 72, device=DEV, generator=g), torch.randn(80, 72, device=DEV, generator=g) / 8
        torch.testing.assert_close(ops.linear(x, W)[0], F.linear(x, W), **TOL)
        gate, up = F.linear(x, W).chunk(2, -1)
        want = (F.silu(gate) if act == "silu" else F.gelu(gate, approximate="tanh")) * up
        torch.testing.assert_close(ops.linear(x, W, gated=True), want, **TOL)


@pytest.mark.parametrize("split", [0, 1, 3])
def test_add_norm(split):
    ops = _ops()
    D = ops.cfg.hidden_size
    g = torch.Generator(device=DEV).manual_seed(2)
    x, w = torch.randn(6, D, device=DEV, generator=g), torch.randn(D, device=DEV, generator=g)
    parts = torch.randn(split, 6, D, device=DEV, generator=g) if split else None
    xo, h = ops.add_norm(x, parts, w)
    x_ref = x if parts is None else x + parts.sum(0)
    torch.testing.assert_close(xo, x_ref, **TOL)
    torch.testing.assert_close(h, rms_norm(x_ref, w, ops.cfg.rms_eps), **TOL)


def test_qk_rope_writes_cache():
    ops = _ops("small")
    c, lw = ops.cfg, ops.w.layers[1]
    H, Hkv, hd, T, L = c.num_heads, c.num_kv_heads, c.head_dim, 5, 64
    g = torch.Generator(device=DEV).manual_seed(3)
    parts = torch.randn(2, T, (H + 2 * Hkv) * hd, device=DEV, generator=g)
    start = torch.tensor([9], device=DEV)
    kc, vc = torch.zeros(1, Hkv, L, hd, device=DEV), torch.zeros(1, Hkv, L, hd, device=DEV)
    q = ops.qk_rope(parts, lw, start, kc, vc)
    y = parts.sum(0).view(1, T, H + 2 * Hkv, hd)
    qr, kr, vr = y[:, :, :H], y[:, :, H:H + Hkv], y[:, :, H + Hkv:]
    qr, kr = rms_norm(qr, lw.q_norm, c.rms_eps), rms_norm(kr, lw.k_norm, c.rms_eps)
    pos = torch.arange(9, 9 + T, device=DEV)
    cos, sin = ops.w.rope_cos[pos][None], ops.w.rope_sin[pos][None]
    qr, kr = apply_rope(qr.transpose(1, 2), cos, sin), apply_rope(kr.transpose(1, 2), cos, sin)
    torch.testing.assert_close(q, qr[0], **TOL)
    torch.testing.assert_close(kc[:, :, 9:9 + T], kr, **TOL)
    torch.testing.assert_close(vc[:, :, 9:9 + T], vr.transpose(1, 2), **TOL)
    assert not kc[:, :, :9].any() and not kc[:, :, 9 + T:].any()


@pytest.mark.parametrize("T,S,start,split,BR,BS", [(8, 64, 40, None, None, 16), (8, 64, 40, 3, 16, 16),
                                                   (5, 37, 20, 2, 16, 16), (16, 64, 0, 1, 32, 16)])
def test_attention_visibility(T, S, start, split, BR, BS):
    """Rows see slot j iff j < start + lim[i] (a folded commit: block rows block-causal, canvas
    rows the whole canvas); slots past S or past every row's limit are never read."""
    ops = _ops("small")
    c = ops.cfg
    H, Hkv, hd, L = c.num_heads, c.num_kv_heads, c.head_dim, 80
    g = torch.Generator(device=DEV).manual_seed(4)
    q = torch.randn(H, T, hd, device=DEV, generator=g)
    kc, vc = torch.randn(1, Hkv, L, hd, device=DEV, generator=g), torch.randn(1, Hkv, L, hd, device=DEV, generator=g)
    kc[:, :, S:] = float("nan")  # beyond S: must not be read (NaN would poison the output)
    half = T // 2
    lim = torch.cat([torch.arange(1, half + 1), torch.full((T - half,), T)]).to(DEV)
    st = torch.tensor([start], device=DEV)
    if start + T > S:
        pytest.skip("layout does not fit")
    out = ops.attention(q, kc, vc, st, lim, S, split=split, BR=BR, BS=BS)
    bias = attention_bias(st, lim, S, H // Hkv, torch.float32)
    ref = F.scaled_dot_product_attention(q.reshape(1, Hkv, -1, hd), kc[:, :, :S], vc[:, :, :S], attn_mask=bias,
                                         scale=hd ** -0.5)
    ref = ref.reshape(H, T, hd).transpose(0, 1).reshape(T, H * hd)
    torch.testing.assert_close(out, ref, **TOL)
    assert not ops.counters.any(), "split counters must be left at zero"


@pytest.mark.parametrize("clean,splits", [("causal", False), ("block", True)])  # each layout; splits forced once
def test_forward_matches_torch_forward(clean, splits):
    """The whole Triton pass (prefill, commit without logits, folded commit + canvas) gives the
    PyTorch forward's logits and cache, also with split-K GEMMs and split-KV attention forced.
    "small"'s widths (head dim 32, GQA over two KV heads) at two layers and K = 8: a first layer
    feeding a last one is every path (the commit pass stops in the last one), the 9-row prefill
    leaves partial tiles; more layers or rows repeat the same programs in the interpreter."""
    model = _model("small", clean_attention=clean, num_layers=2, block_size=8)
    cfg, K, P = model.config, model.config.block_size, 9
    w = bake(model, max_len=64)
    ops = Kn.TritonKernels(w)
    if splits:
        ops.attn_split, ops.attn_bs = 3, 16
        for W in (w.layers[0].qkv, w.layers[0].o, w.layers[0].down):
            ops.gemm_override[(W.shape[0], W.shape[1], False)] = Kn.GemmConfig(BM=16, BN=32, BK=32, SPLIT=3)
    g = torch.Generator().manual_seed(5)
    prompt, block = torch.randint(5, 60, (1, P), generator=g).to(DEV), torch.randint(5, 60, (1, K), generator=g).to(DEV)
    canvas = torch.full((1, K), cfg.mask_token_id, device=DEV)
    blk_lim = torch.full((K,), K) if clean == "block" else torch.arange(1, K + 1)
    lim = torch.cat([blk_lim, torch.full((K,), 2 * K)]).to(DEV)
    outs = []
    for kern in (None, ops):
        kv = StaticKV(cfg, 64, torch.float32, DEV)
        start = torch.zeros(1, dtype=torch.long, device=DEV)
        assert forward(w, embed(w, prompt), start, torch.arange(1, P + 1, device=DEV), kv, P, None,
                       kernels=kern) is None
        start += P
        outs.append((forward(w, embed(w, torch.cat([block, canvas], 1)), start, lim, kv, 64, logits_from=K,
                             kernels=kern), kv))
    (ref, kv_ref), (got, kv_got) = outs
    torch.testing.assert_close(got, ref, **TOL)
    for i in range(cfg.num_layers):
        torch.testing.assert_close(kv_got.k[i][:, :, :P + K], kv_ref.k[i][:, :, :P + K], **TOL)
        torch.testing.assert_close(kv_got.v[i][:, :, :P + K], kv_ref.v[i][:, :, :P + K], **TOL)


def test_runtime_triton_tokens_equal_reference():
    """Peaked logits: several tokens commit per round, so a block takes a few rounds (each one a
    whole forward in the interpreter), not K; every block still takes several (the residual is fed)."""
    model = _model("tiny")
    with torch.no_grad():
        g = torch.Generator().manual_seed(4)
        model.lm_head.weight.copy_(torch.randn(model.lm_head.weight.shape, generator=g).to(DEV) * 0.3)
    K = model.config.block_size
    prompt = torch.randint(5, 60, (1, 7), generator=torch.Generator().manual_seed(5)).to(DEV)
    cfg = DecodeConfig(rule="threshold", block_size=K, max_new_tokens=2 * K, threshold=0.2, residual=True)
    ref = decode(model, prompt, cfg)
    rt = Runtime(model, K, mode="eager", max_len=64, bucket=32, kernels="triton")
    out = rt.decode(prompt, cfg)
    assert len(set(ref.tokens[0])) >= 3, "degenerate test model: it predicts one token"
    assert all(s >= 2 for s in ref.steps_per_block[0]), "one round a block: the residual path is untested"
    assert out.tokens == ref.tokens and out.steps_per_block == ref.steps_per_block


def test_config_refusals():
    with pytest.raises(ValueError, match="kernels"):
        Runtime(_model(), 8, mode="eager", kernels="cuda")


def test_runtime_triton_moe_tokens_equal_reference():
    """A MoE model (llada/tiny: a dense first layer, then routed + shared experts) through the
    Triton forward, LLaDA's threshold + editing rule: the reference decoder's tokens and rounds.
    Interpreter rounds are what cost here, so: two query heads on one KV head (GQA; several KV heads
    are the tests above), and post steps capped at 3 -- uncapped (16) the blocks edit on for 10+
    rounds that add no path; capped, each block ends at the cap."""
    mcfg = get_config("llada", "tiny", tie_embeddings=False, num_heads=2, num_kv_heads=1)
    model = build_model(mcfg, seed=4).eval()
    with torch.no_grad():  # peaked logits: edits of committed tokens happen (tied random ones never edit)
        model.lm_head.weight.copy_(torch.randn(model.lm_head.weight.shape, generator=torch.Generator().manual_seed(4)) * 0.3)
    model = model.to(DEV)
    K = model.config.block_size
    prompt = torch.randint(5, 60, (1, 7), generator=torch.Generator().manual_seed(5)).to(DEV)
    cfg = DecodeConfig(rule="llada", block_size=K, max_new_tokens=2 * K, threshold=0.5, edit_threshold=0.3,
                       max_post_steps=3)
    ref = decode(model, prompt, cfg, trace=True)
    assert any(bool((r.committed & ~r.unresolved).any()) for r in ref.trace), "no edit: the editing path is untested"
    rt = Runtime(model, K, mode="eager", max_len=64, bucket=32, kernels="triton")
    out = rt.decode(prompt, cfg)
    assert len(set(ref.tokens[0])) >= 3, "degenerate test model: it predicts one token"
    assert out.tokens == ref.tokens and out.steps_per_block == ref.steps_per_block
