"""The engine's MoE (orl.engine.moe) against orl.model.layers.MoE, and the runtime on the LLaDA family
(MoE layers, threshold + editing rule) against the reference decoder, on CPU in float32.

The Triton kernels run under the Triton interpreter on CPU (TRITON_INTERPRET=1, set by tests/conftest.py
before Triton is imported; on a GPU machine the interpreter check runs in a subprocess that sets it);
skipped when Triton is not installed."""
import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from orl.decode import DecodeConfig, decode
from orl.engine.forward import StaticKV, bake, embed, forward
from orl.engine import moe as engine_moe
from orl.engine.moe import (PLAN_BLOCK, MoEWeights, bake_moe, experts_torch, moe_bytes, moe_mlp, plan, plan_triton,
                            route, route_triton)
from orl.engine.runtime import EngineConfig, Runtime
from orl.model import build_model, get_config
from orl.model.layers import MoE


def _moe(family="llada", seed=0, **kw):
    cfg = get_config(family, "tiny", **kw)
    m = MoE(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # every weight redrawn, larger than the default init: routing and outputs far from ties
        for p in m.parameters():
            p.normal_(0, 0.3, generator=g)
    return m, cfg


def _cast(t):
    return None if t is None else t.detach().float().contiguous()


MOE_CASES = [  # (family, overrides, T): llada (silu, shared expert), dgemma (gelu, Gemma router)
    ("llada", {}, 1),
    ("llada", {}, 7),
    ("llada", {}, 70),            # more tokens per expert than one token tile (prefill)
    ("llada", dict(num_experts=16, num_experts_per_tok=4), 3),   # 12 slots, some inactive
    ("llada", dict(num_shared_experts=0, router_norm_topk=False), 9),
    ("dgemma", {}, 11),
]


@pytest.mark.parametrize("family,kw,T", MOE_CASES)
def test_moe_mlp_torch_matches_model(family, kw, T):
    m, cfg = _moe(family, **kw)
    mw = bake_moe(m, _cast)
    g = torch.Generator().manual_seed(T)
    x, r = torch.randn(1, T, cfg.hidden_size, generator=g), torch.randn(1, T, cfg.hidden_size, generator=g)
    ri = r if cfg.router_scale else None
    with torch.no_grad():
        ref = m(x, router_input=ri)
        got = moe_mlp(x, mw, cfg, router_input=ri, backend="torch")
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_moe_torch_bf16_close_to_model():
    m, cfg = _moe()
    m = m.to(torch.bfloat16)
    mw = bake_moe(m, lambda t: None if t is None else t.detach().contiguous())
    x = torch.randn(1, 13, cfg.hidden_size, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    with torch.no_grad():
        ref, got = m(x), moe_mlp(x, mw, cfg, backend="torch")
    torch.testing.assert_close(got.float(), ref.float(), rtol=2e-2, atol=2e-2)


def test_route_and_plan():
    m, cfg = _moe(num_experts=16, num_experts_per_tok=4)
    mw = bake_moe(m, _cast)
    x = torch.randn(5, cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    w, ids = route(x, mw, cfg)
    rw, rids = m.route(x)
    # same sets and weights, each row sorted by expert id
    assert torch.equal(ids, rids.sort(-1).values)
    torch.testing.assert_close(w, rw.gather(-1, rids.sort(-1).indices))
    p = plan(ids, 16)
    distinct = torch.unique(ids)
    n = len(distinct)
    assert p["slots"] == 16 and int(p["count"].sum()) == ids.numel()
    assert (p["count"][:n] > 0).all() and (p["count"][n:] == 0).all()   # inactive slots last
    assert torch.equal(p["expert"][:n], distinct)
    flat = ids.reshape(-1)
    for s in range(n):  # each slot's pairs route to its expert, tokens ascending
        pairs = p["order"][p["start"][s]:p["start"][s] + p["count"][s]]
        assert (flat[pairs] == p["expert"][s]).all() and torch.equal(pairs, pairs.sort().values)
    assert torch.equal(p["order"][p["pos"]], torch.arange(ids.numel()))
    # the floor counts only the touched experts
    per = (mw.gate_up[0].numel() + mw.down[0].numel()) * 4
    assert moe_bytes(mw, ids) == moe_bytes(mw) - (16 - n) * per


PLAN_CASES = [  # (N, k, E, block, all ids one expert)
    (1, 8, 256, PLAN_BLOCK, False),      # N = 1: 8 active slots of 8
    (32, 8, 256, PLAN_BLOCK, False),     # a LLaDA-2.1-mini round: N k = E
    (5, 4, 16, PLAN_BLOCK, False),       # N k > E
    (3, 4, 64, PLAN_BLOCK, False),       # N k < E, most slots inactive
    (7, 3, 5, PLAN_BLOCK, False),        # E and k not powers of two
    (20, 4, 16, PLAN_BLOCK, True),       # every assignment to one expert
    (1, 1, 1, PLAN_BLOCK, False),
    (9, 2, 1, 16, False),                # E = 1, two chunks
    (40, 8, 256, 64, False),             # five chunks, the last one full
    (37, 3, 32, 16, True),               # chunks, one expert
    (129, 8, 256, PLAN_BLOCK, False),    # a prefill: chunks of PLAN_BLOCK, the last one of 8 (many chunks: above)
]


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
@pytest.mark.parametrize("N,k,E,block,one", PLAN_CASES)
def test_plan_kernel_equals_plan(N, k, E, block, one):
    """The one-program Triton layout (interpreter on CPU) == `plan`, tensor for tensor and dtype,
    and its weights in sorted order == w[order]."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no GPU and Triton not in interpreter mode")
    g = torch.Generator().manual_seed(N * 1000 + k * 10 + E)
    ids = torch.full((N, k), E // 2) if one else torch.randint(0, E, (N, k), generator=g)
    w = torch.rand(N, k, generator=g)
    ids, w = ids.to(dev), w.to(dev)
    got, ref = plan_triton(ids, w, E, block=block), plan(ids, E)
    assert got["slots"] == ref["slots"] == min(E, N * k)
    for key in ("order", "tok", "start", "count", "expert", "pos"):
        assert got[key].dtype == ref[key].dtype and torch.equal(got[key], ref[key]), key
    assert torch.equal(got["wsorted"], w.reshape(-1)[ref["order"]])


def _triton_dev():
    """cuda when there is a GPU, cpu under the Triton interpreter, else skip."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    if torch.cuda.is_available():
        return "cuda"
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no GPU and Triton not in interpreter mode")
    return "cpu"


ROUTE_CASES = [  # (N, D, E, k, router_norm_topk, gemma, block_e): None = the default (one split on CPU)
    (1, 64, 256, 8, True, False, None),     # LLaDA-2.1-mini's E and k, one token
    (1, 64, 256, 8, True, False, 16),       # the CUDA default: 16 expert splits, the last one routes
    (33, 64, 256, 8, True, False, 32),      # three token tiles, the last partial; 8 splits
    (33, 96, 256, 8, False, False, None),
    (33, 48, 60, 4, True, False, None),     # E not a power of two, D not a multiple of the D block
    (33, 48, 60, 4, False, False, 16),
    (7, 40, 5, 5, True, False, None),       # k = E < 16: padded experts never picked
    (3, 16, 1, 1, True, False, None),       # one expert
    (20, 40, 16, 3, True, True, None),      # Gemma 4 router (RMSNorm prelude, per-expert scale)
    (33, 200, 60, 8, True, True, 16),
    (9, 72, 128, 8, False, True, 32),
]


def _route_inputs(N, D, E, gemma, dev, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, D, generator=g)
    W = torch.randn(E, D, generator=g) * 1.5 * D ** -0.5  # logits ~ N(0, 1.5^2): no near ties
    rs = torch.rand(D, generator=g) * 2 + 0.5 if gemma else None
    pes = torch.rand(E, generator=g) + 0.5 if gemma else None
    if gemma:  # after the RMSNorm prelude x has norm ~ 1: scale W back up
        W = W * D ** 0.5
    return [None if t is None else t.to(dev) for t in (x, W, rs, pes)]


@pytest.mark.parametrize("N,D,E,k,norm,gemma,block_e", ROUTE_CASES)
def test_route_kernel_equals_route(N, D, E, k, norm, gemma, block_e):
    """The one-launch Triton router (interpreter on CPU, float32) == `route`: ids exactly, weights
    within 1e-6, dtypes and shapes; a second launch gives the same and leaves the counters zero."""
    dev = _triton_dev()
    x, W, rs, pes = _route_inputs(N, D, E, gemma, dev, seed=N * 100 + E)
    mw = MoEWeights(W, None, None, None, None, rs, pes)
    cfg = get_config("llada", "tiny", num_experts=E, num_experts_per_tok=k, router_norm_topk=norm)
    rw, rids = route(x, mw, cfg)
    for _ in range(2):
        w, ids = route_triton(x, W, k, norm, rs, pes, cfg.rms_eps, block_e=block_e)
        assert ids.dtype == torch.long and w.dtype == torch.float32 and ids.shape == w.shape == (N, k)
        assert torch.equal(ids, rids)
        torch.testing.assert_close(w, rw, rtol=0, atol=1e-6)
    for c in engine_moe._route_counters.values():
        assert int(c.abs().sum()) == 0
    got = torch.ops.orl.moe_route(x, W, rs, pes, k, norm, cfg.rms_eps)  # the custom op moe_mlp calls
    assert torch.equal(got[1], rids)


@pytest.mark.parametrize("block_e", [None, 16])
def test_route_kernel_ties_take_the_lower_id(block_e):
    """Equal probabilities at the k-th place: the lower ids are taken (torch.topk's CUDA order)."""
    dev = _triton_dev()
    v = torch.tensor([0, 3, 1, 3, 2, 3, 0, 3, 1, 1, 2, 0, 3, 0, 0, 1.])  # exact logits (x = 1, W = v / 16)
    x, W = torch.ones(2, 16, device=dev), (v[:, None] / 16).expand(16, 16).contiguous().to(dev)
    w, ids = route_triton(x, W, 4, True, block_e=block_e)
    assert ids.tolist() == [[1, 3, 5, 7]] * 2 and torch.equal(w, torch.full_like(w, 0.25))
    w, ids = route_triton(x, W, 6, False, block_e=block_e)  # five 3s, then the first of the 2s
    assert ids.tolist() == [[1, 3, 4, 5, 7, 12]] * 2
    p = torch.softmax(v, 0)
    torch.testing.assert_close(w.cpu(), p[ids[0].cpu()].expand(2, 6), rtol=0, atol=1e-7)


def test_route_op_registration():
    """The custom op (what torch.compile sees): schema, fake tensors, dispatch."""
    dev = _triton_dev()
    x, W, rs, pes = _route_inputs(5, 32, 16, True, dev)
    for args in ((x, W, None, None, 4, True, 1e-6), (x, W, rs, pes, 4, False, 1e-6)):
        torch.library.opcheck(torch.ops.orl.moe_route.default, args)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 needs the GPU (broken in the interpreter)")
@pytest.mark.parametrize("block_e", [None, 256])
def test_route_kernel_bf16_llada_mini_on_cuda(block_e):
    """LLaDA-2.1-mini's router (D 2048, E 256, k 8, 32 tokens) in bf16: the same ids as `route`
    except where a logit's bf16 rounding (summation order) decides the k-th place; weights within
    that rounding."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 2048, generator=g).cuda().bfloat16()
    W = (torch.randn(256, 2048, generator=g) * 0.02).cuda().bfloat16()
    cfg = get_config("llada", "tiny", num_experts=256, num_experts_per_tok=8)
    rw, rids = route(x, MoEWeights(W, None, None, None, None, None, None), cfg)
    w, ids = route_triton(x, W, 8, True, block_e=block_e)
    same = (ids == rids).all(-1)
    assert int(same.sum()) >= 30, (ids[~same], rids[~same])
    torch.testing.assert_close(w[same], rw[same], rtol=2e-2, atol=1e-4)


def test_experts_torch_chunks_give_the_same_result():
    m, cfg = _moe()
    mw = bake_moe(m, _cast)
    x = torch.randn(6, cfg.hidden_size, generator=torch.Generator().manual_seed(0))
    w, ids = route(x, mw, cfg)
    a = experts_torch(x, ids, w, mw, cfg)
    b = experts_torch(x, ids, w, mw, cfg, max_elems=1)  # one pair per chunk
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def _llada(pathway="mlp", **kw):
    m = build_model(get_config("llada", "tiny", pathway=pathway, tie_embeddings=False, **kw), seed=1).eval()
    g = torch.Generator().manual_seed(1)
    if m.residual_pathway is not None:  # make the pathway matter
        torch.nn.init.normal_(m.residual_pathway.mlp.down_proj.weight, std=0.2, generator=g)
    torch.nn.init.normal_(m.lm_head.weight, std=0.3, generator=g)  # peaked outputs: thresholds fire, edits happen
    return m


LLADA_CASES = [  # (threshold, edit_threshold, max_post_steps, fold, residual, pathway)
    (0.95, 0.9, 16, True, True, "mlp"),     # the published protocol's numbers
    (0.5, 0.3, 16, True, True, "mlp"),      # many commits and edits per round
    (1.0, 0.3, 3, True, True, "mlp"),       # one commit per round; post steps hit their cap
    (0.3, 0.1, 16, False, True, "mlp"),     # without fold_commit
    (0.5, 0.3, 16, True, False, "mlp"),     # residual off
    (0.5, 0.3, 16, True, True, "none"),
]


@pytest.mark.parametrize("case", LLADA_CASES)
def test_runtime_llada_matches_reference(case):
    thr, ethr, post, fold, residual, pathway = case
    model = _llada(pathway)
    K = model.config.block_size
    rt = Runtime(model, K, EngineConfig(mode="eager", max_len=128, fold_commit=fold, bucket=32))
    edits = 0
    for seed in range(3):
        prompt = torch.randint(5, 60, (1, 5 + 3 * seed), generator=torch.Generator().manual_seed(seed))
        cfg = DecodeConfig(rule="llada", block_size=K, max_new_tokens=3 * K - 1, threshold=thr,
                           edit_threshold=ethr, max_post_steps=post, residual=residual)
        ref = decode(model, prompt, cfg, trace=True)
        out = rt.decode(prompt, cfg)
        assert len(set(ref.tokens[0])) >= 3, "degenerate test model: it predicts one token"
        assert out.tokens == ref.tokens
        assert out.steps_per_block == ref.steps_per_block
        assert out.block_tokens == ref.block_tokens
        edits += sum(int((r.committed & ~r.unresolved).sum()) for r in ref.trace)
    if ethr < 0.9:
        assert edits > 0, "the case should exercise token-to-token editing"


def test_runtime_llada_post_steps_cap_rounds():
    """threshold 1.0: one mask per round (K rounds), then post steps until no edit or the cap."""
    model = _llada()
    K = model.config.block_size
    cfg = DecodeConfig(rule="llada", block_size=K, max_new_tokens=2 * K, threshold=1.0, edit_threshold=1.0)
    out = Runtime(model, K, mode="eager", max_len=64).decode(torch.tensor([[5, 6, 7]]), cfg)
    assert out.steps_per_block == [[K + 1, K + 1]]  # no edits: the first post step ends the block


def test_forward_matches_model_llada_and_floor_counts_touched_experts():
    model = _llada()
    cfg, P = model.config, 9
    prompt = torch.randint(5, 60, (1, P), generator=torch.Generator().manual_seed(0))
    ref = model(prompt, torch.arange(P), torch.ones(P, P, dtype=torch.bool).tril())
    w, kv = bake(model, max_len=32), StaticKV(cfg, 32, torch.float32, "cpu")
    assert w.moe_backend == "torch"
    ids: list = []
    got = forward(w, embed(w, prompt), torch.zeros(1, dtype=torch.long), torch.arange(1, P + 1), kv, 32,
                  route_out=ids)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    n_moe = cfg.num_layers - cfg.first_dense_layers
    assert len(ids) == n_moe and ids[0].shape == (P, cfg.num_experts_per_tok)
    full = w.weight_bytes()
    one = [torch.zeros(1, 1, dtype=torch.long)] * n_moe  # one expert touched per layer
    per = sum(lw.moe.gate_up[0].numel() + lw.moe.down[0].numel() for lw in w.layers if lw.moe is not None) * 4
    assert w.weight_bytes(one) == full - (cfg.num_experts - 1) * per
    assert w.weight_bytes(ids) <= full


def _interpreter_checks() -> None:
    """The grouped Triton kernels (fp32) == MoE.forward on every MOE_CASES shape; the runtime with
    them == the reference decoder. Needs Triton in interpreter mode (CPU tensors)."""
    with torch.no_grad():
        for family, kw, T in MOE_CASES:
            m, cfg = _moe(family, **kw)
            mw = bake_moe(m, _cast)
            g = torch.Generator().manual_seed(T)
            x, r = torch.randn(1, T, cfg.hidden_size, generator=g), torch.randn(1, T, cfg.hidden_size, generator=g)
            ri = r if cfg.router_scale else None
            torch.testing.assert_close(moe_mlp(x, mw, cfg, router_input=ri, backend="triton"),
                                       m(x, router_input=ri), rtol=5e-5, atol=5e-5)  # float32, other summation orders
    model = _llada()
    K = model.config.block_size
    # post steps capped at 3: uncapped (16) these blocks edit for 10+ more interpreter rounds on the same shapes
    cfg = DecodeConfig(rule="llada", block_size=K, max_new_tokens=2 * K, threshold=0.5, edit_threshold=0.3,
                       max_post_steps=3)
    prompt = torch.tensor([[5, 9, 11, 40, 7]])
    rt = Runtime(model, K, mode="eager", max_len=64, moe_backend="triton")
    out, ref = rt.decode(prompt, cfg), decode(model, prompt, cfg, trace=True)
    assert len(set(ref.tokens[0])) >= 3, "degenerate test model: it predicts one token"
    assert any(bool((r.committed & ~r.unresolved).any()) for r in ref.trace), "no edit: the editing path is untested"
    assert out.tokens == ref.tokens and out.steps_per_block == ref.steps_per_block, (out, ref)


_INTERPRETER_SCRIPT = ("from tests.test_engine_moe import _interpreter_checks\n"
                       "_interpreter_checks()\nprint('INTERPRETER-OK')\n")


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_triton_kernels_in_interpreter_match_model():
    """`_interpreter_checks`: in this process when Triton already runs in its interpreter here
    (tests/conftest.py sets it on a machine without a GPU; no second Python and torch start-up),
    else in a subprocess (TRITON_INTERPRET must be set before Triton is imported)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        _interpreter_checks()
        return
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1", PYTHONPATH=root)
    r = subprocess.run([sys.executable, "-W", "ignore", "-c", _INTERPRETER_SCRIPT], cwd=root, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "INTERPRETER-OK" in r.stdout, r.stderr[-4000:]
