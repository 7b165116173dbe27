"""`LLM(engine="runtime")` on a tiny random DiffusionGemma (CPU, eager runtime) against the reference decoder.

The DiffusionGemma runtime draws its random numbers (starting canvas, samples, re-noising) from its
counter RNG, the reference decoder from a torch.Generator, so the same seed gives the two engines
different texts. "The same result" is therefore checked on the same stream: the reference decoder
with ``LLM(rng="counter")`` (`orl.decode.rng.CounterRNG`, as tests/test_engine_dgemma.py uses) must give the
runtime's tokens, text, forwards and finish reason through `LLM.generate`, `LLM.stream`, stop strings,
EOS and cancellation -- sampled, greedy and with early stopping. Also: a seed gives the runtime the
same text on every repeat (and unseeded greedy is seed 0); requests the runtime cannot serve (too
long for ``engine_max_len``, another block size, a model shape it is not built for, engine "auto" on
the CPU) go to the reference decoder and give its text.
"""
import dataclasses
import math

import pytest
import torch

from orl import LLM
from orl.engine.rules import CanvasRule
from holding import held_after_text

STEPS = 6  # rounds per canvas: keeps each request to a few dozen tiny forwards


def _speaking(engine: str = "reference", **kw) -> LLM:
    """dgemma/tiny (char tokenizer, canvas 16) with weights of tests/test_engine_dgemma.py's scales:
    logits spread enough that the entropy bound accepts several positions a round and a low
    temperature schedule stops a canvas early (the default random init gives near-uniform logits)."""
    llm = LLM("dgemma/tiny", engine=engine, steps=STEPS, **kw)
    g = torch.Generator().manual_seed(100)
    with torch.no_grad():
        for name, p in llm.model.named_parameters():
            if name.endswith("embed_tokens.weight"):
                new = torch.randn(p.shape, generator=g) * 0.3
            elif name.endswith(("q_norm.weight", "k_norm.weight")):
                new = 0.4 + 0.4 * torch.rand(p.shape, generator=g)
            elif p.ndim == 1:
                new = 0.5 + torch.rand(p.shape, generator=g)
            elif name.endswith("moe.gate.weight"):
                new = torch.randn(p.shape, generator=g) * 2.0
            else:
                new = torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1])
            p.copy_(new)
        for layer in llm.model.model.layers:
            layer.layer_scalar.copy_(0.5 + torch.rand(1, generator=g))
            layer.canvas_layer_scalar.copy_(0.5 + torch.rand(1, generator=g))
    return llm


@pytest.fixture(scope="module")
def pair():
    """(reference on the runtime's counter stream, runtime) LLMs over the same weights."""
    return _speaking("reference", rng="counter"), _speaking("runtime")


def _key(g):
    return g.token_ids, g.text, g.forwards, g.forwards_no_commit, g.finish_reason


CASES = {  # name: generate kwargs (every case seeded: the counter stream needs the seed)
    "sampled, protocol schedule": dict(max_new_tokens=48, ignore_eos=True, seed=11, temperature=None),
    "greedy": dict(max_new_tokens=40, ignore_eos=True, seed=3),
    "greedy, unseeded (seed 0)": dict(max_new_tokens=32, ignore_eos=True),
    "sampled, budget inside a canvas": dict(max_new_tokens=21, ignore_eos=True, seed=5, temperature=1.0),
}


@pytest.mark.parametrize("name", list(CASES))
def test_runtime_equals_reference_on_the_same_stream(pair, name):
    ref, fast = pair
    kw = CASES[name]
    assert fast.uses_runtime(fast.decode_config, 5) and not ref.uses_runtime(ref.decode_config, 5)
    b = fast.generate("hello", **kw)
    assert isinstance(fast._runtime.rule, CanvasRule)  # the runtime really decoded
    a = ref.generate("hello", **kw)
    assert _key(a) == _key(b)
    assert len(set(b.token_ids)) >= 4 and b.text, "degenerate test model"
    assert b.completion_tokens == kw["max_new_tokens"] and b.finish_reason == "length"
    n_blocks = math.ceil(kw["max_new_tokens"] / fast.block_size)
    assert b.forwards == b.forwards_no_commit + n_blocks and b.forwards_no_commit <= n_blocks * STEPS


def test_early_stop_and_eos_equal(pair):
    """A low temperature schedule stops canvases before the last round; a token of the second
    canvas made the EOS ends the request there; both as the reference decoder on the same stream."""
    ref, fast = pair
    kw = dict(max_new_tokens=48, seed=2, temperature=1.0)
    saved_cfg = ref.decode_config
    ref.decode_config = fast.decode_config = dataclasses.replace(saved_cfg, t_min=0.01, t_max=0.02)
    try:
        b = fast.generate("hello", ignore_eos=True, **kw)
        a = ref.generate("hello", ignore_eos=True, **kw)
        assert _key(a) == _key(b)
        assert b.forwards_no_commit < 3 * STEPS  # some canvas stopped early
        eos = b.token_ids[16 + 3]
        saved = ref.eos_ids, fast.eos_ids
        ref.eos_ids = fast.eos_ids = [eos]
        try:
            b = fast.generate("hello", **kw)
            a = ref.generate("hello", **kw)
        finally:
            ref.eos_ids, fast.eos_ids = saved
        assert _key(a) == _key(b)
        assert b.finish_reason == "stop" and eos not in b.token_ids and len(b.token_ids) <= 16 + 3
        assert b.forwards == b.forwards_no_commit + 2  # two canvases, not three
    finally:
        ref.decode_config = fast.decode_config = saved_cfg


def test_seed_is_deterministic(pair):
    _, fast = pair
    kw = dict(max_new_tokens=32, temperature=1.0, ignore_eos=True)
    a = fast.generate("abc", seed=7, **kw)
    assert fast.generate("abc", seed=7, **kw).token_ids == a.token_ids
    assert "".join(fast.stream("abc", seed=7, **kw)) == a.text
    assert fast.generate("abc", seed=8, **kw).token_ids != a.token_ids
    # greedy still draws the canvas at random: without a seed it is seed 0, every time
    g = fast.generate("abc", max_new_tokens=32, ignore_eos=True)
    assert g.token_ids == fast.generate("abc", max_new_tokens=32, ignore_eos=True, seed=0).token_ids
    assert g.token_ids == fast.generate("abc", max_new_tokens=32, ignore_eos=True).token_ids
    # any 64-bit request seed (the server's range) maps into the runtime's [0, 2^62)
    for s in (-1, (1 << 64) - 1):
        assert fast.generate("abc", seed=s, **kw).token_ids == fast.generate("abc", seed=s, **kw).token_ids
    # unseeded sampling draws its seed from torch's global RNG, as the reference decoder does: this
    # checks that documented behaviour, so it seeds the global RNG on purpose (in a fork of it, so
    # the state other tests see is untouched)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(4)
        u = fast.generate("abc", **kw).token_ids
        torch.manual_seed(4)
        assert fast.generate("abc", **kw).token_ids == u
        torch.manual_seed(5)
        assert fast.generate("abc", **kw).token_ids != u  # the global RNG really decides


def test_stop_strings_streaming_and_cancellation(pair):
    ref, fast = pair
    kw = dict(max_new_tokens=48, ignore_eos=True, seed=9, temperature=1.0)
    full = fast.generate("hello", **kw)
    stop = full.text[20:22]
    cut = full.text.find(stop)
    g = fast.generate("hello", stop=[stop, "never!"], **kw)
    assert g.finish_reason == "stop" and g.text == full.text[:cut]
    assert _key(ref.generate("hello", stop=[stop, "never!"], **kw)) == _key(g)
    assert g.forwards < full.forwards  # the canvases after the one holding the stop string never ran
    s = fast.stream("hello", stop=stop, **kw)
    parts = list(s)
    assert "".join(parts) == g.text == s.result.text and s.result.token_ids == g.token_ids
    parts = list(fast.stream("hello", **kw))
    assert len(parts) > 1 and "".join(parts) == full.text  # one increment per committed canvas
    with held_after_text(fast), fast.stream("hello", max_new_tokens=400, ignore_eos=True, seed=9) as s:
        next(s)
    assert s.result.finish_reason == "cancelled" and s.result.completion_tokens < 400
    seen = []
    g = fast.generate("hello", on_text=lambda d: seen.append(d) is not None, **kw)
    assert g.finish_reason == "cancelled" and len(seen) == 1 and g.completion_tokens == fast.block_size


def test_unservable_requests_fall_back_to_the_reference():
    """Too long for the runtime's KV cache (engine_max_len), a block size other than the model's
    canvas, a model shape the runtime's CanvasRule does not reproduce, engine "auto" on the CPU: the reference
    decoder runs (torch.Generator stream: the plain reference's text)."""
    ref = _speaking("reference")
    cases = {"engine_max_len": _speaking("runtime", engine_max_len=64),
             "block size": _speaking("runtime", block_size=8),
             "auto on CPU": _speaking("auto")}
    kw = dict(max_new_tokens=48, ignore_eos=True, seed=5, temperature=1.0)
    want = {"engine_max_len": ref.generate("hello", **kw),
            "block size": _speaking("reference", block_size=8).generate("hello", **kw),
            "auto on CPU": ref.generate("hello", **kw)}
    for name, m in cases.items():
        assert not m.uses_runtime(dataclasses.replace(m.decode_config, max_new_tokens=48), 5), name
        assert _key(m.generate("hello", **kw)) == _key(want[name]), name
        assert m._runtime is None, name
    # the short request fits engine_max_len=64 (5 + 16 + 16 <= 64) and goes to the runtime
    short = cases["engine_max_len"]
    assert short.uses_runtime(dataclasses.replace(short.decode_config, max_new_tokens=16), 5)
    short.generate("hello", max_new_tokens=16, seed=5)
    assert isinstance(short._runtime.rule, CanvasRule)
    # a uniform-noise model whose self-conditioning input goes only to re-noised positions
    m = _speaking("runtime")
    m.model.config = dataclasses.replace(m.model.config, pathway_where="unresolved")
    assert not m.uses_runtime(m.decode_config, 5)
