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
