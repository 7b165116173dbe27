"""LLaDA-2.x's router (sigmoid scores, expert bias for the choice, group-limited top-k, scaling:
`orl.model.layers.group_limited_route`) in the model and in the engine.

The pure rule against values computed by hand; the engine's `route` against `MoE.route` (the same
ids and bit-equal weights, float32 / float64 / bf16); `moe_mlp` (PyTorch twin, and the Triton expert
kernels after the PyTorch routing under the interpreter) against `MoE.forward`; the runtime (eager,
CPU, float64, B = 1 and B = 2) against the reference decoder on a tiny LLaDA model with that router,
token for token. The CUDA twins (the "triton" backend on a GPU, graphs) are skipped without CUDA.
The published gate's parity with the float64 reference forward: tests/test_parity_llada2.py.
"""
import importlib.util
import os

import pytest
import torch

from orl.decode import DecodeConfig, decode
from orl.decode.rng import CounterRNG
from orl.engine import moe as engine_moe
from orl.engine.moe import bake_moe, moe_mlp, route, route_kernel_covers
from orl.engine.runtime import Runtime
from orl.model import build_model, get_config
from orl.model.layers import MoE, group_limited_route

# top-2 of 8 experts within the best 2 of 4 groups of 2, sigmoid, expert bias, x2.5
ROUTER = dict(num_experts=8, num_experts_per_tok=2, router_score="sigmoid", router_bias=True, router_groups=4,
              router_topk_groups=2, router_scaling=2.5)


def _cfg(**kw):
    return get_config("llada", "tiny", **{**ROUTER, **kw})


def _moe(dtype=torch.float32, seed=0, **kw):
    cfg = _cfg(**kw)
    m = MoE(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.3, generator=g)
        m.gate.weight.normal_(0, 0.2, generator=g)  # logits ~ N(0, 1.6^2): the sigmoid does not saturate (no ties)
        m.expert_bias.normal_(0, 0.3, generator=g)
    return m.to(dtype), cfg


def test_group_limited_route_by_hand():
    """Two tokens, 4 experts in 2 groups of 2, top-1 group, k = 2."""
    logits = torch.tensor([[0.0, 2.0, 1.0, -1.0], [1.0, -2.0, 0.5, 0.4]], dtype=torch.float64)
    bias = torch.tensor([0.0, 0.0, 0.9, 0.0], dtype=torch.float64)
    s = torch.sigmoid(logits)
    # token 0: choice c = [.5, .881, 1.631, .269]; group scores (sum of both) 1.381 vs 1.900: group 1
    # (experts 2, 3) although expert 1 has the second-best choice; token 1: c = [.731, .119, 1.522, .599],
    # groups .850 vs 2.121: group 1 again. Weights: the sigmoid scores without the bias.
    w, idx = group_limited_route(logits, 2, bias=bias, groups=2, topk_groups=1, norm=True, scaling=2.5)
    assert idx.tolist() == [[2, 3], [2, 3]]
    want = s[:, 2:] / s[:, 2:].sum(-1, keepdim=True) * 2.5
    torch.testing.assert_close(w, want, rtol=0, atol=1e-15)
    w, idx = group_limited_route(logits, 2, bias=bias, groups=2, topk_groups=2, norm=False)  # every group kept
    assert idx.tolist() == [[2, 1], [2, 0]]
    torch.testing.assert_close(w, s.gather(1, idx), rtol=0, atol=0)
    w, idx = group_limited_route(logits, 2, score="softmax", groups=2, topk_groups=1, norm=False)
    # softmax: token 0's group 0 (.64 + .09) beats group 1 (.24 + .03); token 1's best expert is 0 (.45),
    # but group 1 (.28 + .25) beats group 0 (.45 + .02)
    assert idx.tolist() == [[1, 0], [2, 3]]
    torch.testing.assert_close(w, torch.softmax(logits, -1).gather(1, idx), rtol=0, atol=0)


def test_router_config_defaults_and_errors():
    plain = get_config("llada", "tiny")
    assert plain.router_plain and route_kernel_covers(plain) and route_kernel_covers(get_config("dgemma", "tiny"))
    assert not _cfg().router_plain and not route_kernel_covers(_cfg())
    assert MoE(plain).expert_bias is None and "expert_bias" not in dict(MoE(plain).named_buffers())
    for kw, msg in ((dict(router_score="tanh"), "router_score must be"),
                    (dict(router_groups=3), "router_groups 3 must divide num_experts 8"),
                    (dict(router_topk_groups=5), r"router_topk_groups 5 must be in \[1, router_groups 4\]"),
                    (dict(num_experts_per_tok=5), r"num_experts_per_tok 5 must be in \[1, 4\]")):
        with pytest.raises(ValueError, match=msg):
            _cfg(**kw)
    with pytest.raises(ValueError, match="describe a MoE router"):
        get_config("sdar", "tiny", router_score="sigmoid")
    with pytest.raises(ValueError, match="router_scale .* does not combine"):
        get_config("dgemma", "tiny", router_bias=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_engine_route_equals_model_route(dtype):
    m, cfg = _moe(dtype)
    mw = bake_moe(m, lambda t: None if t is None else t.detach().contiguous())
    x = torch.randn(33, cfg.hidden_size, generator=torch.Generator().manual_seed(1)).to(dtype)
    with torch.no_grad():
        rw, rids = m.route(x)
        w, ids = route(x, mw, cfg)
    order = rids.sort(-1).indices
    assert torch.equal(ids, rids.gather(-1, order)) and torch.equal(w, rw.gather(-1, order))
    assert w.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    torch.testing.assert_close(w.sum(-1), torch.full_like(w[:, 0], 2.5))  # renormalised, times the scale
    assert all(len(set((r // 2).tolist())) <= 2 for r in ids)  # within the 2 kept groups (2 experts each)
    with torch.no_grad():  # the bias moves the choice for some tokens (not a vacuous bias)
        m.expert_bias.zero_()
        assert not torch.equal(m.route(x)[1].sort(-1).values, rids.sort(-1).values)


def _interpreter() -> bool:
    return importlib.util.find_spec("triton") is not None and os.environ.get("TRITON_INTERPRET") == "1"


def _no_route_kernel(*a, **k):
    raise AssertionError("the Triton routing kernel does not implement this router")


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_moe_mlp_equals_model(backend, monkeypatch):
    """The PyTorch twin, and the "triton" backend (PyTorch routing, `route_kernel_covers`, then the
    grouped expert kernels; the interpreter on CPU) == `MoE.forward`, float32."""
    if backend == "triton" and not _interpreter():
        pytest.skip("needs Triton in interpreter mode (CPU); the CUDA twin is below")
    monkeypatch.setattr(engine_moe, "route_triton", _no_route_kernel)
    m, cfg = _moe(num_shared_experts=1)
    mw = bake_moe(m, lambda t: None if t is None else t.detach().float().contiguous())
    x = torch.randn(1, 9, cfg.hidden_size, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref, got = m(x), moe_mlp(x, mw, cfg, backend=backend)
    torch.testing.assert_close(got, ref, rtol=5e-5, atol=5e-5)


def _llada_model(dtype=torch.float64, device="cpu"):
    """The tiny LLaDA model with the published-style router, random expert biases, a peaked head."""
    m = build_model(_cfg(tie_embeddings=False), seed=1).eval()
    g = torch.Generator().manual_seed(101)
    with torch.no_grad():
        for layer in m.model.layers[m.config.first_dense_layers:]:
            layer.mlp.gate.weight.normal_(0, 0.2, generator=g)
            layer.mlp.expert_bias.normal_(0, 0.3, generator=g)
        m.lm_head.weight.copy_(torch.randn(m.lm_head.weight.shape, generator=g) * 0.5)
        m.residual_pathway.mlp.down_proj.weight.normal_(0, 0.2, generator=g)
    return m.to(device=device, dtype=dtype)


def _decode_cfg(K, sampled):
    return DecodeConfig(rule="llada", block_size=K, max_new_tokens=3 * K, threshold=0.5, edit_threshold=0.5,
                        max_post_steps=3, temperature=0.8 if sampled else 0.0)


@pytest.mark.parametrize("sampled", [False, True])
def test_runtime_equals_reference_decoder(sampled):
    """Eager runtime on CPU (float64, so no decision sits on a rounding tie), B = 1 and B = 2: the
    reference decoder's tokens, rounds per block and committed blocks; the router's bias matters."""
    model = _llada_model()
    K = model.config.block_size
    cfg = _decode_cfg(K, sampled)
    prompts = torch.randint(5, 60, (2, 7), generator=torch.Generator().manual_seed(3))
    ref = decode(model, prompts, cfg, rng=CounterRNG(11))
    out = Runtime(model, K, mode="eager", max_len=96, bucket=32, batch=2).decode(prompts, cfg, seed=11)
    assert out.tokens == ref.tokens and out.steps_per_block == ref.steps_per_block
    assert out.block_tokens == ref.block_tokens
    assert len({t for row in out.tokens for t in row}) >= 4, "degenerate test model"
    one = Runtime(model, K, mode="eager", max_len=96, bucket=32).decode(prompts[:1], cfg, seed=11)
    assert one.tokens[0] == out.tokens[0] and one.steps_per_block[0] == out.steps_per_block[0]
    with torch.no_grad():  # the expert bias changes this model's output
        pos, mask = torch.arange(7), torch.ones(7, 7, dtype=torch.bool).tril()
        a = model(prompts, pos, mask)
        for layer in model.model.layers[model.config.first_dense_layers:]:
            layer.mlp.expert_bias.zero_()
        assert (model(prompts, pos, mask) - a).abs().max() > 1e-3


# ------------------------------------------------------------------------------ CUDA twins
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_moe_triton_backend_matches_model_on_cuda(dtype, monkeypatch):
    """On the GPU the "triton" backend routes this router in PyTorch and runs the grouped kernels:
    == `MoE.forward` (float32 tight, bf16 within rounding)."""
    monkeypatch.setattr(engine_moe, "route_triton", _no_route_kernel)
    m, cfg = _moe(dtype, num_shared_experts=1)
    m = m.cuda()
    mw = bake_moe(m, lambda t: None if t is None else t.detach().contiguous())
    x = torch.randn(1, 40, cfg.hidden_size, generator=torch.Generator().manual_seed(2)).to("cuda", dtype)
    with torch.no_grad():
        ref, got = m(x), moe_mlp(x, mw, cfg, backend="triton")
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), ref.float(), rtol=tol, atol=tol * float(ref.abs().max()))


@cuda
def test_runtime_float32_graphs_equal_reference_on_cuda():
    """float32 on CUDA, Triton expert kernels after the PyTorch routing, eager and CUDA-graph modes:
    the reference decoder's tokens and rounds."""
    from orl.engine.moe import triton_available  # noqa: PLC0415
    from orl.engine.parity import compare_decode  # noqa: PLC0415
    model = _llada_model(torch.float32, "cuda")
    K = model.config.block_size
    prompt = torch.randint(5, 60, (1, 7), generator=torch.Generator().manual_seed(3)).cuda()
    for mode in ("eager", "graph"):
        rt = Runtime(model, K, mode=mode, max_len=96, bucket=32)
        assert rt.w.moe_backend == ("triton" if triton_available() else "torch")
        c = compare_decode(rt, model, prompt, _decode_cfg(K, False))
        assert c["equal"], (mode, c["first_diff"], c["ref"].steps_per_block, c["ours"].steps_per_block)
