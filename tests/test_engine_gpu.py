"""The engine runtime on a GPU: CUDA-graph replay and the device WHILE loop equal eager execution
bit for bit (with and without torch.compile'd layers); float32 decoding equals the reference decoder
token for token; bf16 rounds equal the reference's round by round up to rounding ties
(`orl.engine.parity`). Skipped without CUDA."""
import pytest
import torch

from orl.decode import DecodeConfig
from orl.engine.graphs import conditional_nodes_available
from orl.engine.parity import compare_decode, teacher_forced
from orl.engine.runtime import Runtime
from orl.model import build_model, get_config

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

# (name, family/size, overrides, K, threshold): tiny and small have a 64-token vocabulary, so a low
# threshold commits several tokens per round; the Qwen3-4B shape (2 layers) has the real vocabulary
# (untied: with tied random embeddings every position predicts its own input, the mask token).
MODELS = {
    "tiny": ("tiny", dict(tie_embeddings=False), 8, 0.05),
    "small": ("small", dict(tie_embeddings=False), 16, 0.05),
    "qwen3-4b-2l": ("qwen3-4b", dict(num_layers=2, layer_types=None, tie_embeddings=False), 32, 0.9),
}


def _model(name, dtype):
    size, kw, K, thr = MODELS[name]
    m = build_model(get_config("sdar", size, **kw), seed=1, device="cuda").eval()
    if m.residual_pathway is not None:  # make the pathway matter
        torch.nn.init.normal_(m.residual_pathway.mlp.down_proj.weight, std=0.2)
    return m.to(dtype), K, thr


def _prompt(n=11):
    return torch.randint(5, 60, (1, n), generator=torch.Generator().manual_seed(3)).cuda()


def _modes():
    return ["graph", "while"] if conditional_nodes_available()[0] else ["graph"]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()  # compiled layers: each test starts below dynamo's per-function cache limit
    yield


@pytest.mark.parametrize("name,fold,comp", [("tiny", True, False), ("tiny", False, False), ("small", True, False),
                                            ("small", False, False), ("qwen3-4b-2l", True, False),
                                            ("qwen3-4b-2l", False, False), ("qwen3-4b-2l", True, True)])
def test_graphs_equal_eager_bitwise(name, fold, comp):
    model, K, thr = _model(name, torch.bfloat16)
    cfg = DecodeConfig(block_size=K, max_new_tokens=3 * K, threshold=thr, steps=K // 2 if name == "tiny" else None)
    runs = {}
    for mode in ["eager"] + _modes():
        rt = Runtime(model, K, mode=mode, max_len=512, fold_commit=fold, bucket=64, compile=comp)
        out = rt.decode(_prompt(), cfg)
        out2 = rt.decode(_prompt(), cfg)  # graphs replayed for a second request
        rt.flush()
        runs[mode] = (out, out2, rt)
    e_out, _, e_rt = runs["eager"]
    for mode, (out, out2, rt) in runs.items():
        assert out.tokens == out2.tokens == e_out.tokens, mode
        assert out.steps_per_block == e_out.steps_per_block, mode
        L = rt.length
        for i in range(model.config.num_layers):
            assert torch.equal(rt.kv.k[i][:, :, :L], e_rt.kv.k[i][:, :, :L]), (mode, i)
            assert torch.equal(rt.kv.v[i][:, :, :L], e_rt.kv.v[i][:, :, :L]), (mode, i)


@pytest.mark.parametrize("name,comp", [("tiny", False), ("small", False), ("qwen3-4b-2l", False), ("small", True)])
def test_float32_tokens_equal_reference(name, comp):
    model, K, thr = _model(name, torch.float32)
    cfg = DecodeConfig(block_size=K, max_new_tokens=3 * K - 3, threshold=thr)
    for mode in _modes():
        rt = Runtime(model, K, mode=mode, max_len=512, bucket=64, compile=comp)
        c = compare_decode(rt, model, _prompt(), cfg)
        assert c["equal"], (mode, c["first_diff"])


@pytest.mark.parametrize("name,comp", [("small", False), ("qwen3-4b-2l", False), ("qwen3-4b-2l", True)])
def test_bf16_rounds_equal_reference_up_to_ties(name, comp):
    model, K, thr = _model(name, torch.bfloat16)
    cfg = DecodeConfig(block_size=K, max_new_tokens=2 * K, threshold=thr)
    rt = Runtime(model, K, mode="eager", max_len=512, bucket=64, compile=comp)
    p = teacher_forced(rt, model, _prompt(), cfg)
    assert p.ok(), p.unexplained
    assert p.max_rel_logit_err < 3e-2


@pytest.mark.parametrize("fold", [True, False])
def test_dgemma_tiny_equals_reference(fold):
    """DiffusionGemma (dgemma/tiny, float32): every mode decodes the reference decoder's tokens in its
    rounds when both draw from the runtime's counter RNG (`orl.decode.rng`), and the
    graph modes equal eager bit for bit (canvases, rounds, cache)."""
    import os  # noqa: PLC0415
    import sys  # noqa: PLC0415
    sys.path.insert(0, os.path.dirname(__file__))
    from test_engine_dgemma import _cfg, _model as dg_model, _reference  # noqa: PLC0415
    model = dg_model().cuda()
    prompt = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(7)).cuda()
    for kw in (dict(steps=6, max_new_tokens=48), dict(steps=12, t_min=0.01, t_max=0.02, max_new_tokens=48),
               dict(steps=5, temperature=0.0, stability_threshold=0)):
        cfg = _cfg(**kw)
        ref = _reference(model, prompt, cfg, seed=11)
        runs = {}
        for mode in ["eager"] + _modes():
            rt = Runtime(model, 16, mode=mode, max_len=160, fold_commit=fold, bucket=32)
            out = rt.decode(prompt, cfg, seed=11)
            assert rt.decode(prompt, cfg, seed=11).block_tokens == out.block_tokens, (mode, kw)  # graphs replayed
            assert out.block_tokens == ref.block_tokens, (mode, kw)
            assert out.steps_per_block == ref.steps_per_block, (mode, kw)
            rt.flush()
            runs[mode] = rt
        for mode, rt in runs.items():
            for i in range(model.config.num_layers):
                assert torch.equal(rt.kv.k[i][:, :, :rt.length], runs["eager"].kv.k[i][:, :, :rt.length]), (mode, i)


def _moe_helpers():
    import os  # noqa: PLC0415
    import sys  # noqa: PLC0415
    sys.path.insert(0, os.path.dirname(__file__))
    import test_engine_moe  # noqa: PLC0415
    return test_engine_moe


_MINI_EXPERTS = dict(hidden_size=2048, moe_intermediate_size=512, num_experts_per_tok=8)  # LLaDA-2.1-mini


@pytest.mark.parametrize("dtype,kw,T", [(torch.float32, {}, 7), (torch.float32, {}, 70),
                                        (torch.float32, dict(_MINI_EXPERTS, num_experts=16), 32),
                                        (torch.bfloat16, dict(_MINI_EXPERTS, num_experts=256), 64)])
def test_moe_triton_matches_model_on_cuda(dtype, kw, T):
    """The grouped Triton kernels on the GPU == orl.model.layers.MoE.forward (fp32 tight; the
    LLaDA-2.1-mini expert shape in bf16 within rounding)."""
    from orl.engine.moe import bake_moe, moe_mlp  # noqa: PLC0415
    from orl.model.layers import MoE  # noqa: PLC0415
    cfg = get_config("llada", "tiny", **kw)
    torch.manual_seed(0)
    with torch.device("cuda"):
        m = MoE(cfg)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.3 if not kw else 0.02)
    m = m.to(dtype)
    mw = bake_moe(m, lambda t: None if t is None else t.detach().contiguous())
    x = torch.randn(1, T, cfg.hidden_size, device="cuda").to(dtype)
    with torch.no_grad():
        ref, got = m(x), moe_mlp(x, mw, cfg, backend="triton")
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), ref.float(), rtol=tol, atol=tol * float(ref.abs().max()))


@pytest.mark.parametrize("comp", [False, True])
def test_llada_tiny_float32_equals_reference(comp):
    """LLaDA family (MoE layers, Triton grouped kernels, threshold + editing rule) in float32 on
    CUDA: every mode gives the reference decoder's tokens and rounds."""
    from orl.engine.moe import triton_available  # noqa: PLC0415
    h = _moe_helpers()
    model = h._llada().cuda()
    K = model.config.block_size
    for thr, ethr in ((0.5, 0.3), (1.0, 0.3), (0.95, 0.9)):
        cfg = DecodeConfig(rule="llada", block_size=K, max_new_tokens=3 * K - 1, threshold=thr, edit_threshold=ethr)
        for mode in ["eager"] + _modes():
            rt = Runtime(model, K, mode=mode, max_len=128, bucket=32, compile=comp)
            assert rt.w.moe_backend == ("triton" if triton_available() else "torch")
            c = compare_decode(rt, model, _prompt(), cfg)
            assert c["equal"], (mode, thr, ethr, c["first_diff"], c["ref"].steps_per_block, c["ours"].steps_per_block)


def test_llada_tiny_graphs_equal_eager_bitwise():
    h = _moe_helpers()
    model = h._llada().cuda().to(torch.bfloat16)
    K = model.config.block_size
    cfg = DecodeConfig(rule="llada", block_size=K, max_new_tokens=3 * K, threshold=0.5, edit_threshold=0.3)
    runs = {}
    for mode in ["eager"] + _modes():
        rt = Runtime(model, K, mode=mode, max_len=128, bucket=32, compile=False)
        out = rt.decode(_prompt(), cfg)
        assert rt.decode(_prompt(), cfg).tokens == out.tokens, mode  # graphs replayed
        rt.flush()
        runs[mode] = (out, rt)
    e_out, e_rt = runs["eager"]
    for mode, (out, rt) in runs.items():
        assert out.tokens == e_out.tokens and out.steps_per_block == e_out.steps_per_block, mode
        for i in range(model.config.num_layers):
            assert torch.equal(rt.kv.k[i][:, :, :rt.length], e_rt.kv.k[i][:, :, :rt.length]), (mode, i)


@pytest.mark.parametrize("name", ["sdar/tiny", "llada/tiny"])
def test_llm_auto_engine_on_cuda_equals_reference(name):
    """`LLM(engine="auto")` on CUDA sends greedy requests to the runtime (WHILE loop where the driver
    has it) and returns the reference decoder's tokens, text and forwards (float32)."""
    from orl import LLM

    def make(engine):
        llm = LLM(name, device="cuda", dtype="float32", engine=engine)
        with torch.no_grad():  # a tied random model predicts the mask token; make greedy text non-empty
            llm.model.model.embed_tokens.weight[llm.tokenizer.mask_token_id] = 0
        return llm
    ref, fast = make("reference"), make("auto")
    assert fast.uses_runtime(fast.decode_config, 5)
    for kw in (dict(max_new_tokens=40, ignore_eos=True), dict(max_new_tokens=24)):
        a, b = ref.generate("hello", **kw), fast.generate("hello", **kw)
        assert (a.token_ids, a.text, a.forwards, a.finish_reason) == (b.token_ids, b.text, b.forwards, b.finish_reason)
    assert fast._runtime is not None and fast._runtime.mode in ("while", "graph")
    assert "".join(fast.stream("hello", max_new_tokens=40, ignore_eos=True)) == \
        fast.generate("hello", max_new_tokens=40, ignore_eos=True).text


def test_llm_auto_engine_dgemma_on_cuda():
    """DiffusionGemma through `LLM(engine="auto")` on CUDA: the runtime (device loop, counter RNG)
    serves it, a seed repeats its text, and the reference decoder driven by the same counter stream
    gives the same tokens, text and forwards (float32)."""
    from test_llm_dgemma_engine import _key, _speaking

    from orl.engine.rules import CanvasRule
    ref = _speaking("reference", device="cuda", dtype="float32", rng="counter")
    fast = _speaking("auto", device="cuda", dtype="float32")
    assert fast.uses_runtime(fast.decode_config, 5)
    kw = dict(max_new_tokens=40, ignore_eos=True, seed=7, temperature=None)
    b = fast.generate("hello", **kw)
    assert isinstance(fast._runtime.rule, CanvasRule) and fast._runtime.mode in ("while", "graph")
    assert _key(fast.generate("hello", **kw)) == _key(b)
    a = ref.generate("hello", **kw)
    assert _key(a) == _key(b)


@pytest.mark.parametrize("mode", ["while", "graph"])
@pytest.mark.parametrize("family,rule", [("sdar", "threshold"), ("llada", "llada"), ("dgemma", "dgemma")])
def test_batch_sampled_equals_reference_on_cuda(family, rule, mode):
    """G = 4 rows of one prompt in one launch per block (device WHILE loop or graph + host loop),
    sampled from the counter stream, float64 on the GPU (compiled layers for the mask rules): the
    reference decoder on the same stream gives the same tokens and rounds; the capture (mask rules),
    copied to pinned host memory on a side stream, equals the reference trace."""
    import os  # noqa: PLC0415
    import sys  # noqa: PLC0415
    sys.path.insert(0, os.path.dirname(__file__))
    from test_engine_batch import _cfg, _model, _prompts, _same  # noqa: PLC0415

    from orl.decode import decode  # noqa: PLC0415
    from orl.decode.rng import CounterRNG  # noqa: PLC0415
    model = _model(family).cuda()
    K = model.config.block_size
    cfg = _cfg(rule, K, True)
    prompt = _prompts(1, 6, model.config.vocab_size, seed=4).cuda()
    cap = None if family == "dgemma" else 5
    ref = decode(model, prompt.expand(4, -1), cfg, rng=CounterRNG(5), trace=cap is not None, trace_logits=True)
    rt = Runtime(model, K, mode=mode, max_len=160, bucket=32, batch=4, sampler="torch")  # fused sampler: no fp64
    for _ in range(2):  # the second request replays the captured graphs
        out = rt.decode(prompt, cfg, seed=5, capture_topk=cap)
        _same(out, ref)
    assert len({tuple(t) for t in out.tokens}) >= 3
    if cap is not None:
        assert len(out.trace) == len(ref.trace)
        for a, b in zip(out.trace, ref.trace):
            assert torch.equal(a.canvas, b.canvas.cpu()) and torch.equal(a.committed, b.committed.cpu())
            assert torch.equal(a.topk_ids, torch.log_softmax(b.logits.float(), -1).topk(cap, -1)[1].cpu())
            if b.residual is not None:  # z is a soft embedding of float32 probabilities: float32 rounding
                torch.testing.assert_close(a.residual, b.residual.cpu(), rtol=0, atol=1e-5)  # H200: 1.1e-6


@pytest.mark.parametrize("mode", ["while", "graph"])
@pytest.mark.parametrize("rule,sampled,temp", [("threshold", True, 1.0), ("llada", True, 1.5), ("topk", False, 0.0)])
def test_fused_mask_sampler_equals_the_torch_one_on_cuda(rule, sampled, temp, mode):
    """The mask rules' fused logits pass on the GPU (float32 model, compiled layers, graphs):
    tokens, rounds, canvases and commits equal the torch sampler's; first-step statistics to 1e-5
    (tests/test_engine_batch.py)."""
    import os  # noqa: PLC0415
    import sys  # noqa: PLC0415
    sys.path.insert(0, os.path.dirname(__file__))
    from test_engine_batch import fused_vs_torch  # noqa: PLC0415
    fused_vs_torch(rule, sampled, temp, "cuda", mode)
