"""Fuzz `orl serve`: start it (tiny model) in a subprocess, throw >= 1000 random malformed, oversized
or hostile requests at it from several threads, then check it still answers /health and a valid
request. Then the clients that hold a server instead of using it: ``--slow`` connections each
that trickle a body, trickle a head or stay silent, ``--slow`` bursts of random bytes, and a flood
of ``--flood`` sockets that each send half a request line and wait; /health is asked during the
flood, and the server's RSS (/proc/PID/status) is read before the flood and after its release.
Prints counts by status code, every 5xx, client-side failures, the elapsed time and one table row
(fuzz 5xx, connections held past their deadline, flood, RSS before/after); exits 1 if any 5xx
came from the fuzz, the server died, a connection outlived its deadline, /health failed or RSS
grew by more than 10 %.

    python benchmarks/fuzz_server.py                 # 1200 requests, seed 0, 200 slow, flood of 5000
    python benchmarks/fuzz_server.py --n 5000 --seed 3 --workers 8 --flood 15000
    python benchmarks/fuzz_server.py --server-args ""   # the server's default deadlines (10 s / 30 s)
    python benchmarks/fuzz_server.py --nofile 1024       # the server under a common default ulimit -n

`summary(flood=...)` runs the same checks quietly and returns the counts and the table row
(`benchmarks/fault_report.py` tabulates it).

Categories: random bytes, random JSON values, a valid request with one field replaced by a
random value of a random type, unknown fields, huge strings, deep nesting, bad numbers
(NaN/inf/huge/negative max_tokens), lone surrogates, wrong content types, wrong methods and
paths, raw non-HTTP bytes on the socket, streaming requests abandoned after the first chunk, and
valid requests (some succeed, some meet a full queue: 429).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import random
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import quote

import httpx

MODEL = "sdar/tiny"
FIELDS = ["model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n",
          "stream", "stream_options", "stop", "seed", "user", "logprobs", "echo", "presence_penalty",
          "logit_bias", "ignore_eos", "tools", "response_format"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rand_str(rng: random.Random, n: int | None = None) -> str:
    n = rng.choice([0, 1, 5, 40, 300]) if n is None else n
    pool = "abc xyz\n\t\"\\{}[]:,0123456789é漢🙂\u0000\u202e"
    return "".join(rng.choice(pool) for _ in range(n))


def rand_value(rng: random.Random, depth: int = 0):
    kinds = ["int", "float", "str", "bool", "null", "list", "dict", "bigint", "neg"]
    k = rng.choice(kinds if depth < 4 else kinds[:5])
    if k == "int":
        return rng.randint(-5, 1000)
    if k == "float":
        return rng.choice([0.0, -1.5, 0.5, 2.5, 1e308, -1e-300])
    if k == "str":
        return rand_str(rng)
    if k == "bool":
        return rng.random() < 0.5
    if k == "null":
        return None
    if k == "bigint":
        return rng.choice([2**31, 2**63, 2**64, 10**30, -(10**30)])
    if k == "neg":
        return -rng.randint(1, 10**6)
    if k == "list":
        return [rand_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {rand_str(rng, rng.randint(1, 8)): rand_value(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def valid(rng: random.Random, chat: bool) -> dict:
    body = {"model": MODEL, "max_tokens": rng.choice([1, 8, 16]), "temperature": rng.choice([0.0, 1.0])}
    if chat:
        body["messages"] = [{"role": "user", "content": rand_str(rng, rng.randint(1, 30))}]
    else:
        body["prompt"] = rand_str(rng, rng.randint(1, 30))
    return body


def make_case(rng: random.Random):
    """One request as (category, method, path, headers, body bytes | None, mode)."""
    chat = rng.random() < 0.5
    path = "/v1/chat/completions" if chat else "/v1/completions"
    js = {"Content-Type": "application/json"}
    k = rng.choice(["bytes", "json", "mutate", "mutate", "mutate", "unknown", "huge", "deep", "numbers",
                    "surrogate", "ctype", "method", "raw", "abandon", "valid", "messages"])
    if k == "bytes":
        return k, "POST", path, js, rng.randbytes(rng.choice([0, 1, 17, 1000, 70_000])), "plain"
    if k == "json":
        return k, "POST", path, js, json.dumps(rand_value(rng)).encode(), "plain"
    if k == "mutate":
        body = valid(rng, chat)
        body[rng.choice(FIELDS)] = rand_value(rng)
        return k, "POST", path, js, json.dumps(body).encode(), "plain"
    if k == "unknown":
        body = {**valid(rng, chat), rand_str(rng, rng.randint(1, 20)) or "x": rand_value(rng)}
        return k, "POST", path, js, json.dumps(body).encode(), "plain"
    if k == "huge":
        body = valid(rng, chat)
        big = "a" * rng.choice([600, 5_000, 60_000, 1_000_000, 5_000_000])
        if chat:
            body["messages"][0]["content"] = big
        else:
            body[rng.choice(["prompt", "stop", "user", "model"])] = big
        return k, "POST", path, js, json.dumps(body).encode(), "plain"
    if k == "deep":
        d = rng.choice([100, 900, 990, 5_000, 50_000])
        nest = "[" * d + "]" * d if rng.random() < 0.5 else '{"a":' * d + "1" + "}" * d
        body = json.dumps(valid(rng, chat))[:-1] + f', "{rng.choice(FIELDS)}": {nest}}}'
        return k, "POST", path, js, body.encode(), "plain"
    if k == "numbers":
        raw = rng.choice(["NaN", "Infinity", "-Infinity", "1e999", "-0", "1" * 5000, "0", "-1", "99999999999",
                          "1.5", "true", '"16"'])
        field = rng.choice(["max_tokens", "temperature", "seed", "n", "top_p", "max_completion_tokens"])
        body = json.dumps(valid(rng, chat))[:-1] + f', "{field}": {raw}}}'
        return k, "POST", path, js, body.encode(), "plain"
    if k == "surrogate":
        body = json.dumps(valid(rng, chat))[:-1] + rng.choice([', "\\ud800": 1}', ', "user": "\\udfff"}',
                                                              ', "stop": ["\\ud83d"]}'])
        if rng.random() < 0.5 and not chat:
            body = json.dumps({"model": MODEL, "prompt": "x"})[:-1].replace('"x"', '"\\ud800x"') + "}"
        return k, "POST", path, js, body.encode(), "plain"
    if k == "ctype":
        ct = rng.choice(["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                         "application/json; charset=latin-1", "", "application/xml", "json"])
        return k, "POST", path, {"Content-Type": ct} if ct else {}, json.dumps(valid(rng, chat)).encode(), "plain"
    if k == "method":
        method = rng.choice(["GET", "PUT", "DELETE", "PATCH", "OPTIONS", "POST"])
        p = rng.choice([path, "/v1/models", "/health", "/v1/" + quote(rand_str(rng, 8)), "/../../etc",
                        "/v1/completions/" + "x" * 5000])
        return k, method, p, js, json.dumps(valid(rng, chat)).encode() if method != "GET" else None, "plain"
    if k == "raw":
        truncated = b'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{"model":'
        payload = rng.choice([rng.randbytes(200), b"GARBAGE / HTTP/9.9\r\n\r\n", truncated, b"\r\n" * 100])
        return k, "RAW", path, {}, payload, "raw"
    if k == "abandon":
        # sampled: a random tiny model's greedy text is all mask tokens, i.e. empty, and sends nothing
        body = {**valid(rng, chat), "stream": True, "max_tokens": 200, "ignore_eos": True, "temperature": 1.0}
        return k, "POST", path, js, json.dumps(body).encode(), "abandon"
    if k == "messages":
        msg = rng.choice([{"role": "user"}, {"role": "tool", "content": "x"}, {"content": "x"},
                          {"role": "user", "content": None}, {"role": "user", "content": [{"type": "image_url"}]},
                          {"role": "user", "content": [{"type": "text", "text": 5}]}, "hello", 7, []])
        body = {"model": MODEL, "messages": [msg], "max_tokens": 8}
        return k, "POST", "/v1/chat/completions", js, json.dumps(body).encode(), "plain"
    body = valid(rng, chat)
    if rng.random() < 0.3:
        body.update(stream=True, stream_options={"include_usage": rng.random() < 0.5})
    return "valid", "POST", path, js, json.dumps(body).encode(), "plain"


def send(client: httpx.Client, port: int, case) -> str:
    """The response's status code as a string, or 'raw:<reply>' / 'client:<exception>'."""
    _, method, path, headers, body, mode = case
    try:
        if mode == "raw":
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(body)
                s.shutdown(socket.SHUT_WR)
                reply = s.recv(64)
            return "raw:" + (reply.split(b" ")[1].decode() if reply.startswith(b"HTTP/") else "closed")
        if mode == "abandon":
            with client.stream(method, path, headers=headers, content=body) as r:
                for _ in r.iter_lines():
                    break  # leave after the first line: the server must cancel the decode
            return str(r.status_code)
        r = client.request(method, path, headers=headers, content=body)
        if r.status_code >= 400 and not (r.status_code == 405 or "error" in r.json()):
            return f"{r.status_code}:not-openai-error-body"
        return str(r.status_code)
    except Exception as e:  # a client-side failure is reported, not fatal
        return f"client:{type(e).__name__}"


def _ended(s: socket.socket, trickle: bool) -> bool:
    """Whether the server has closed non-blocking socket ``s`` (sending one more byte first if
    ``trickle``); what it sent before closing (a 408, 400 or 503) is read and dropped."""
    try:
        if trickle:
            s.send(b"a")
        while True:
            if not s.recv(65536):
                return True
    except BlockingIOError:
        return False
    except OSError:  # reset / broken pipe: closed by the server
        return True


def holders(port: int, n: int, header_s: float, body_s: float, grace: float = 2.0) -> dict:
    """``n`` each of: body tricklers (a head, then a body byte every 0.5 s), head tricklers (half a
    request line, then a byte every 0.5 s), silent connections and 500 random bytes. Returns how
    many of each the server still held ``grace`` s after its deadline (garbage: ``grace`` s after
    it was sent), each counted from its own connect."""
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100000\r\n\r\n{")
    rng = random.Random(1)
    kinds = {"slow body": (head, True, body_s), "slow head": (b"GET /heal", True, header_s),
             "silent": (b"", False, header_s), "garbage": (None, False, 0.0)}
    waiting = []  # (kind, socket, when it is judged)
    for kind, (first, _, deadline) in kinds.items():
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            s.sendall(rng.randbytes(500) if first is None else first)
            s.setblocking(False)
            waiting.append((kind, s, time.monotonic() + deadline + grace))
    held = dict.fromkeys(kinds, 0)
    while waiting:
        now, still = time.monotonic(), []
        for kind, s, due in waiting:
            if _ended(s, kinds[kind][1]):
                s.close()
            elif now >= due:
                held[kind] += 1
                s.close()
            else:
                still.append((kind, s, due))
        waiting = still
        time.sleep(0.25)
    return held


def server_status(pid: int, key: str = "VmRSS") -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":")) / 1024


def flood(port: int, pid: int, n: int, base: str) -> dict:
    """``n`` sockets that send half a request line and wait; /health asked while they are open."""
    fds0 = len(os.listdir(f"/proc/{pid}/fd"))

    def fds() -> int:
        return len(os.listdir(f"/proc/{pid}/fd")) - fds0

    socks, refused, peak, give_up = [], 0, 0, time.monotonic() + 120
    for i in range(n):
        if time.monotonic() > give_up:  # a server that stopped accepting: report, do not wait forever
            refused += n - i
            break
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"GET /he")
            socks.append(s)
        except OSError:
            refused += 1
        if i % 250 == 0:
            peak = max(peak, fds())
    for _ in range(10):  # accepted in bursts of up to --backlog, then capped: let it settle
        time.sleep(0.1)
        peak = max(peak, fds())
    held = fds()  # 1 s after the last connect (before --timeout-header would close them all)
    try:
        during = httpx.get(base + "/health", timeout=10).status_code
    except httpx.HTTPError as e:
        during = type(e).__name__
    ended = five03 = 0
    for s in socks:
        s.setblocking(False)
        try:
            got = s.recv(256)
            ended, five03 = ended + 1, five03 + got.startswith(b"HTTP/1.1 503")
        except BlockingIOError:
            pass
        except OSError:
            ended += 1
        s.close()
    return {"sockets": n, "refused": refused, "server_fds": held, "server_fds_peak": peak, "health_during": during,
            "ended": ended, "503": five03}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=6)
    ap.add_argument("--queue-size", type=int, default=4)
    ap.add_argument("--slow", type=int, default=200, help="connections of each holding kind")
    ap.add_argument("--flood", type=int, default=5000, help="sockets in the connection flood (0: none)")
    ap.add_argument("--nofile", type=int, default=0, help="the server's open-file limit (ulimit -n; 0: this one's)")
    ap.add_argument("--server-args", default="--timeout-header 2 --timeout-body 2 --timeout-keep-alive 2",
                    help="extra `orl serve` options (deadlines; the holders' check reads them from here)")
    return ap


def run(args: argparse.Namespace, out=print) -> dict:
    """Start the server, run every check, stop it; the counts, ``good`` and the markdown ``table``."""
    extra = args.server_args.split()
    opt = {k: float(v) for k, v in zip(extra, extra[1:]) if k in ("--timeout-header", "--timeout-body")}
    header_s, body_s = opt.get("--timeout-header", 10.0), opt.get("--timeout-body", 30.0)
    port = free_port()
    env = {**os.environ, "ORL_THREADS": os.environ.get("ORL_THREADS", "1")}
    # the server's log goes to a file: an undrained pipe would fill up and block its event loop
    log = tempfile.NamedTemporaryFile("w+b", prefix="fuzz_server-", suffix=".log", delete=False)

    def limit_files():  # in the server's process, before it starts
        if args.nofile:
            resource.setrlimit(resource.RLIMIT_NOFILE, (args.nofile, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    proc = subprocess.Popen([sys.executable, "-m", "orl.cli", "serve", "--model", MODEL, "--port", str(port),
                             "--queue-size", str(args.queue_size), "--log-level", "critical", *extra], env=env,
                            stdout=log, stderr=subprocess.STDOUT, preexec_fn=limit_files)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(base + "/health", timeout=1).json().get("ready"):
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise RuntimeError("server exited at startup:\n" + open(log.name, errors="replace").read()[-3000:])
            time.sleep(0.2)
        rng = random.Random(args.seed)
        cases = [make_case(rng) for _ in range(args.n)]
        t0 = time.perf_counter()
        with httpx.Client(base_url=base, timeout=60) as client, ThreadPoolExecutor(args.workers) as pool:
            results = list(pool.map(lambda c: send(client, port, c), cases))
        elapsed = time.perf_counter() - t0
        by_status = collections.Counter(results)
        by_cat = collections.defaultdict(collections.Counter)
        for c, r in zip(cases, results):
            by_cat[c[0]][r] += 1
        bad = [(c[0], c[1], c[2], r) for c, r in zip(cases, results) if r[:1] == "5" or "not-openai" in r]
        health = httpx.get(base + "/health", timeout=10)
        ok = httpx.post(base + "/v1/completions", json={"model": MODEL, "prompt": "hello", "max_tokens": 16},
                        timeout=60)
        alive = proc.poll() is None
        tracebacks = open(log.name, errors="replace").read().count("Traceback (most recent call last)")
        out(f"fuzz_server: {args.n} requests, seed {args.seed}, {args.workers} client threads, "
              f"queue size {args.queue_size}, {elapsed:.1f} s ({args.n / elapsed:.0f} req/s)")
        out("by status:  " + ", ".join(f"{k}: {v}" for k, v in sorted(by_status.items())))
        for cat in sorted(by_cat):
            out(f"  {cat:<10} " + ", ".join(f"{k}: {v}" for k, v in sorted(by_cat[cat].items())))
        out(f"5xx / non-OpenAI error bodies: {len(bad)}" + "".join(f"\n  {b}" for b in bad[:20]))
        out(f"after: server alive {alive}; /health {health.status_code} {health.json()}; "
              f"valid completion {ok.status_code} ({ok.json().get('usage')})")
        out(f"server tracebacks logged: {tracebacks} (log: {log.name})")
        good = not bad and not tracebacks and alive and health.status_code == 200 and ok.status_code == 200

        held = holders(port, args.slow, header_s, body_s) if args.slow else {}
        out(f"holders ({args.slow} each, deadlines {header_s:g} s head / {body_s:g} s body): still open 2 s "
              "past the deadline: " + ", ".join(f"{k} {v}" for k, v in held.items()))
        time.sleep(1.0)
        rss0 = server_status(proc.pid)
        fl = flood(port, proc.pid, args.flood, base) if args.flood else {}
        time.sleep(2.0)
        rss1, alive = server_status(proc.pid), proc.poll() is None
        after = httpx.get(base + "/health", timeout=10).status_code
        log_text = open(log.name, errors="replace").read()
        out(f"flood: {fl}; /health after {after}; RSS {rss0:.0f} -> {rss1:.0f} MB")
        good = (good and not sum(held.values()) and (not fl or fl["health_during"] == 200) and after == 200
                and rss1 <= 1.10 * rss0 and alive and "Traceback" not in log_text)
        emfile = log_text.count("Too many open files")
        good = good and not emfile
        head = (f"| fuzz requests | fuzz 5xx | held past deadline (body/head/silent/garbage) | flood sockets "
                f"(ulimit -n {args.nofile or resource.getrlimit(resource.RLIMIT_NOFILE)[0]}) | server fds held / peak | "
                "/health in flood | EMFILE logged | RSS before -> after (MB) | result |")
        sep = "|---|---|---|---|---|---|---|---|---|"
        kept = "/".join(str(held.get(k, "-")) for k in ("slow body", "slow head", "silent", "garbage"))
        row = (f"| {args.n} | {len(bad)} | {kept} | {fl.get('sockets', 0)} | {fl.get('server_fds', '-')} / "
               f"{fl.get('server_fds_peak', '-')} | {fl.get('health_during', '-')} | {emfile} | "
               f"{rss0:.0f} -> {rss1:.0f} | {'PASS' if good else 'FAIL'} |")
        if good:
            os.unlink(log.name)  # a failing run keeps its log for a look
        return {"good": good, "requests": args.n, "5xx": len(bad), "held": held, "flood": fl, "emfile": emfile,
                "rss_before_mb": round(rss0, 1), "rss_after_mb": round(rss1, 1), "table": "\n".join((head, sep, row)),
                "faults": args.n + 4 * args.slow + args.flood}
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def summary(flood: int = 2000, **options) -> dict:
    """The checks with their defaults (``options``: other `parser` fields, e.g. slow=40) and a flood
    of ``flood`` sockets, quietly: what `benchmarks/fault_report.py` tabulates (``note``: the row)."""
    args = parser().parse_args([])
    args.flood = flood
    for k, v in options.items():
        setattr(args, k, v)
    res = run(args, out=lambda *_: None)
    res["note"] = "Server checks (`benchmarks/fuzz_server.py`):\n\n" + res["table"]
    return res


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout` must not orphan the server: finally runs
    res = run(args)
    print("\n" + res["table"])
    print("RESULT: " + ("PASS" if res["good"] else "FAIL"))
    return 0 if res["good"] else 1


if __name__ == "__main__":
    sys.exit(main())
