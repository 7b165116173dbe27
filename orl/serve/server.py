"""OpenAI-compatible HTTP server around one `LLM`: validation, a bounded FIFO queue, SSE streaming.

Owns the HTTP surface (docs/serving.md, docs/engine.md section 6): POST /v1/completions and
/v1/chat/completions (non-streaming and SSE; ``n`` samples, lists of prompts, token-id prompts,
``logprobs``, ``echo``), GET /v1/models and /v1/models/{id}, POST /tokenize and /detokenize
(vLLM's shapes), GET /metrics (Prometheus text), GET /health; request validation with errors that
name the offending field (OpenAI-style bodies, always 4xx), unknown fields ignored and named in
the ``X-Ignored-Fields`` response header (logged once per name); a single worker thread that
decodes one request at a time while the rest wait in a bounded FIFO queue (full: 429 +
Retry-After); and cancellation (a client that goes away is cancelled at the next block boundary,
or dropped from the queue). Nothing a client sends may crash or wedge it: unexpected errors become
500 JSON and the worker keeps running.

Nothing a client holds may starve the others either (`Limits`, one `orl serve` option each): the
request head must arrive within ``timeout_header`` s of connecting (or of the first byte of a
kept-alive connection's next request) and the body within ``timeout_body`` s of the head, else a
408 and the connection closes; bytes that cannot start an HTTP/1.1 request line get a 400 at once,
not after a timeout; at most ``max_connections`` connections are held: at the cap the oldest one
that holds no request in progress (idle, or still sending its request) is closed to make room, so
/health still answers under a flood, and when every one is busy the newcomer gets a 503. These
live in `GuardedH11Protocol`, uvicorn's h11 protocol with the deadlines and the cap added
(uvicorn's own ``timeout_keep_alive`` only starts after a first response, and its
``limit_concurrency`` counts idle connections, so under a flood it answers /health with 503 too).

The request schemas, their validation and the response bodies are `orl.serve.schemas`; the single
worker, its queue and the metrics `orl.serve.scheduler`; this module is the app (routes, SSE, the
status counter behind /metrics), the connection guards and `orl serve`.
Does not own: tensors, token ids or the decoder (`orl.serve.llm.LLM` turns prompts into text and
log-probabilities), sampling features the block decoder lacks (penalties, the prompt's own
log-likelihood: refused, see ``DEFAULT_ONLY`` and `parse_request`), batching across requests (one
request at a time; a request's ``n`` samples decode as one batch).
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import http
import json
import logging
import re
import resource
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass

import h11
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from uvicorn.protocols.http.h11_impl import H11Protocol

from .scheduler import Job, QueueFull, Scheduler
from .schemas import (BYTES_PER_CONTEXT_TOKEN, DEFAULT_ONLY, IGNORED, IGNORED_HEADER,  # noqa: F401
                      ChatRequest, CompletionRequest, DetokenizeRequest, RequestError, Shape, TokenizeRequest,
                      error_response, parse_body, parse_request, unknown_fields)

log = logging.getLogger("orl.serve.server")

# The endpoints /metrics counts responses of (anything else is counted as "other")
ENDPOINTS = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/v1/models/{id}", "/tokenize",
             "/detokenize", "/metrics", "/health", "/explore")
_MAX_LOGGED_FIELDS = 1000  # distinct ignored field names logged (a client inventing names cannot flood the log)
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_.\[\]-]{1,200}")  # an ignored field named as is; others JSON-quoted


def _sse(obj) -> str:
    return f"data: {json.dumps(obj)}\n\n"


class StatusCounter:
    """ASGI middleware: counts every response the app starts by endpoint and status code (the
    responses of the connection guards, written before the app sees a request, are not counted).
    Passes ``receive`` through untouched, so disconnect detection works as without it."""

    def __init__(self, app, metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        endpoint = path if path in ENDPOINTS else "/v1/models/{id}" if path.startswith("/v1/models/") else "other"
        started = False

        async def counted(message):
            nonlocal started
            if message["type"] == "http.response.start" and not started:
                started = True
                self.metrics.response(endpoint, message["status"])
            await send(message)

        try:
            await self.app(scope, receive, counted)
        except Exception:
            if not started:  # the outer error middleware answers 500
                self.metrics.response(endpoint, 500)
            raise


# --------------------------------------------------------------------------- the app
def create_app(llm, model_name: str, queue_size: int = 16, max_body_bytes: int | None = None,
               warmup: bool = True) -> FastAPI:
    """The FastAPI app serving ``llm`` under ``model_name``. ``app.state.scheduler`` exposes the
    queue, its counters, its arrival/start/finish order and its `Metrics`."""
    scheduler = Scheduler(llm, queue_size, warmup)
    body_limit = max_body_bytes or max(BYTES_PER_CONTEXT_TOKEN * llm.context_length, 1 << 16)
    started = int(time.time())
    logged_fields: set[str] = set()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        scheduler.start()
        yield
        await run_in_threadpool(scheduler.stop)

    app = FastAPI(title="orl", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.scheduler = scheduler
    app.state.model_name = model_name
    app.add_middleware(StatusCounter, metrics=scheduler.metrics)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return error_response(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", kind)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception):
        log.exception("unhandled error on %s", request.url.path)
        return error_response(500, f"internal server error ({type(exc).__name__}); the server is still running",
                              "server_error")

    def ignored(req) -> dict:
        """The X-Ignored-Fields header for ``req``'s unknown fields (logged once per name), or {}."""
        names = unknown_fields(req)
        if not names:
            return {}
        shown = [f if _PLAIN_NAME.fullmatch(f) else json.dumps(f) for f in names]  # others quoted, ASCII
        new = [f for f in dict.fromkeys(shown) if f not in logged_fields]
        if new and len(logged_fields) < _MAX_LOGGED_FIELDS:
            logged_fields.update(new)
            log.warning("ignoring request fields this server does not know: %s (logged once per name; each "
                        "response names them in its %s header)", ", ".join(new), IGNORED_HEADER)
        value = ", ".join(shown)
        return {IGNORED_HEADER: value if len(value) <= 1000 else value[:997] + "..."}

    def not_served(name: str, headers: dict | None = None) -> JSONResponse:
        return error_response(404, f"model {name!r} does not exist; this server serves {model_name!r} "
                                   "(see GET /v1/models)", param="model", code="model_not_found", headers=headers)

    def card() -> dict:
        return {"id": model_name, "object": "model", "created": started, "owned_by": "orl",
                "max_model_len": llm.context_length}

    @app.get("/health")
    async def health():
        return {"status": "ok", "ready": scheduler.ready.is_set(), "running": scheduler.running is not None,
                "waiting": scheduler.waiting(), "queue_size": queue_size, "counts": dict(scheduler.counts)}

    @app.get("/metrics")
    async def metrics():
        return Response(scheduler.metrics.prometheus(scheduler), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        return card() if model_id == model_name else not_served(model_id)

    async def body_of(request: Request, schema):
        """(validated body, headers) or an error response."""
        try:
            req = (parse_request if schema in (CompletionRequest, ChatRequest) else parse_body)(
                await _read_body(request, body_limit), request.headers.get("content-type"), schema)
        except ClientDisconnect:  # gone before sending its whole body: nobody to answer
            return Response(status_code=499), None
        except RequestError as e:
            return error_response(e.status, str(e), param=e.param, code=e.code), None
        return req, ignored(req)

    @app.post("/tokenize")
    async def tokenize(request: Request):
        req, headers = await body_of(request, TokenizeRequest)
        if headers is None:
            return req
        if req.model is not None and req.model != model_name:
            return not_served(req.model, headers)
        if (req.prompt is None) == (req.messages is None):
            return error_response(400, "send exactly one of prompt (text) or messages (a chat)", param="prompt",
                                  headers=headers)
        prompt = req.prompt_value()
        try:
            ids = await run_in_threadpool(lambda: llm.tokenize(
                prompt, add_special_tokens=bool(req.add_special_tokens),
                add_generation_prompt=req.add_generation_prompt is not False))
        except ValueError as e:
            return error_response(400, str(e), param="prompt" if req.prompt is not None else "messages",
                                  headers=headers)
        return JSONResponse({"count": len(ids), "max_model_len": llm.context_length, "tokens": ids,
                             "token_strs": llm.token_pieces(ids) if req.return_token_strs else None},
                            headers=headers)

    @app.post("/detokenize")
    async def detokenize(request: Request):
        req, headers = await body_of(request, DetokenizeRequest)
        if headers is None:
            return req
        if req.model is not None and req.model != model_name:
            return not_served(req.model, headers)
        try:
            text = await run_in_threadpool(llm.detokenize, req.tokens)
        except ValueError as e:
            return error_response(400, str(e), param="tokens", headers=headers)
        return JSONResponse({"prompt": text}, headers=headers)

    async def handle(request: Request, schema) -> object:
        req, headers = await body_of(request, schema)
        if headers is None:
            return req
        if req.model != model_name:
            return not_served(req.model, headers)
        chat = schema is ChatRequest
        prompts, params = req.prompts(), req.prompt_params()
        echo = bool(getattr(req, "echo", False))

        def count():  # tokenising long prompts must not block the event loop
            counts, texts = [], []
            for p, param in zip(prompts, params):
                try:
                    counts.append(llm.count_tokens(p))
                    texts.append((p if isinstance(p, str) else llm.detokenize(p)) if echo else None)
                except ValueError as e:
                    return param, e
            return counts, texts

        counted = await run_in_threadpool(count)
        if isinstance(counted[0], str):
            param, e = counted
            return error_response(400, str(e), param=param, code=getattr(e, "code", None), headers=headers)
        counts, texts = counted
        max_tokens = req.max_tokens_value()
        if max_tokens is None:
            max_tokens = min(256, min(llm.max_new_tokens_fit(c) for c in counts)) or 1
        for c, param in zip(counts, params):
            try:
                if max_tokens > 0:  # 0: echo only, nothing decoded
                    llm.check_lengths(c, max_tokens)
            except ValueError as e:
                return error_response(400, str(e), param=param if e.param == "prompt" else req.max_tokens_param(),
                                      code="context_length_exceeded", headers=headers)
        if req.top_p is not None:
            try:  # the family must take it (DiffusionGemma's rule samples its own schedule)
                dataclasses.replace(llm.decode_config, top_p=req.top_p)
            except ValueError as e:
                return error_response(400, str(e), param="top_p", headers=headers)
        n = req.n or 1
        shape = Shape(chat, model_name, n=n, echo=texts if echo else None, strings=llm.token_strings)
        if max_tokens == 0:
            from .llm import Generation  # noqa: PLC0415 - loaded with the LLM already
            return JSONResponse(shape.full([Generation("", [], "length", 0.0, 0.0, 0, 0, 0.0, 0.0, c, 0)
                                            for c in counts for _ in range(n)]), headers=headers)
        job = Job(kwargs=dict(max_new_tokens=max_tokens, temperature=req.temperature_value(), stop=req.stop,
                              seed=req.seed, ignore_eos=bool(req.ignore_eos), top_p=req.top_p,
                              logprobs=req.logprobs_k()),
                  loop=asyncio.get_running_loop(), tag=req.user, prompts=prompts, n=n)
        try:
            scheduler.submit(job)
        except QueueFull:
            wait = scheduler.retry_after()
            return error_response(429, f"the server is busy: {queue_size} requests already wait for the single "
                                       f"decoder; retry in about {wait} s", "rate_limit_error", code="queue_full",
                                  headers={"Retry-After": str(wait), **headers})
        if req.stream:
            usage = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(_stream(job, shape, usage), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **headers})
        return await _wait(request, job, shape, headers)

    async def _stream(job: Job, shape: Shape, include_usage: bool):
        done = False
        try:
            if shape.chat:
                yield _sse(shape.chunk(role=True))
            if shape.echo and shape.echo[0]:
                yield _sse(shape.chunk(shape.echo[0]))
            while True:
                kind, payload = await job.events.get()
                if kind == "text":
                    yield _sse(shape.chunk(payload))
                    continue
                if kind == "done":
                    yield _sse(shape.chunk(finish=payload[0].finish_reason))
                    if include_usage:
                        yield _sse(shape.usage_chunk(payload[0]))
                elif kind == "error":
                    yield _sse({"error": {"message": f"decoding failed ({type(payload).__name__})",
                                          "type": "server_error", "param": None, "code": None}})
                done = True
                yield "data: [DONE]\n\n"
                return
        finally:  # the client went away (or the task was cancelled): free the decoder
            if not done:
                scheduler.cancel(job)

    async def _wait(request: Request, job: Job, shape: Shape, headers: dict):
        while True:
            try:
                kind, payload = await asyncio.wait_for(job.events.get(), timeout=0.25)
            except TimeoutError:
                if await request.is_disconnected():
                    scheduler.cancel(job)
                    return error_response(499, "client closed the request", code="client_closed")
                continue
            if kind == "done":
                return JSONResponse(shape.full(payload), headers=headers)
            if kind == "error":
                return error_response(500, f"decoding failed ({type(payload).__name__}); the server is still "
                                           "running", "server_error")
            if kind == "dropped":
                return error_response(503, "the server is shutting down", "server_error")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await handle(request, CompletionRequest)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await handle(request, ChatRequest)

    return app


async def _read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing (413) more than ``limit`` bytes without reading it all."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestError(f"request body of {declared} bytes exceeds the limit of {limit} bytes", status=413,
                           code="request_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(f"request body exceeds the limit of {limit} bytes", status=413,
                               code="request_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


# --------------------------------------------------------------------------- connection guards
@dataclass
class Limits:
    """How much of the server one client may hold; ``orl serve`` sets each field from the option of
    the same name (``--max-connections`` ...)."""

    max_connections: int = 512            # connections held at once (at most the open-file limit allows)
    timeout_header: float = 10.0          # s from connecting (or a kept-alive request's first byte) to the head
    timeout_body: float = 30.0            # s from the head to the last body byte (bounds an unread body too)
    timeout_keep_alive: float = 5.0       # uvicorn's: idle between two requests
    h11_max_incomplete_event_size: int = 16 * 1024  # uvicorn's: a longer request head is a 400
    limit_concurrency: int | None = None  # uvicorn's 503 cap (counts idle connections too); None: off
    backlog: int = 2048                   # the listening socket's accept queue

    def __post_init__(self) -> None:
        for name in ("max_connections", "h11_max_incomplete_event_size", "backlog"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 (got {getattr(self, name)})")
        for name in ("timeout_header", "timeout_body", "timeout_keep_alive"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 s (got {getattr(self, name)})")
        if self.limit_concurrency is not None and self.limit_concurrency < 1:
            raise ValueError(f"limit_concurrency must be >= 1 or None (got {self.limit_concurrency})")


def fit_open_files(limits: Limits, reserve: int = 64) -> tuple[Limits, str | None]:
    """``limits`` lowered to fit this process's open-file limit less ``reserve`` descriptors (model
    files, pipes, threads): at most half of it for held connections, and ``backlog`` at most a
    quarter of the rest, because asyncio accepts up to ``backlog`` sockets in one go and a flood
    keeps a few such bursts in flight (accepted, not yet seen by the cap, or closing) besides the
    held ones. Returns the note to print when it had to lower them."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    room = (1 << 20) if soft == resource.RLIM_INFINITY else soft - reserve
    conns = max(min(limits.max_connections, room // 2), 1)
    backlog = max(min(limits.backlog, (room - conns) // 4), 1)
    if (conns, backlog) == (limits.max_connections, limits.backlog):
        return limits, None
    changed = [f"{k} {a} -> {b}" for k, a, b in (("max_connections", limits.max_connections, conns),
                                                 ("backlog", limits.backlog, backlog)) if a != b]
    note = f"{', '.join(changed)}: the open-file limit (ulimit -n {soft}) leaves room for no more"
    return dataclasses.replace(limits, max_connections=conns, backlog=backlog), note


# "METHOD SP TARGET SP HTTP/x.y" as h11 parses it (a token, visible characters; a line ends at LF),
# and the prefixes of one: what the first bytes of a request must look like
_REQUEST_LINE = re.compile(rb"[-!#$%&'*+.^_`|~0-9A-Za-z]{1,32} [\x21-\x7e]+ HTTP/[0-9]\.[0-9]\r?")
_REQUEST_LINE_START = re.compile(rb"[-!#$%&'*+.^_`|~0-9A-Za-z]{0,32}(?: [\x21-\x7e]*(?: [\x21-\x7e]*\r?)?)?")
_LINE_CHECK = 64  # bytes of a request line looked at before h11 takes over


def _raw_response(status: int, message: str, code: str, retry_after: int | None = None) -> bytes:
    """A complete HTTP/1.1 response with an OpenAI-style error body that closes the connection,
    written straight to the socket (h11 will not send a response before a request head)."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()
    head = (f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n"
            + (f"retry-after: {retry_after}\r\n" if retry_after else "") + "\r\n")
    return head.encode() + body


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 connection with `Limits`' deadlines and connection cap.

    One deadline timer per connection, never pushed back by arriving bytes: "header" while the
    client owes a request head (from connecting, or from the first byte of its next request),
    "body" while it owes the body (also after a response that did not need it, e.g. a 413: a
    client trickling an unread body otherwise resets uvicorn's keep-alive timer forever), none
    while the server owes the response (queued or decoding: the client waits for us). A subclass
    per server (`protocol_for`) holds its `Limits` and its open connections, oldest first."""

    limits: Limits
    held: collections.OrderedDict

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._waiting_for: str | None = None   # "header" | "body" | None
        self._line: bytes | None = b""         # this request's line so far; None once it looked valid

    # -- uvicorn's protocol hooks
    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self.held[self] = None
        if len(self.held) > self.limits.max_connections and not self._make_room():
            self._abort(503, f"the server holds its limit of {self.limits.max_connections} connections and every "
                             "one is busy with a request; retry in a moment", "too_many_connections", retry_after=1)
            return
        self._arm("header")

    def connection_lost(self, exc) -> None:
        self.held.pop(self, None)
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._line is not None and self.conn.their_state is h11.IDLE and not self._plausible(data):
            self._abort(400, "this is not an HTTP/1.1 request (the bytes cannot start a request line)", "invalid_http")
            return
        super().data_received(data)
        self._follow()

    # -- deadlines
    def _follow(self) -> None:
        """Point the deadline at what the client owes now (after h11 consumed the new bytes)."""
        if self.transport.is_closing():
            return self._disarm()
        state = self.conn.their_state
        if state is h11.IDLE:
            if self._waiting_for != "header":
                self._arm("header")
            return
        self._line = b""  # the head is in: the next request's line is checked afresh
        if state is h11.SEND_BODY:
            if self._waiting_for != "body":
                self._arm("body")
        else:
            self._disarm()

    def _arm(self, what: str) -> None:
        self._disarm()
        seconds = self.limits.timeout_header if what == "header" else self.limits.timeout_body
        self._deadline, self._waiting_for = self.loop.call_later(seconds, self._expired, what), what

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline, self._waiting_for = None, None

    def _expired(self, what: str) -> None:
        self._deadline, self._waiting_for = None, None
        if self.transport.is_closing():
            return
        if what == "header":
            started = self._line != b""  # a fresh or idle connection that sent nothing just closes
            self._abort(408 if started else None, f"the request head did not arrive within "
                        f"{self.limits.timeout_header:g} s", "request_timeout")
        else:  # a 408 unless the response already went out (then it just closes)
            self._abort(408, f"the request body did not arrive within {self.limits.timeout_body:g} s",
                        "request_timeout")

    # -- the request line, before h11 has a whole head to parse
    def _plausible(self, data: bytes) -> bool:
        line = self._line + data[:_LINE_CHECK - len(self._line)]
        end = line.find(b"\n")
        ok = (_REQUEST_LINE if end >= 0 else _REQUEST_LINE_START).fullmatch(line[:end] if end >= 0 else line)
        self._line = None if end >= 0 or len(line) >= _LINE_CHECK else line
        return ok is not None

    # -- the cap
    def _evictable(self) -> bool:
        """Holds no request the server works on: idle between requests, or still sending one."""
        if self.transport.is_closing():
            return False
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            return True
        return self.conn.their_state in (h11.IDLE, h11.SEND_BODY) and not cycle.response_started

    def _make_room(self) -> bool:
        for other in self.held:
            if other is not self and other._evictable():
                # told why unless it idles after an answer (a pooled client must not read a stray 503)
                idle = other.cycle is not None and other.cycle.response_complete and other._line == b""
                other._abort(None if idle else 503, "closed to make room for a new connection: the server holds "
                             f"its limit of {self.limits.max_connections}; retry", "too_many_connections", 1)
                return True
        return False

    def _abort(self, status: int | None, message: str, code: str, retry_after: int | None = None) -> None:
        """Close the connection, first answering ``status`` (None: nothing) unless a response of ours
        is already on the wire; a handler still reading the body sees a disconnect."""
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            on_wire = cycle.response_started
            cycle.disconnected = True   # its receive() now returns http.disconnect, its send() nothing
            cycle.message_event.set()
        else:
            on_wire = cycle is not None and self.conn.their_state is h11.SEND_BODY  # answered, body unread
        if status is not None and not on_wire:
            self.transport.write(_raw_response(status, message, code, retry_after))
        self.held.pop(self, None)
        self._disarm()
        self.transport.close()


def protocol_for(limits: Limits) -> type[GuardedH11Protocol]:
    """A `GuardedH11Protocol` class of one server: its limits and its own table of connections."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"limits": limits, "held": collections.OrderedDict()})


def server_config(app, limits: Limits | None = None, **kwargs) -> uvicorn.Config:
    """The uvicorn config serving ``app`` under ``limits`` (``kwargs``: host, port, log_level ...)."""
    limits = limits or Limits()
    return uvicorn.Config(app, http=protocol_for(limits), timeout_keep_alive=limits.timeout_keep_alive,
                          limit_concurrency=limits.limit_concurrency, backlog=limits.backlog,
                          h11_max_incomplete_event_size=limits.h11_max_incomplete_event_size, **kwargs)


# --------------------------------------------------------------------------- `orl serve`
def cli(argv: list[str] | None = None) -> int:
    from ..cli import HelpFormatter  # noqa: PLC0415
    from .generate_cli import ROLE_HELP, add_llm_args  # noqa: PLC0415
    d = Limits()
    ap = argparse.ArgumentParser(prog="orl serve", formatter_class=HelpFormatter,
                                 description="OpenAI-compatible HTTP server: one request "
                                 "decodes at a time, the rest wait in a bounded FIFO queue.")
    ap.add_argument("--model", required=True, help="checkpoint directory or named size (sdar/tiny, qwen3-4b)")
    ap.add_argument("--host", default="127.0.0.1", help="bind address (default loopback; there is no auth)")
    ap.add_argument("--port", type=int, default=8000, help="TCP port")
    ap.add_argument("--role", default="base", choices=("base", "orl"), help=ROLE_HELP)
    ap.add_argument("--queue-size", type=int, default=16, help="requests that may wait (more get 429)")
    ap.add_argument("--served-model-name", default=None, help="name clients pass as `model` (default --model)")
    ap.add_argument("--max-body-bytes", type=int, default=None,
                    help=f"request body limit (413 beyond; default {BYTES_PER_CONTEXT_TOKEN} bytes per context token)")
    g = ap.add_argument_group("connection limits (see orl.serve.server.Limits)")
    g.add_argument("--max-connections", type=int, default=d.max_connections,
                   help="connections held at once; at the cap the oldest idle one is closed, else 503 "
                        f"(default {d.max_connections}; with --backlog, within the open-file limit)")
    g.add_argument("--timeout-header", type=float, default=d.timeout_header,
                   help=f"seconds to send the request head (408 after; default {d.timeout_header:g})")
    g.add_argument("--timeout-body", type=float, default=d.timeout_body,
                   help=f"seconds to send the request body after its head (408 after; default {d.timeout_body:g})")
    g.add_argument("--timeout-keep-alive", type=float, default=d.timeout_keep_alive,
                   help=f"seconds an idle connection stays open between requests (default {d.timeout_keep_alive:g})")
    g.add_argument("--h11-max-incomplete-event-size", type=int, default=d.h11_max_incomplete_event_size,
                   help=f"largest request head (400 beyond; default {d.h11_max_incomplete_event_size})")
    g.add_argument("--limit-concurrency", type=int, default=d.limit_concurrency,
                   help="uvicorn's own cap: 503 to every request while this many connections or requests exist, "
                        "idle ones included (default off: --max-connections keeps /health answering)")
    g.add_argument("--backlog", type=int, default=d.backlog, help=f"accept queue length (default {d.backlog})")
    add_llm_args(ap)
    ap.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug", "trace"),
                    help="uvicorn's log level")
    ap.add_argument("--explore", action="store_true", help="also serve GET /explore, the decode explorer page "
                    "for the served model (orl.explore.route; off by default)")
    args = ap.parse_args(argv)

    from ..decode import DecodeConfig  # noqa: PLC0415
    from ..recipes.overrides import parse_sets  # noqa: PLC0415
    from ..recipes.validate import validate  # noqa: PLC0415
    from .llm import LLM  # noqa: PLC0415
    limits, note = fit_open_files(Limits(
        max_connections=args.max_connections, timeout_header=args.timeout_header, timeout_body=args.timeout_body,
        timeout_keep_alive=args.timeout_keep_alive, h11_max_incomplete_event_size=args.h11_max_incomplete_event_size,
        limit_concurrency=args.limit_concurrency, backlog=args.backlog))
    if note:
        print(f"orl serve: {note}")
    if args.max_body_bytes is not None and args.max_body_bytes < 1:
        raise ValueError(f"--max-body-bytes must be >= 1 (got {args.max_body_bytes})")
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"orl serve: warning: listening on {args.host}; the server has no authentication")
    llm = LLM(args.model, role=args.role, device=args.device, dtype=args.dtype, tokenizer=args.tokenizer,
              engine=args.engine, **parse_sets(args.set, DecodeConfig))
    validate(llm.decode_config)  # the protocol's ranges, before the warm-up decode would trip on one
    app = create_app(llm, args.served_model_name or args.model, queue_size=args.queue_size,
                     max_body_bytes=args.max_body_bytes)
    if args.explore:
        from ..explore.route import add_explore_route  # noqa: PLC0415
        add_explore_route(app, llm, args.served_model_name or args.model)
    uvicorn.Server(server_config(app, limits, host=args.host, port=args.port, log_level=args.log_level)).run()
    return 0
