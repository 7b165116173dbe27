"""The HTTP server, for real: uvicorn on a free loopback port in a thread, a tiny random model,
the official `openai` client for the happy paths and raw httpx for malformed requests, queueing
(FIFO order, 429 when full), disconnect cancellation and recovery from a failed decode."""
import json
import socket
import threading
import time

import httpx
import openai
import pytest
import uvicorn

from orl.serve.server import create_app, server_config
from holding import held_after_text

MODEL = "sdar/tiny"


class ServerThread:
    """uvicorn serving ``app`` from a background thread on a pre-bound free loopback port."""

    def __init__(self, app):
        self.app = app
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(server_config(app, log_level="warning"))  # the guards `orl serve` runs with
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self):
        self.thread.start()
        _until(lambda: self.server.started and self.app.state.scheduler.ready.is_set(), 60)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()


def _until(cond, timeout=10.0):
    """Poll ``cond`` until it holds; fail after ``timeout`` s (a deadline, not an assumed ordering)."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise TimeoutError("condition not reached")
        time.sleep(0.01)


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


class Gate:
    """Blocks every model forward until opened: holds the decoder busy so requests queue up."""

    def __init__(self, llm):
        self.event = threading.Event()
        self.handle = llm.model.register_forward_pre_hook(lambda mod, args: self.event.wait(30) and None)

    def open(self):
        self.event.set()
        self.handle.remove()


def _post(url, body, **kw):
    return httpx.post(url, content=body if isinstance(body, (bytes, str)) else json.dumps(body),
                      headers=kw.pop("headers", {"Content-Type": "application/json"}), timeout=30, **kw)


# --------------------------------------------------------------------------- happy paths
def test_health_and_models(server, client):
    h = httpx.get(server.url + "/health").json()
    assert h["status"] == "ok" and h["ready"] and h["queue_size"] == 8
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_completion_matches_llm(llm, client):
    r = client.completions.create(model=MODEL, prompt="hello", max_tokens=24, temperature=0)
    g = llm.generate("hello", max_new_tokens=24, temperature=0)
    assert r.choices[0].text == g.text and r.choices[0].finish_reason == g.finish_reason
    assert r.usage.prompt_tokens == 5 and r.usage.completion_tokens == g.completion_tokens
    assert r.object == "text_completion" and r.id.startswith("cmpl-")


def test_n_samples_are_the_llms_generate_n(llm, client):
    """OpenAI's n: n choices from one batched decode, each the LLM's sample of that index."""
    r = client.completions.create(model=MODEL, prompt="hello", max_tokens=16, temperature=1.0, seed=5, n=3)
    gens = llm.generate_n("hello", 3, max_new_tokens=16, temperature=1.0, seed=5)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.text for c in r.choices] == [g.text for g in gens]
    assert r.usage.completion_tokens == sum(g.completion_tokens for g in gens) and r.usage.prompt_tokens == 5


def test_chat_matches_llm(llm, client):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=16, temperature=0, seed=1, user="u")
    g = llm.generate(msgs, max_new_tokens=16, temperature=0)
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content == g.text
    assert r.usage.total_tokens == g.prompt_tokens + g.completion_tokens


def test_streaming_chat_with_usage(llm, client):
    msgs = [{"role": "user", "content": "hello"}]
    chunks = list(client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=40, temperature=1.0, seed=5,
                                                 stream=True, stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True}))
    g = llm.generate(msgs, max_new_tokens=40, temperature=1.0, seed=5, ignore_eos=True)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == g.text
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) > 1  # block by block
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 40


def test_streaming_completion_and_stop(llm, client):
    full = llm.generate("hello", max_new_tokens=40, temperature=1.0, seed=2, ignore_eos=True).text
    stop = full[15:17]
    chunks = list(client.completions.create(model=MODEL, prompt="hello", max_tokens=40, temperature=1.0, seed=2,
                                            stop=[stop], stream=True, extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in chunks) == full[:full.find(stop)]
    assert chunks[-1].choices[0].finish_reason == "stop"


# --------------------------------------------------------------------------- errors a user can act on
OK = {"model": MODEL, "prompt": "hi", "max_tokens": 8}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
BAD = [  # (path, body, status, param)
    ("completions", b"{not json", 400, None),
    ("completions", b"\xff\xfe\x00garbage", 400, None),
    ("completions", b"[1, 2]", 400, None),
    ("completions", b"[" * 50_000 + b"]" * 50_000, 413, None),
    ("completions", b"[" * 5_000 + b"]" * 5_000, 400, None),
    ("completions", {**OK, "prompt": ""}, 400, "prompt"),  # unknown fields: tests/test_server_openai.py
    ("completions", {**OK, "model": "gpt-4"}, 404, "model"),
    ("completions", {**OK, "max_tokens": -3}, 400, "max_tokens"),
    ("completions", {**OK, "max_tokens": 0}, 400, "max_tokens"),
    ("completions", {**OK, "max_tokens": 10**12}, 400, "max_tokens"),
    ("completions", {**OK, "max_tokens": "8"}, 400, "max_tokens"),
    ("completions", {**OK, "prompt": "x" * 600}, 400, "prompt"),
    ("completions", {**OK, "prompt": ["a", ["b"]]}, 400, "prompt"),
    ("completions", {**OK, "prompt": 42}, 400, "prompt"),
    ("completions", {**OK, "n": 17}, 400, "n"),
    ("completions", {**OK, "top_p": 0}, 400, "top_p"),
    ("completions", {**OK, "n": 2, "stream": True}, 400, "n"),
    ("completions", {**OK, "temperature": "hot"}, 400, "temperature"),
    ("completions", {**OK, "temperature": 5}, 400, "temperature"),
    ("completions", {**OK, "stream": "yes"}, 400, "stream"),
    ("completions", {**OK, "stop": ["", "x"]}, 400, "stop"),
    ("completions", {**OK, "logprobs": 21}, 400, "logprobs"),
    ("completions", {**OK, "logprobs": 1, "echo": True}, 400, "echo"),
    ("completions", {**OK, "seed": 2**80}, 400, "seed"),
    ("completions", {"prompt": "hi"}, 400, "model"),
    ("completions", b'{"model": "sdar/tiny", "prompt": "\\ud800"}', 400, "prompt"),  # lone surrogate
    ("completions", b'{"model": "sdar/tiny", "prompt": "hi", "\\udcff": 1}', 400, "\\udcff"),
    ("chat/completions", {**CHAT, "messages": []}, 400, "messages"),
    ("chat/completions", {**CHAT, "messages": "hi"}, 400, "messages"),
    ("chat/completions", {**CHAT, "messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0].role"),
    ("chat/completions", {**CHAT, "messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content"),
    ("chat/completions", {**CHAT, "top_logprobs": 2}, 400, "top_logprobs"),
    ("chat/completions", {**CHAT, "messages": [{"role": "user", "content": "x" * 600}]}, 400, "messages"),
    ("chat/completions", {**CHAT, "max_completion_tokens": 10**6}, 400, "max_completion_tokens"),
    ("chat/completions", {**CHAT, "stream_options": {"include_usage": 1}}, 400, "stream_options.include_usage"),
    ("chat/completions", {**CHAT, "tools": [{"type": "function"}]}, 400, "tools"),
]


@pytest.mark.parametrize("path,body,status,param", BAD, ids=[f"{i}-{b[3]}" for i, b in enumerate(BAD)])
def test_malformed_requests_name_the_field(server, path, body, status, param):
    r = _post(f"{server.url}/v1/{path}", body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"] and err["type"]


def test_wrong_content_type_and_route(server):
    r = _post(server.url + "/v1/completions", json.dumps(OK), headers={"Content-Type": "text/plain"})
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"
    assert httpx.get(server.url + "/v1/nothing").json()["error"]["type"] == "not_found_error"
    assert _post(server.url + "/v1/completions", OK).status_code == 200  # still serving


def test_top_p_is_the_llms(llm, client):
    """A client's top_p is honoured: the nucleus the LLM samples from (and a tight one changes the text)."""
    kw = dict(model=MODEL, prompt="hello", max_tokens=16, temperature=1.0, seed=3)
    r = client.completions.create(**kw, top_p=0.3)
    assert r.choices[0].text == llm.generate("hello", max_new_tokens=16, temperature=1.0, seed=3, top_p=0.3).text
    assert r.choices[0].text != client.completions.create(**kw).choices[0].text


def test_accepted_and_ignored_fields(server):
    body = {**OK, "top_p": 0.9, "user": "me", "presence_penalty": 0, "logprobs": None, "echo": False, "n": 1}
    assert _post(server.url + "/v1/completions", body).status_code == 200


# --------------------------------------------------------------------------- queueing and cancellation
def test_concurrent_clients_served_fifo(llm, server, client):
    sched = server.app.state.scheduler
    gate, results = Gate(llm), {}

    def ask(i):
        r = client.completions.create(model=MODEL, prompt=f"client {i}", max_tokens=16, user=f"c{i}")
        results[i] = r.choices[0].text

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    _until(lambda: sched.running is not None and sched.waiting() == 5)
    gate.open()
    for t in threads:
        t.join(30)
    assert sorted(results) == list(range(6))  # all answered, none lost
    tags = [f"c{i}" for i in range(6)]
    arrived = [t for t in sched.arrivals if t in tags]
    assert [t for t in sched.starts if t in tags] == arrived and sorted(arrived) == tags


def test_full_queue_answers_429(make_speaking_llm):
    llm = make_speaking_llm(MODEL)
    with ServerThread(create_app(llm, MODEL, queue_size=1, warmup=False)) as s:
        sched, gate, codes = s.app.state.scheduler, Gate(llm), []
        t1 = threading.Thread(target=lambda: codes.append(_post(s.url + "/v1/completions", OK).status_code))
        t1.start()
        _until(lambda: sched.running is not None)
        t2 = threading.Thread(target=lambda: codes.append(_post(s.url + "/v1/completions", OK).status_code))
        t2.start()
        _until(lambda: sched.waiting() == 1)
        r = _post(s.url + "/v1/completions", OK)
        assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
        assert r.json()["error"]["code"] == "queue_full"
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.RateLimitError):
            c.completions.create(model=MODEL, prompt="hi", max_tokens=8)
        gate.open()
        t1.join(30)
        t2.join(30)
        assert codes == [200, 200]


def test_disconnect_mid_stream_cancels(llm, server):
    sched = server.app.state.scheduler
    with held_after_text(llm, 2, only=lambda: sched.running is not None and sched.running.tag == "leaver"):  # two chunks out, then the decode waits for the cancel
        body = {"model": MODEL, "prompt": "hello", "max_tokens": 400, "stream": True, "ignore_eos": True,
                "user": "leaver"}
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as r:
            got = 0
            for line in r.iter_lines():
                got += line.startswith("data: {")
                if got == 2:
                    break  # leaving the block closes the connection
        _until(lambda: any(f[1] == "leaver" for f in sched.finished), 30)
    _, _, finish, tokens = next(f for f in sched.finished if f[1] == "leaver")
    assert finish == "cancelled" and tokens < 400
    assert _post(server.url + "/v1/completions", OK).status_code == 200  # next request served


def test_non_streaming_client_gone_while_queued_is_dropped(llm, server):
    sched = server.app.state.scheduler
    dropped = sched.counts["dropped"]
    gate = Gate(llm)
    try:
        hold = threading.Thread(target=lambda: _post(server.url + "/v1/completions", {**OK, "user": "holder"}))
        hold.start()
        # the holder itself: the previous test's request may still be `running` for a moment after its answer
        _until(lambda: sched.running is not None and sched.running.tag == "holder")
        # a raw connection: send the request, see it queued behind the holder, then hang up
        body = json.dumps({**OK, "user": "impatient"}).encode()
        head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as conn:
            conn.sendall(head + body)
            _until(lambda: sched.waiting() == 1)
        _until(lambda: sched.counts["dropped"] == dropped + 1)
        assert sched.waiting() == 0
    finally:
        gate.open()
    hold.join(30)
    assert "impatient" not in sched.starts and "holder" in sched.starts
    assert "impatient" in sched.arrivals  # it was admitted, then dropped from the queue


def test_failed_decode_is_500_and_worker_survives(llm, server):
    def boom(mod, args):
        raise RuntimeError("injected failure")

    h = llm.model.register_forward_pre_hook(boom)
    try:
        r = _post(server.url + "/v1/completions", OK)
    finally:
        h.remove()
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    assert _post(server.url + "/v1/completions", OK).status_code == 200
