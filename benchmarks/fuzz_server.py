"""Fuzz `orl serve`: start it (tiny model) in a subprocess, throw >= 1000 random malformed, oversized
or hostile requests at it from several threads, then check it still answers /health and a valid
request. Prints counts by status code, every 5xx, client-side failures and the elapsed time;
exits 1 if any 5xx was seen, the server died, or it stopped answering.

    python benchmarks/fuzz_server.py                 # 1200 requests, seed 0
    python benchmarks/fuzz_server.py --n 5000 --seed 3 --workers 8

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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=6)
    ap.add_argument("--queue-size", type=int, default=4)
    args = ap.parse_args(argv)
    port = free_port()
    env = {**os.environ, "ORL_THREADS": os.environ.get("ORL_THREADS", "1")}
    # the server's log goes to a file: an undrained pipe would fill up and block its event loop
    log = tempfile.NamedTemporaryFile("w+b", prefix="fuzz_server-", suffix=".log", delete=False)
    proc = subprocess.Popen([sys.executable, "-m", "orl.cli", "serve", "--model", MODEL, "--port", str(port),
                             "--queue-size", str(args.queue_size), "--log-level", "critical"], env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(base + "/health", timeout=1).json().get("ready"):
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                print("server exited at startup:\n" + open(log.name, errors="replace").read()[-3000:])
                return 1
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
        print(f"fuzz_server: {args.n} requests, seed {args.seed}, {args.workers} client threads, "
              f"queue size {args.queue_size}, {elapsed:.1f} s ({args.n / elapsed:.0f} req/s)")
        print("by status:  " + ", ".join(f"{k}: {v}" for k, v in sorted(by_status.items())))
        for cat in sorted(by_cat):
            print(f"  {cat:<10} " + ", ".join(f"{k}: {v}" for k, v in sorted(by_cat[cat].items())))
        print(f"5xx / non-OpenAI error bodies: {len(bad)}" + "".join(f"\n  {b}" for b in bad[:20]))
        print(f"after: server alive {alive}; /health {health.status_code} {health.json()}; "
              f"valid completion {ok.status_code} ({ok.json().get('usage')})")
        print(f"server tracebacks logged: {tracebacks} (log: {log.name})")
        good = not bad and not tracebacks and alive and health.status_code == 200 and ok.status_code == 200
        print("RESULT: " + ("PASS" if good else "FAIL"))
        return 0 if good else 1
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    sys.exit(main())
