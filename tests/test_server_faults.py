"""`orl serve` against clients that hold it instead of using it: slow or half-sent requests, bytes
that are not HTTP, an unread body trickled forever, a flood of connections. One server subprocess
on a free loopback port with short deadlines (1 s) and a small connection cap, so each check waits
about a deadline; the flood's RSS is read from /proc/PID/status before and after."""
import collections
import os
import random
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
import uvicorn

from orl.serve.server import Limits, create_app, fit_open_files, server_config

MODEL = "sdar/tiny"
HEADER_S, BODY_S, KEEP_ALIVE_S, MAX_CONN = 1.0, 1.0, 1.0, 200
SLACK_S = 1.0   # a loaded 2-core machine's scheduling, on top of a deadline
FLOOD = 2000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, tmp):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(tmp / "server.log", "w+b")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "orl.cli", "serve", "--model", MODEL, "--port", str(self.port),
             "--log-level", "warning", "--timeout-header", str(HEADER_S), "--timeout-body", str(BODY_S),
             "--timeout-keep-alive", str(KEEP_ALIVE_S), "--max-connections", str(MAX_CONN)],
            env={**os.environ, "ORL_THREADS": "1"}, stdout=self.log, stderr=subprocess.STDOUT)
        end = time.monotonic() + 90
        while True:
            assert self.proc.poll() is None, "server exited:\n" + self.logged()
            try:
                if httpx.get(self.url + "/health", timeout=1).json().get("ready"):
                    break
            except (httpx.HTTPError, ValueError):
                pass
            assert time.monotonic() < end, "server not ready in 90 s:\n" + self.logged()
            time.sleep(0.1)

    def logged(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-3000:]

    def rss_mb(self) -> float:
        with open(f"/proc/{self.proc.pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def connect(self, first: bytes = b"") -> socket.socket:
        s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        if first:
            s.sendall(first)
        return s

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("faults"))
    yield s
    s.stop()


def _reply(sock: socket.socket, within: float) -> tuple[bytes, str, float]:
    """What the server sent and how the connection ended within ``within`` s: (bytes, "closed" |
    "reset" | "held", seconds until then)."""
    t0, got = time.monotonic(), b""
    sock.settimeout(within)
    try:
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                return got, "closed", time.monotonic() - t0
            got += chunk
            sock.settimeout(max(within - (time.monotonic() - t0), 0.01))
    except TimeoutError:
        return got, "held", time.monotonic() - t0
    except ConnectionResetError:
        return got, "reset", time.monotonic() - t0
    finally:
        sock.close()


def _status(got: bytes) -> int | None:
    return int(got.split(b" ")[1]) if got.startswith(b"HTTP/1.1 ") else None


GARBAGE = [random.Random(0).randbytes(500), b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40,
           b"\x00" * 64, b"GET\x00/ HTTP/1.1\r\n", b"<html>not a request line</html>" * 10,
           b"A" * 40 + b" / HTTP/1.1\r\n"]


@pytest.mark.parametrize("payload", GARBAGE, ids=["random", "tls", "nul", "nul-method", "html", "long-method"])
def test_garbage_bytes_get_400_at_once(server, payload):
    """Not a deadline's work: bytes that cannot start a request line are refused on arrival."""
    got, how, secs = _reply(server.connect(payload), HEADER_S + SLACK_S)
    assert _status(got) == 400 and how != "held", (got[:80], how)
    assert secs < HEADER_S / 2, f"answered after {secs:.2f} s: the header deadline, not the check"
    assert b'"code": "invalid_http"' in got


def test_silent_and_half_sent_heads_end_at_the_header_deadline(server):
    t0 = time.monotonic()
    silent, half, headers = server.connect(), server.connect(b"GET /hea"), server.connect(b"GET /health HTTP/1.1\r\nHo")
    results = [_reply(s, HEADER_S + SLACK_S + 1) for s in (silent, half, headers)]
    for got, how, _ in results:
        assert how in ("closed", "reset"), (got, how)
    assert time.monotonic() - t0 < HEADER_S + SLACK_S
    assert results[0][0] == b""                                           # sent nothing: just closed
    assert _status(results[1][0]) == 408 and _status(results[2][0]) == 408  # started a request: told why


def _trickle(sock: socket.socket, for_s: float, every_s: float = 0.05) -> tuple[bytes, float | None]:
    """Send a byte every ``every_s`` for up to ``for_s`` s, collecting replies: (what the server
    sent, seconds until it ended the connection, or None when it never did)."""
    t0, got = time.monotonic(), b""
    sock.settimeout(every_s)
    try:
        while time.monotonic() - t0 < for_s:
            try:
                sock.sendall(b"a")
                chunk = sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:  # reset, broken pipe: the server closed it
                return got, time.monotonic() - t0
            if not chunk:
                return got, time.monotonic() - t0
            got += chunk
        return got, None
    finally:
        sock.close()


def test_trickled_head_is_not_extended_by_its_bytes(server):
    """The header deadline runs from the first byte; more bytes (a header that never ends) do not
    push it back."""
    got, ended = _trickle(server.connect(b"GET /health HTTP/1.1\r\nX-Slow: "), HEADER_S + SLACK_S + 2)
    assert ended is not None and ended < HEADER_S + SLACK_S, (got[:60], ended)
    assert _status(got) in (408, None)


def test_slow_bodies_get_408_within_the_body_deadline(server):
    """40 clients send a head and then a body byte every 0.2 s: each is answered 408 and closed
    about BODY_S after its head, whatever it keeps sending."""
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 10000\r\n\r\n{")
    socks = [server.connect(head) for _ in range(40)]
    ends: dict[int, tuple] = {}
    threads = [threading.Thread(target=lambda i=i, s=s: ends.__setitem__(i, _trickle(s, BODY_S + SLACK_S + 2, 0.2)))
               for i, s in enumerate(socks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(ends) == 40
    for got, ended in ends.values():
        assert ended is not None and ended < BODY_S + SLACK_S, (got[:60], ended)
        assert _status(got) in (408, None), got   # None: a reset (the client kept writing) may drop the 408
    assert sum(_status(g) == 408 for g, _ in ends.values()) >= 20
    assert httpx.get(server.url + "/health", timeout=5).status_code == 200


def test_unread_body_trickle_is_cut_off(server):
    """A body nobody reads (GET /health answers without it) must not keep the connection: each
    client byte resets uvicorn's keep-alive timer; the body deadline is not reset by them."""
    got, ended = _trickle(server.connect(b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n"),
                          BODY_S + SLACK_S + 2)
    assert _status(got) == 200 and ended is not None and ended < BODY_S + SLACK_S, (got[:60], ended)


def test_idle_keep_alive_connection_closes(server):
    got, how, secs = _reply(server.connect(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"), KEEP_ALIVE_S + SLACK_S + 2)
    assert _status(got) == 200 and how in ("closed", "reset") and secs < KEEP_ALIVE_S + SLACK_S, (how, secs)


def test_connection_flood_is_capped_and_health_answers(server):
    """FLOOD sockets each send half a request line and wait. The server holds at most MAX_CONN
    (closing the oldest idle ones, with a 503 when they had started a request), /health answers
    during the flood and after it, and its RSS is back within 10 % once the flood is gone."""
    for _ in range(5):
        assert httpx.get(server.url + "/health", timeout=5).status_code == 200
    time.sleep(0.3)
    rss0, fds0 = server.rss_mb(), server.open_fds()
    socks = []
    try:
        for _ in range(FLOOD):
            try:
                socks.append(server.connect(b"GET /he"))
            except OSError:  # refused by a full accept queue: an allowed answer to a flood
                break
        end, held = time.monotonic() + 10, None   # accepted in bursts of up to --backlog, then capped
        while held is None or (held > MAX_CONN + 8 and time.monotonic() < end):
            time.sleep(0.1)
            held = server.open_fds() - fds0
        assert held <= MAX_CONN + 8, f"the server holds {held} flood connections (cap {MAX_CONN})"
        during = httpx.get(server.url + "/health", timeout=5)
        assert during.status_code == 200 and during.json()["status"] == "ok"
        ended, answers = 0, collections.Counter()
        for s in socks:
            s.setblocking(False)
            try:
                got = s.recv(256)
            except BlockingIOError:
                continue
            except ConnectionResetError:  # closed with its half line unread: the 503 may be lost
                got = b""
            ended += 1
            answers[_status(got)] += 1
        assert ended >= len(socks) - MAX_CONN - 8, f"only {ended} of {len(socks)} flood sockets were closed"
        assert set(answers) <= {503, None}, answers
    finally:
        for s in socks:
            s.close()
    time.sleep(1.0)
    r = httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 8}, timeout=30)
    assert r.status_code == 200 and httpx.get(server.url + "/health", timeout=5).status_code == 200
    rss1 = server.rss_mb()
    assert rss1 <= 1.10 * rss0, f"RSS {rss0:.0f} MB before the flood, {rss1:.0f} MB after"
    assert "Too many open files" not in server.logged() and "Traceback" not in server.logged()


def test_limits_reach_uvicorn():
    cfg = server_config(object(), Limits(max_connections=7, timeout_keep_alive=2.5, limit_concurrency=9,
                                         backlog=33, h11_max_incomplete_event_size=4096))
    assert (cfg.timeout_keep_alive, cfg.limit_concurrency, cfg.backlog, cfg.h11_max_incomplete_event_size) == \
        (2.5, 9, 33, 4096)
    assert cfg.http.limits.max_connections == 7 and cfg.http.held == {}
    with pytest.raises(ValueError, match="max_connections must be >= 1"):
        Limits(max_connections=0)
    with pytest.raises(ValueError, match="timeout_body must be > 0"):
        Limits(timeout_body=0)


def test_limits_fit_a_low_open_file_limit():
    """Under ulimit -n 1024 the held connections plus a few accept bursts stay below it."""
    import resource
    old = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, old[1]))
        fitted, note = fit_open_files(Limits())
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, old)
    assert fitted.max_connections + 4 * fitted.backlog <= 1024 - 64 and fitted.max_connections >= 256
    assert "ulimit -n 1024" in note
    assert fit_open_files(Limits(max_connections=100, backlog=50)) == (Limits(max_connections=100, backlog=50), None)


def test_cap_answers_503_when_every_connection_is_busy(make_speaking_llm):
    """At the cap with no idle connection to close (one request decoding, one queued), a newcomer
    is told 503 with Retry-After and closed; once they finish, new connections are served."""
    llm = make_speaking_llm(MODEL)
    app = create_app(llm, MODEL, queue_size=4, warmup=False)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    srv = uvicorn.Server(server_config(app, Limits(max_connections=2), log_level="warning"))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    gate = threading.Event()
    hook = llm.model.register_forward_pre_hook(lambda mod, args: gate.wait(30) and None)
    body = b'{"model": "sdar/tiny", "prompt": "hi", "max_tokens": 8}'
    req = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
           f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    try:
        end = time.monotonic() + 30
        while not srv.started:
            assert time.monotonic() < end
            time.sleep(0.01)
        sched = app.state.scheduler
        busy = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(2)]
        for b in busy:
            b.sendall(req)
        while not (sched.running is not None and sched.waiting() == 1):
            assert time.monotonic() < end, "the two requests did not start and queue"
            time.sleep(0.01)
        got, how, _ = _reply(socket.create_connection(("127.0.0.1", port), timeout=10), 5)
        assert _status(got) == 503 and b"retry-after: 1" in got and b"too_many_connections" in got, got
        assert how in ("closed", "reset")
        gate.set()
        for b in busy:
            assert _status(_reply(b, 30)[0]) == 200
        with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
            c.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert _status(_reply(c, 5)[0]) == 200
    finally:
        gate.set()
        hook.remove()
        srv.should_exit = True
        thread.join(30)
        sock.close()
