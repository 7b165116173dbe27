"""The engine runtime in eager mode (CPU) against the reference decoder: same tokens, same rounds
per block, under greedy decoding; its forward against the model's; refusals."""
import pytest
import torch

from orl.decode import DecodeConfig, decode
from orl.engine.forward import StaticKV, attention_bias, bake, embed, forward
from orl.engine.parity import teacher_forced
from orl.engine.runtime import EngineConfig, Runtime
from orl.model import build_model, get_config
from orl.model.masks import commit_layout, decode_layout, step_mask


def _model(size="tiny", pathway="mlp", **kw):
    # untied LM head: with tied random embeddings every position predicts its own input (the mask
    # token), which would make token equality trivial
    kw.setdefault("tie_embeddings", False)
    m = build_model(get_config("sdar", size, pathway=pathway, **kw), seed=1).eval()
    if m.residual_pathway is not None:  # make the pathway matter
        g = torch.Generator().manual_seed(1)
        torch.nn.init.normal_(m.residual_pathway.mlp.down_proj.weight, std=0.2, generator=g)
    return m


CASES = [  # (size, pathway, rule, steps, residual, fold[, tied])
    ("tiny", "mlp", "threshold", None, True, True),
    ("tiny", "mlp", "threshold", None, True, True, True),
    ("tiny", "mlp", "threshold", None, True, False),
    ("tiny", "mlp", "threshold", 3, True, True),      # quota schedule with a remainder
    ("tiny", "mlp", "topk", 4, True, True),
    ("tiny", "mlp", "threshold", None, False, True),
    ("tiny", "rcd", "threshold", None, True, True),
    ("tiny", "none", "threshold", None, True, False),
    ("small", "mlp", "threshold", None, True, True),
    ("small", "mlp", "topk", 8, True, False),
]


@pytest.mark.parametrize("case", CASES)
def test_runtime_matches_reference(case):
    size, pathway, rule, steps, residual, fold, *tied = case
    model = _model(size, pathway, tie_embeddings=bool(tied))
    K = model.config.block_size
    prompt = torch.randint(5, 60, (1, 7), generator=torch.Generator().manual_seed(0))
    cfg = DecodeConfig(rule=rule, block_size=K, max_new_tokens=3 * K - 2, threshold=0.05, steps=steps,
                       residual=residual)
    ref = decode(model, prompt, cfg)
    rt = Runtime(model, K, EngineConfig(mode="eager", max_len=128, fold_commit=fold, bucket=32))
    out = rt.decode(prompt, cfg)
    if not tied:
        assert len(set(ref.tokens[0])) >= 3, "degenerate test model: it predicts one token"
    assert out.tokens == ref.tokens
    assert out.steps_per_block == ref.steps_per_block
    assert out.block_tokens == ref.block_tokens
    assert out.finish_reason == ref.finish_reason
    assert out.tpf() == pytest.approx(ref.tpf())
    # a second request on the same runtime (buffers reused) gives the same answer
    assert rt.decode(prompt, cfg).tokens == ref.tokens


def test_eos_and_cancel_match_reference():
    model = _model()
    K = model.config.block_size
    prompt = torch.tensor([[7, 8, 9]])
    cfg = DecodeConfig(rule="threshold", block_size=K, max_new_tokens=4 * K, threshold=0.05)
    probe = decode(model, prompt, cfg)
    eos = probe.tokens[0][K + 2]
    rt = Runtime(model, K, mode="eager", max_len=128)
    ref, out = decode(model, prompt, cfg, eos_ids=[eos]), rt.decode(prompt, cfg, eos_ids=[eos])
    assert out.tokens == ref.tokens and out.finish_reason == ref.finish_reason == ["stop"]
    assert out.steps_per_block == ref.steps_per_block
    seen = []
    out = rt.decode(prompt, cfg, on_block=lambda b, t: seen.append(t.shape) or b < 1)
    ref = decode(model, prompt, cfg, on_block=lambda b, t: b < 1)
    assert out.tokens == ref.tokens and out.finish_reason == ref.finish_reason == ["cancelled"]
    assert seen == [(1, K), (1, K)]


@pytest.mark.parametrize("clean", ["block", "causal"])
def test_forward_matches_model_over_cache(clean):
    """The engine's forward (static cache, length mask, fused QKV / gate-up) gives the model's
    logits for a canvas after a prompt and one committed block, and writes the same keys."""
    model = _model("small", clean_attention=clean)
    cfg, K, P = model.config, model.config.block_size, 9
    g = torch.Generator().manual_seed(0)
    prompt, block = torch.randint(5, 60, (1, P), generator=g), torch.randint(5, 60, (1, K), generator=g)
    canvas = torch.full((1, K), cfg.mask_token_id)
    cache = model.new_cache(1, P + 2 * K)
    lay = commit_layout(P, 0, K, clean)
    model(prompt, lay.positions, lay.mask(), cache=cache, store_kv=True)
    lay = commit_layout(P, K, K, clean)
    model(block, lay.positions[P:], step_mask(lay, P), cache=cache, store_kv=True)
    lay = decode_layout(P, K, K, K, clean)
    ref = model(canvas, lay.positions[P + K:], step_mask(lay, P + K), cache=cache)

    w, kv = bake(model, max_len=64), StaticKV(cfg, 64, torch.float32, "cpu")
    start = torch.zeros(1, dtype=torch.long)
    forward(w, embed(w, prompt), start, torch.arange(1, P + 1), kv, 64, logits_from=None)
    start += P
    blk_lim = torch.full((K,), K) if clean == "block" else torch.arange(1, K + 1)
    lim = torch.cat([blk_lim, torch.full((K,), 2 * K)])  # the folded commit + first round
    got = forward(w, embed(w, torch.cat([block, canvas], 1)), start, lim, kv, 64, logits_from=K)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    for i in range(cfg.num_layers):
        torch.testing.assert_close(kv.k[i][:, :, :P + K], cache.k[i][:, :, :P + K], rtol=1e-5, atol=1e-5)


def test_attention_bias_is_the_layout_mask():
    K, P, S = 4, 5, 16
    start = torch.tensor([P])
    lim = torch.cat([torch.full((K,), K), torch.full((K,), 2 * K)])
    vis = attention_bias(start, lim, S, 1, torch.float32)[0, 0] == 0
    commit = step_mask(commit_layout(P, K, K), P)                      # (K, P + K)
    canvas = step_mask(decode_layout(P, K, K, K), P + K)               # (K, P + 2K)
    assert torch.equal(vis[:K, :P + K], commit) and not vis[:K, P + K:].any()
    assert torch.equal(vis[K:, :P + 2 * K], canvas) and not vis[K:, P + 2 * K:].any()


def test_refusals():
    model = _model()
    K = model.config.block_size
    rt = Runtime(model, K, mode="eager", max_len=32)
    with pytest.raises(NotImplementedError, match="SDAR rules"):
        rt.decode(torch.tensor([[5, 6]]), DecodeConfig(rule="entropy", block_size=K, max_new_tokens=K))
    with pytest.raises(ValueError, match="max_len"):
        rt.decode(torch.tensor([[5, 6]]), DecodeConfig(block_size=K, max_new_tokens=8 * K))
    with pytest.raises(ValueError, match="CUDA"):
        Runtime(model, K, mode="while")


@pytest.mark.parametrize("pathway", ["mlp", "none"])
def test_bf16_rounds_equal_reference_up_to_ties(pathway):
    """bf16: end-to-end tokens may part at a rounding tie; round by round they must not otherwise."""
    model = _model("small", pathway).to(torch.bfloat16)
    K = model.config.block_size
    cfg = DecodeConfig(rule="threshold", block_size=K, max_new_tokens=3 * K, threshold=0.05)
    rt = Runtime(model, K, mode="eager", max_len=128, bucket=32)
    p = teacher_forced(rt, model, torch.randint(5, 60, (1, 7), generator=torch.Generator().manual_seed(0)), cfg)
    assert p.ok(), p.unexplained
    assert p.max_rel_logit_err < 3e-2
    assert p.same_decision >= p.rounds // 2
