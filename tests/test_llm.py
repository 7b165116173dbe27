"""The `LLM` API on tiny random models: generate == stream, stop strings, cancellation, length
errors, chat templates, and the incremental-text rules (EOS / budget cut, stop-prefix hold-back)."""
import dataclasses

import pytest

from orl import LLM
from orl.serve.llm import ContextLengthError, _IncrementalText
from orl.tokenizer import build_char_tokenizer
from holding import held_after_text


@pytest.fixture(scope="module")
def llm(make_speaking_llm):
    return make_speaking_llm()


def test_generate_equals_stream_greedy(llm):
    g = llm.generate("hello", max_new_tokens=40, ignore_eos=True)
    assert g.text and g.finish_reason == "length" and g.completion_tokens == 40
    s = llm.stream("hello", max_new_tokens=40, ignore_eos=True)
    parts = list(s)
    assert len(parts) > 1  # one increment per committed block, not one lump
    assert "".join(parts) == g.text == s.result.text
    assert s.result.token_ids == g.token_ids
    assert g.forwards >= 40 // llm.block_size and 0 < g.tpf_no_commit and g.tpf < g.tpf_no_commit
    assert g.prompt_tokens == 5 and g.latency_s > 0 and g.request_tps > 0


@pytest.mark.parametrize("name", ["sdar/tiny", "llada/tiny", "dgemma/tiny"])
def test_families_seeded_and_greedy_deterministic(name):
    m = LLM(name)
    a = m.generate("abc", max_new_tokens=16, temperature=1.0, seed=7)
    b = m.generate("abc", max_new_tokens=16, temperature=1.0, seed=7)
    s = m.stream("abc", max_new_tokens=16, temperature=1.0, seed=7)
    assert a.text == b.text == "".join(s)
    assert a.finish_reason == ("length" if a.completion_tokens == 16 else "stop")  # EOS ends it early
    # greedy is deterministic without a seed, even where the starting canvas is random (dgemma)
    assert m.generate("abc", max_new_tokens=16).token_ids == m.generate("abc", max_new_tokens=16).token_ids


def test_stop_strings(llm):
    full = llm.generate("hello", max_new_tokens=64, temperature=1.0, seed=3, ignore_eos=True).text
    stop = full[20:23]
    cut = full.find(stop)
    g = llm.generate("hello", max_new_tokens=64, temperature=1.0, seed=3, ignore_eos=True, stop=[stop, "never!"])
    assert g.finish_reason == "stop" and g.text == full[:cut]
    # the completion ids are the shortest prefix that produces the kept text
    assert len(llm._text(g.token_ids)) >= cut > len(llm._text(g.token_ids[:-1]))
    streamed = "".join(llm.stream("hello", max_new_tokens=64, temperature=1.0, seed=3, ignore_eos=True, stop=stop))
    assert streamed == g.text


def test_cancel_stream_at_block_boundary(llm):
    with held_after_text(llm), llm.stream("hello", max_new_tokens=400, ignore_eos=True) as s:
        next(s)
    g = s.result
    assert g.finish_reason == "cancelled" and g.completion_tokens < 400


def test_cancel_flag_and_on_text_false(llm):
    seen = []
    g = llm.generate("hello", max_new_tokens=200, ignore_eos=True, on_text=lambda d: seen.append(d) is not None)
    assert g.finish_reason == "cancelled" and len(seen) == 1 and g.completion_tokens == llm.block_size


def test_prompt_too_long(llm):
    with pytest.raises(ValueError, match="prompt has 600 tokens but the model context is 512"):
        llm.generate("a" * 600)
    with pytest.raises(ValueError, match="600 tokens"):
        llm.stream("a" * 600)  # raised at once, not from the worker thread
    with pytest.raises(ContextLengthError, match="exceeds the model context of 512") as e:
        llm.generate("a" * 100, max_new_tokens=500)
    assert e.value.param == "max_new_tokens"
    assert llm.max_new_tokens_fit(100) == 408


def test_chat_messages_use_the_template(llm):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    rendered = llm.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    g = llm.generate(msgs, max_new_tokens=16, ignore_eos=True)
    assert g.prompt_tokens == len(llm.tokenizer.encode(rendered, add_special_tokens=False))
    assert g.text == llm.generate(rendered, max_new_tokens=16, ignore_eos=True).text
    tok = build_char_tokenizer()
    tok.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        LLM("sdar/tiny", tokenizer=tok).generate(msgs)


def test_unknown_model_names_the_sizes():
    with pytest.raises(ValueError, match="neither a checkpoint directory nor a named size.*sdar/tiny"):
        LLM("no-such-model")


def _chars(ids):
    return "".join(chr(ord("a") + i) for i in ids)


def test_incremental_text_rules():
    t = _IncrementalText(_chars, max_new_tokens=10, eos_ids=[25], stops=["cd"])
    assert t.add([0, 1, 2]) == "ab"          # "c" held back: it may start the stop string "cd"
    assert t.add([3, 4]) == "" and t.stopped  # "abcd..." -> stop at "cd"
    assert t.flush() == "" and t.text == "ab" and t.completion_ids() == [0, 1]
    t = _IncrementalText(_chars, max_new_tokens=10, eos_ids=[25], stops=["cd"])
    assert t.add([0, 2]) == "a" and t.add([4, 25, 5]) == "ce" and t.hit_eos and t.ids == [0, 2, 4]
    t = _IncrementalText(_chars, max_new_tokens=3, eos_ids=[], stops=[])
    assert t.add([0, 1]) == "ab" and t.add([2, 3, 4]) == "c" and t.full
    t = _IncrementalText(lambda ids: "x\ufffd" if len(ids) == 1 else "xy", 5, [], [])
    assert t.add([1]) == "x" and t.add([2]) == "y"  # a half character waits for the next block


def test_generate_cli_prints_text_and_report(capsys):
    from orl.cli import main
    args = ["generate", "--model", "sdar/tiny", "--max-new-tokens", "16", "--temperature", "1", "--seed", "4",
            "--set", "threshold=0.5", "hello"]
    assert main(args) == 0
    plain = capsys.readouterr()
    assert main(args[:1] + ["--stream"] + args[1:]) == 0
    streamed = capsys.readouterr()
    assert plain.out == streamed.out and plain.out.strip()
    assert "TPF" in plain.err and "forwards" in plain.err and "tokens/s" in plain.err and "latency" in plain.err
    assert main(["generate", "--model", "sdar/tiny", "--max-new-tokens", "9999", "x"]) == 1
    assert "exceeds the model context" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["sdar/tiny", "llada/tiny"])
def test_runtime_engine_equals_reference(make_speaking_llm, name):
    """`engine="runtime"` (the fast runtime, eager on the CPU) gives the reference decoder's text,
    tokens, forwards and finish reasons through generate, stream, stop strings and cancellation."""
    ref = make_speaking_llm(name)
    fast = make_speaking_llm(name)
    fast.engine = "runtime"
    assert fast.uses_runtime(fast.decode_config, 5) and not ref.uses_runtime(ref.decode_config, 5)
    for kw in (dict(max_new_tokens=40, ignore_eos=True), dict(max_new_tokens=24)):
        a, b = ref.generate("hello", **kw), fast.generate("hello", **kw)
        assert (a.token_ids, a.text, a.forwards, a.finish_reason) == (b.token_ids, b.text, b.forwards, b.finish_reason)
    assert fast._runtime is not None                    # the runtime really decoded
    stop = ref.generate("hello", max_new_tokens=40, ignore_eos=True).text[5:7]
    assert fast.generate("hello", max_new_tokens=40, ignore_eos=True, stop=stop).text == \
        ref.generate("hello", max_new_tokens=40, ignore_eos=True, stop=stop).text
    full = fast.generate("hello", max_new_tokens=40, ignore_eos=True).text
    assert "".join(fast.stream("hello", max_new_tokens=40, ignore_eos=True)) == full
    with held_after_text(fast), fast.stream("hello", max_new_tokens=400, ignore_eos=True) as s:
        next(s)
    assert s.result.finish_reason == "cancelled" and s.result.completion_tokens < 400
    # sampled requests run in the runtime's graph, from the counter stream: with rng="counter" the
    # reference decoder draws the same numbers and gives the same text
    assert fast.uses_runtime(dataclasses.replace(fast.decode_config, temperature=1.0), 5)
    ref.rng = "counter"
    s1 = fast.generate("hello", max_new_tokens=16, temperature=1.0, seed=3)
    assert s1.token_ids == ref.generate("hello", max_new_tokens=16, temperature=1.0, seed=3).token_ids
    assert s1.token_ids != fast.generate("hello", max_new_tokens=16, temperature=1.0, seed=4).token_ids


@pytest.mark.parametrize("engine", ["reference", "runtime"])
def test_generate_n_samples_one_batch(make_speaking_llm, engine):
    """`generate_n` (OpenAI's n): n samples of one prompt in one batched decode. On the counter
    stream sample r is the single request with seed + r, through the runtime (B = n rows in one
    launch per block) and the reference decoder alike; stop strings and EOS act per sample."""
    llm = make_speaking_llm("sdar/tiny")
    llm.engine, llm.rng = engine, "counter"
    kw = dict(max_new_tokens=24, temperature=1.0, ignore_eos=True)
    gens = llm.generate_n("hello", 3, seed=7, **kw)
    assert len(gens) == 3 and len({tuple(g.token_ids) for g in gens}) >= 2
    for r, g in enumerate(gens):
        one = llm.generate("hello", seed=7 + r, **kw)
        assert (g.token_ids, g.text, g.forwards) == (one.token_ids, one.text, one.forwards)
    assert (engine == "runtime") == (3 in llm._runtimes)
    stop = gens[1].text[3:5]
    cut = llm.generate_n("hello", 3, seed=7, stop=stop, **kw)
    assert cut[1].finish_reason == "stop" and cut[1].text == gens[1].text[:gens[1].text.find(stop)]
    with pytest.raises(ValueError, match="positive"):
        llm.generate_n("hello", 0)


def test_engine_name_checked():
    with pytest.raises(ValueError, match="engine must be one of"):
        LLM("sdar/tiny", engine="fast")
