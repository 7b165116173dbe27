"""The OpenAI features eval tools use, through the official `openai` client where it has them and raw
httpx for the rest: ``n`` and lists of prompts (choice numbering), token-id prompts, ``logprobs``
(each token's log-probability at the denoising step that committed it, checked against a forward
of our own), ``echo`` (and the lm-eval log-likelihood request it refuses), ``top_p``, unknown
fields ignored with a header, /v1/models/{id}, /tokenize, /detokenize, /metrics, empty prompts."""
import dataclasses
import logging
import math
import re

import httpx
import openai
import pytest
import torch

from orl import LLM
from orl.model.masks import decode_layout
from orl.serve.server import create_app
from test_server import MODEL, ServerThread, _post


@pytest.fixture(scope="module")
def llm(make_speaking_llm):
    return make_speaking_llm(MODEL)


@pytest.fixture(scope="module")
def server(llm):
    with ServerThread(create_app(llm, MODEL, queue_size=8)) as s:
        yield s


@pytest.fixture()
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=30)


OK = {"model": MODEL, "prompt": "hi", "max_tokens": 8}


# --------------------------------------------------------------------------- prompts and choices
def test_prompt_lists_and_n_number_choices_as_openai(llm, client):
    """choice index = prompt * n + sample; each prompt's n samples are the LLM's generate_n; the
    prompt tokens are counted once per prompt."""
    prompts = ["hello", "abc"]
    r = client.completions.create(model=MODEL, prompt=prompts, n=2, max_tokens=8, temperature=1.0, seed=5)
    want = [g for p in prompts for g in llm.generate_n(p, 2, max_new_tokens=8, temperature=1.0, seed=5)]
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert [c.text for c in r.choices] == [g.text for g in want]
    assert r.usage.prompt_tokens == 5 + 3 and r.usage.completion_tokens == sum(g.completion_tokens for g in want)


def test_token_id_prompts_equal_their_text(llm, client):
    ids = llm.encode("hello")
    text = llm.generate("hello", max_new_tokens=8).text
    assert client.completions.create(model=MODEL, prompt=ids, max_tokens=8).choices[0].text == text
    r = client.completions.create(model=MODEL, prompt=[ids, llm.encode("abc")], max_tokens=8)
    assert [c.text for c in r.choices] == [text, llm.generate("abc", max_new_tokens=8).text]


EMPTY = [  # (path, body, param, code)
    ("completions", {**OK, "prompt": ""}, "prompt", "empty_prompt"),
    ("completions", {**OK, "prompt": []}, "prompt", "empty_prompt"),
    ("completions", {**OK, "prompt": ["a", ""]}, "prompt[1]", "empty_prompt"),
    ("completions", {**OK, "prompt": [[5, 6], []]}, "prompt[1]", "empty_prompt"),
    ("chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": ""}]}, "messages", "empty_prompt"),
    ("completions", {**OK, "prompt": [5, 90]}, "prompt", None),  # 90: outside the vocabulary of 90
    ("completions", {**OK, "prompt": [5, True]}, "prompt", "invalid_value"),
]


@pytest.mark.parametrize("path,body,param,code", EMPTY, ids=[str(i) for i in range(len(EMPTY))])
def test_empty_and_bad_prompts_are_400(server, path, body, param, code):
    r = _post(f"{server.url}/v1/{path}", body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["param"], err["code"]) == (param, code) and err["message"]


# --------------------------------------------------------------------------- log-probabilities
def test_logprobs_are_the_committing_steps(llm):
    """With threshold 0 every token of a block commits at its first step (all K masked), so the
    first block's log-probabilities are one forward's log-softmax, computed here independently."""
    saved = llm.decode_config
    llm.decode_config = dataclasses.replace(saved, threshold=0.0)
    try:
        g = llm.generate("hello", max_new_tokens=8, logprobs=2, ignore_eos=True)
    finally:
        llm.decode_config = saved
    ids, K, cfg = llm.encode("hello"), llm.block_size, llm.model.config
    P = len(ids)
    lay = decode_layout(P, 0, K, K, cfg.clean_attention)
    tokens = torch.tensor([ids + [cfg.mask_token_id] * K])
    where = torch.arange(P + K)[None] >= P
    with torch.no_grad():
        logp = torch.log_softmax(llm.model(tokens, lay.positions, lay.mask(), residual_where=where)[0, P:].float(), -1)
    want = logp[torch.arange(K), torch.tensor(g.token_ids)]
    torch.testing.assert_close(torch.tensor(g.logprobs), want, rtol=0, atol=1e-5)
    top = logp.topk(2, -1)
    assert [[i for i, _ in t] for t in g.top_logprobs] == top.indices.tolist()


def test_greedy_logprobs_are_each_steps_argmax_and_text_is_unchanged(llm):
    """Greedy: each committed token is the argmax of its step, for every family's rule (threshold
    steps, LLaDA's edits, DiffusionGemma's final argmax). Asking for logprobs changes no text."""
    for model in (llm, LLM("llada/tiny"), LLM("dgemma/tiny")):
        g = model.generate("hello", max_new_tokens=16, logprobs=3, ignore_eos=True)
        assert g.text == model.generate("hello", max_new_tokens=16, ignore_eos=True).text
        assert len(g.logprobs) == len(g.top_logprobs) == g.completion_tokens == 16
        for t, lp, top in zip(g.token_ids, g.logprobs, g.top_logprobs):
            assert (t, lp) == top[0] and lp <= 0 and top[0][1] >= top[1][1] >= top[2][1]
    sampled = llm.generate_n("hello", 2, max_new_tokens=16, temperature=1.0, seed=9, logprobs=0)
    assert [g.text for g in sampled] == [g.text for g in llm.generate_n("hello", 2, max_new_tokens=16,
                                                                         temperature=1.0, seed=9)]
    assert all(len(g.logprobs) == g.completion_tokens and g.top_logprobs[0] == [] for g in sampled)


def test_logprobs_on_the_runtime_keep_the_runtimes_text():
    """A log-probability request the runtime would decode runs on the reference decoder with the
    runtime's counter stream: a sampled, seeded text is the runtime's."""
    rt = LLM("sdar/tiny", engine="runtime", engine_max_len=64)
    kw = dict(max_new_tokens=16, temperature=1.0, seed=3, ignore_eos=True)
    assert rt.uses_runtime(dataclasses.replace(rt.decode_config, max_new_tokens=16, temperature=1.0), 5)
    assert rt.generate("hello", logprobs=1, **kw).text == rt.generate("hello", **kw).text


def test_completion_logprobs_shape(llm, client):
    r = client.completions.create(model=MODEL, prompt="hello", max_tokens=8, temperature=0, logprobs=2)
    g = llm.generate("hello", max_new_tokens=8, logprobs=2)
    lp = r.choices[0].logprobs
    names = llm.token_strings(g.token_ids)
    assert lp.tokens == names and lp.token_logprobs == pytest.approx(g.logprobs, abs=1e-6)
    assert lp.text_offset == [sum(len(s) for s in names[:i]) for i in range(len(names))]
    for t, d in zip(names, lp.top_logprobs):  # the 2 most probable, the chosen (greedy: the first) among them
        assert len(d) == 2 and d[t] == max(d.values())


def test_chat_logprobs_through_the_client(llm, client):
    msgs = [{"role": "user", "content": "hi"}]
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8, temperature=0, logprobs=True,
                                       top_logprobs=3)
    g = llm.generate(msgs, max_new_tokens=8, logprobs=3)
    content = r.choices[0].logprobs.content
    assert [c.token for c in content] == llm.token_strings(g.token_ids)
    assert [c.logprob for c in content] == pytest.approx(g.logprobs, abs=1e-6)
    assert all(c.bytes == list(c.token.encode()) and len(c.top_logprobs) == 3 and
               c.top_logprobs[0].logprob == c.logprob for c in content)
    with pytest.raises(openai.BadRequestError, match="top_logprobs needs logprobs=true"):
        client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8, top_logprobs=2)
    with pytest.raises(openai.BadRequestError, match="stream"):
        client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8, logprobs=True, stream=True)


# --------------------------------------------------------------------------- echo, lm-eval's requests
def test_echo(llm, client):
    g = llm.generate("hello", max_new_tokens=8)
    assert client.completions.create(model=MODEL, prompt="hello", max_tokens=8, echo=True).choices[0].text \
        == "hello" + g.text
    r = client.completions.create(model=MODEL, prompt=["hello", "ab"], max_tokens=0, echo=True)
    assert [c.text for c in r.choices] == ["hello", "ab"] and r.usage.completion_tokens == 0
    chunks = list(client.completions.create(model=MODEL, prompt="hello", max_tokens=8, echo=True, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == "hello" + g.text


def test_lm_eval_requests(server):
    """lm-eval's local-completions payloads (lm_eval/models/openai_completions.py): generate_until
    is served; loglikelihood (echo + logprobs) is a 400 that names what is unsupported."""
    gen = {"prompt": ["Q: 1+1=?\nA:"], "model": MODEL, "max_tokens": 16, "temperature": 0,
           "stop": ["\n\n", "Q:"], "seed": 1234}
    r = _post(server.url + "/v1/completions", gen)
    assert r.status_code == 200 and [c["index"] for c in r.json()["choices"]] == [0]
    ll = {"model": MODEL, "prompt": ["Q: 1+1=?\nA:", "Q: 1+1=?\nA: 2"], "temperature": 0, "max_tokens": 1,
          "logprobs": 1, "seed": 1234, "echo": True}
    r = _post(server.url + "/v1/completions", ll)
    err = r.json()["error"]
    assert r.status_code == 400 and (err["param"], err["code"]) == ("echo", "unsupported")
    assert "log-likelihood" in err["message"] and "generate_until" in err["message"]


# --------------------------------------------------------------------------- top_p
def test_top_p_tiny_is_greedy(llm, client):
    """A nucleus of one token is the argmax: every seed samples the same text, and with threshold 0
    (every position commits at its first step, so the filtered confidence cannot reorder commits)
    it is the greedy text. top_p 1 samples differ."""
    kw = dict(model=MODEL, prompt="hello", max_tokens=16, temperature=1.5, n=4, extra_body={"ignore_eos": True})
    tiny = [c.text for s in (1, 2) for c in client.completions.create(**kw, seed=s, top_p=1e-6).choices]
    assert len(set(tiny)) == 1
    assert len({c.text for c in client.completions.create(**kw, seed=1).choices}) > 1
    saved = llm.decode_config
    llm.decode_config = dataclasses.replace(saved, threshold=0.0)
    try:
        g = llm.generate("hello", max_new_tokens=16, temperature=1.5, top_p=1e-6, seed=4, ignore_eos=True)
        assert g.text == llm.generate("hello", max_new_tokens=16, temperature=0, ignore_eos=True).text
    finally:
        llm.decode_config = saved


# --------------------------------------------------------------------------- unknown fields
def test_unknown_fields_are_ignored_with_a_header(server, client, caplog):
    with caplog.at_level(logging.WARNING, logger="orl.serve.server"):
        raw = client.completions.with_raw_response.create(model=MODEL, prompt="hi", max_tokens=8,
                                                          extra_body={"frobnicate": 1, "best_of_luck": "x"})
        assert raw.headers["x-ignored-fields"] == "frobnicate, best_of_luck"
        assert raw.parse().choices[0].text == client.completions.create(model=MODEL, prompt="hi",
                                                                        max_tokens=8).choices[0].text
        client.completions.create(model=MODEL, prompt="hi", max_tokens=8, extra_body={"frobnicate": 2})
    assert sum("frobnicate" in r.getMessage() for r in caplog.records) == 1  # logged once
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi", "x": 1}], "max_tokens": 8,
            "stream_options": {"include_usage": True, "y": 2}, "stream": True}
    r = _post(server.url + "/v1/chat/completions", body)
    assert r.status_code == 200 and r.headers["x-ignored-fields"] == "stream_options.y, messages[0].x"
    assert "x-ignored-fields" not in _post(server.url + "/v1/completions", OK).headers


# --------------------------------------------------------------------------- the other endpoints
def test_model_by_id(client):
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.models.retrieve("gpt-4")


def test_tokenize_and_detokenize(llm, server):
    msgs = [{"role": "user", "content": "hi"}]
    r = _post(server.url + "/tokenize", {"model": MODEL, "prompt": "hello", "return_token_strs": True}).json()
    assert r == {"count": 5, "max_model_len": 512, "tokens": llm.encode("hello"), "token_strs": list("hello")}
    assert _post(server.url + "/tokenize", {"messages": msgs}).json()["tokens"] == llm.encode(msgs)
    assert _post(server.url + "/tokenize", {"prompt": ""}).json()["count"] == 0
    back = _post(server.url + "/detokenize", {"model": MODEL, "tokens": r["tokens"]}).json()
    assert back == {"prompt": "hello"}
    bad = [("/tokenize", {"prompt": "a", "messages": msgs}, 400, "prompt"),
           ("/tokenize", {"prompt": 5}, 400, "prompt"),
           ("/tokenize", {"model": "gpt-4", "prompt": "a"}, 404, "model"),
           ("/detokenize", {"tokens": [1, 999]}, 400, "tokens"),
           ("/detokenize", {"tokens": "12"}, 400, "tokens")]
    for path, body, status, param in bad:
        r = _post(server.url + path, body)
        assert (r.status_code, r.json()["error"]["param"]) == (status, param), (path, body, r.text)


_SAMPLE = re.compile(r'^([a-z_]+)(\{.*\})? (\S+)$')


def _scrape(server) -> dict[str, float]:
    r = httpx.get(server.url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out = {}
    for line in r.text.splitlines():
        if line.startswith("#"):
            assert re.match(r"^# (HELP|TYPE) [a-z_]+ \S", line), line
            continue
        m = _SAMPLE.match(line)
        assert m, line
        out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def test_metrics_count_requests_latency_tokens_and_tpf(server):
    before = _scrape(server)
    bodies = [{**OK, "prompt": "hello", "max_tokens": 16}, {**OK, "prompt": "abc", "max_tokens": 8}]
    got = [_post(server.url + "/v1/completions", b).json() for b in bodies]
    assert _post(server.url + "/v1/completions", {**OK, "max_tokens": -1}).status_code == 400
    after = _scrape(server)

    def delta(key):
        return after.get(key, 0) - before.get(key, 0)

    assert delta('orl_http_requests_total{endpoint="/v1/completions",status="200"}') == 2
    assert delta('orl_http_requests_total{endpoint="/v1/completions",status="400"}') == 1
    assert delta("orl_request_latency_seconds_count") == 2 and delta('orl_scheduler_requests_total{outcome="completed"}') == 2
    assert delta('orl_request_latency_seconds_bucket{le="+Inf"}') == 2
    assert delta("orl_request_latency_seconds_sum") >= sum(j["metrics"]["latency_s"] for j in got)
    assert delta("orl_completion_tokens_total") == sum(j["usage"]["completion_tokens"] for j in got)
    assert delta("orl_prompt_tokens_total") == 5 + 3
    tokens = sum(round(j["metrics"]["tpf"] * j["metrics"]["forwards"]) for j in got)
    assert delta("orl_decoded_tokens_total") == tokens
    assert delta("orl_model_forwards_total") == sum(j["metrics"]["forwards"] for j in got)
    assert after["orl_tokens_per_forward"] == pytest.approx(after["orl_decoded_tokens_total"] /
                                                            after["orl_model_forwards_total"])
    assert after["orl_tokens_per_second"] > 0 and math.isfinite(after["orl_tokens_per_second"])
    buckets = [v for k, v in after.items() if k.startswith("orl_request_latency_seconds_bucket")]
    assert buckets == sorted(buckets)  # cumulative


def test_metrics_parse_as_prometheus(server):
    parser = pytest.importorskip("prometheus_client.parser")
    families = {f.name: f for f in parser.text_string_to_metric_families(httpx.get(server.url + "/metrics").text)}
    assert families["orl_request_latency_seconds"].type == "histogram"
    assert families["orl_http_requests"].type == "counter" and families["orl_tokens_per_forward"].type == "gauge"
