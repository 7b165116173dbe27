"""OpenAI-compatible HTTP server around one `LLM`: validation, a bounded FIFO queue, SSE streaming.

Owns the HTTP surface (engine-notes.md section 6): POST /v1/completions and /v1/chat/completions
(non-streaming and SSE), GET /v1/models, GET /health; request validation with errors that name
the offending field (OpenAI-style bodies, always 4xx); a single worker thread that decodes one
request at a time while the rest wait in a bounded FIFO queue (full: 429 + Retry-After); and
cancellation (a client that goes away is cancelled at the next block boundary, or dropped from
the queue). Nothing a client sends may crash or wedge it: unexpected errors become 500 JSON and
the worker keeps running.

Does not own: tensors, token ids or the decoder (`orl.engine.llm.LLM` turns text into text),
sampling features the block decoder lacks (top_p, penalties, logprobs: accepted only where
they are no-ops, see ``IGNORED`` and ``DEFAULT_ONLY``), batching (one request at a time).
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import logging
import math
import threading
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

log = logging.getLogger("orl.engine.server")
BYTES_PER_CONTEXT_TOKEN = 16  # request body limit: far above any prompt that fits the context


def error_response(status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                   code: str | None = None, headers: dict | None = None) -> JSONResponse:
    body = {"error": {"message": _printable(message), "type": type_, "param": _printable(param), "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


def _printable(text: str | None) -> str | None:
    """Client text echoed in an error (an unknown key) may hold lone surrogates: escape them."""
    return None if text is None else text.encode("utf-8", "backslashreplace").decode("utf-8")


# --------------------------------------------------------------------------- request schemas
class RequestError(ValueError):
    """A request the client must fix: HTTP ``status``, the offending ``param`` and a ``code``."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.param, self.status, self.code = param, status, code


class _Strict(BaseModel):
    # strict: no "10" -> 10 coercion; forbid: a misspelt field is an error, not silently ignored
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class StreamOptions(_Strict):
    include_usage: bool | None = None


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class Message(_Strict):
    role: Literal["system", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = Field(None, max_length=256)  # accepted, not rendered


class ResponseFormat(_Strict):
    type: Literal["text"]


class _Common(_Strict):
    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)   # None: the decoding protocol's
    top_p: float | None = Field(None, ge=0, le=1)          # ignored (see IGNORED)
    n: int | None = Field(None, ge=1)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-(1 << 63), le=(1 << 64) - 1)
    user: str | None = Field(None, max_length=256)         # recorded in the server's order log
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    ignore_eos: bool | None = None                        # vLLM extension: decode the full budget

    def max_tokens_value(self) -> int | None:
        return self.max_tokens

    def max_tokens_param(self) -> str:
        return "max_tokens"

    def temperature_value(self) -> float | None:
        return self.temperature


class CompletionRequest(_Common):
    prompt: str | list[str]
    echo: bool | None = None
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    def prompt_value(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


class ChatRequest(_Common):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = None
    response_format: ResponseFormat | None = None
    tools: list[dict] | None = None
    tool_choice: Literal["none"] | None = None
    parallel_tool_calls: bool | None = None

    def max_tokens_value(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def max_tokens_param(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"

    def prompt_value(self) -> list[dict]:
        return [{"role": m.role, "content": m.content if isinstance(m.content, str) else
                 "".join(p.text for p in m.content)} for m in self.messages]


# Fields accepted with any valid value and ignored: top_p (the family's acceptance rule decides
# which tokens commit, there is no nucleus), parallel_tool_calls, user (only logged), name.
IGNORED = ("top_p", "parallel_tool_calls")
# Fields accepted only at their no-op value; anything else is a 400 naming the field.
DEFAULT_ONLY = {"n": (None, 1), "presence_penalty": (None, 0), "frequency_penalty": (None, 0),
                "logit_bias": (None, {}), "echo": (None, False), "logprobs": (None, False, 0),
                "best_of": (None, 1), "suffix": (None, ""), "top_logprobs": (None, 0), "tools": (None, [])}
_FIELD_NAMES = {f for m in (CompletionRequest, ChatRequest, Message, TextPart, StreamOptions, ResponseFormat)
                for f in m.model_fields}


def _param(loc: tuple) -> str | None:
    """'messages[0].content' from a pydantic loc (union-branch tags such as 'list[str]' dropped)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in _FIELD_NAMES:
            out += f".{part}" if out else part
    return out or None


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def parse_request(body: bytes, content_type: str | None, schema: type[_Common]) -> _Common:
    """Validate one request body; raise RequestError naming the first offending field."""
    if content_type and "application/json" not in content_type.lower():
        raise RequestError(f"unsupported Content-Type {content_type[:100]!r}; send a JSON body with "
                           "Content-Type: application/json", status=415, code="unsupported_media_type")
    try:
        data = json.loads(body)
    except RecursionError:
        raise RequestError("malformed JSON: nested too deeply", code="invalid_json") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, too many digits
        raise RequestError(f"malformed JSON: {str(e)[:200]}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise RequestError(f"the request body must be a JSON object, got {type(data).__name__}")
    for key, value in data.items():  # JSON may escape lone surrogates (\ud800) that no text can hold
        try:
            ok = _is_unicode(key) and _is_unicode(json.dumps(value, ensure_ascii=False))
        except RecursionError:
            raise RequestError("malformed JSON: nested too deeply", param=key, code="invalid_json") from None
        if not ok:
            raise RequestError(f"field {_printable(key)!r} holds invalid Unicode (a lone surrogate escape)",
                               param=key, code="invalid_value")
    try:
        req = schema.model_validate(data)
    except RecursionError:
        raise RequestError("malformed JSON: nested too deeply", code="invalid_json") from None
    except ValidationError as e:
        errs = e.errors(include_url=False, include_input=False)
        first = errs[0]
        param = _param(first["loc"])
        if first["type"] == "extra_forbidden":  # the unknown key itself is the loc's last part
            parent = _param(first["loc"][:-1])
            param = f"{parent}.{first['loc'][-1]}" if parent else str(first["loc"][-1])
            allowed = ", ".join(sorted(schema.model_fields)) if len(first["loc"]) == 1 else None
            raise RequestError(f"unknown field {param!r}" + (f"; accepted fields: {allowed}" if allowed else ""),
                               param=param, code="unknown_field") from None
        if first["type"] == "missing":
            raise RequestError(f"missing required field {param!r}", param=param, code="missing_field") from None
        msgs = list(dict.fromkeys(x["msg"] for x in errs if _param(x["loc"]) == param))[:3]
        raise RequestError(f"invalid value for {param!r}: {'; or '.join(msgs)}", param=param,
                           code="invalid_value") from None
    for name, allowed in DEFAULT_ONLY.items():
        value = getattr(req, name, None)
        if value not in allowed:  # pydantic already checked the type (strict: no bool for int)
            raise RequestError(f"{name}={json.dumps(value)[:100]} is not supported by this server; omit it",
                               param=name, code="unsupported")
    if isinstance(req, CompletionRequest) and isinstance(req.prompt, list) and len(req.prompt) != 1:
        raise RequestError(f"prompt must be one string (got a list of {len(req.prompt)}); batched prompts are "
                           "not supported, send one request per prompt", param="prompt")
    stops = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
    if len(stops) > 16 or any(not s for s in stops):
        raise RequestError("stop must be a non-empty string or a list of at most 16 non-empty strings",
                           param="stop")
    return req


# --------------------------------------------------------------------------- the single worker
class QueueFull(Exception):
    pass


@dataclass(eq=False)
class Job:
    """One admitted request: the LLM.generate arguments and the channel back to its handler."""

    kwargs: dict
    loop: asyncio.AbstractEventLoop
    tag: str | None = None
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)
    state: str = "queued"  # queued -> running -> done | dropped

    def emit(self, kind: str, payload=None) -> None:
        """Called from the worker thread: hand (kind, payload) to the handler's event loop."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, payload))
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass


class Scheduler:
    """One worker thread decoding jobs in arrival order; at most ``queue_size`` jobs wait.

    Records arrival, start and finish order (bounded) and counters, which /health reports and
    tests use to check FIFO service and cancellation."""

    def __init__(self, llm, queue_size: int, warmup: bool = True):
        if queue_size < 0:
            raise ValueError(f"queue_size must be >= 0, got {queue_size}")
        self.llm, self.queue_size, self._warmup = llm, queue_size, warmup
        self._cond = threading.Condition()
        self._queue: collections.deque[Job] = collections.deque()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.ready = threading.Event()  # set once the warm-up decode is done
        self.running: Job | None = None
        self.counts = collections.Counter()
        self.arrivals: collections.deque = collections.deque(maxlen=1000)
        self.starts: collections.deque = collections.deque(maxlen=1000)
        self.finished: collections.deque = collections.deque(maxlen=1000)  # (id, tag, finish, tokens)
        self._latencies: collections.deque = collections.deque(maxlen=20)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, daemon=True, name="orl-engine-worker")
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        with self._cond:
            self._stopping = True
            for job in self._queue:
                job.state = "dropped"
                job.emit("dropped")
            self._queue.clear()
            if self.running is not None:
                self.running.cancel.set()
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def waiting(self) -> int:
        with self._cond:
            return len(self._queue)

    def submit(self, job: Job) -> None:
        with self._cond:
            busy = self.running is not None
            if self._stopping or len(self._queue) + busy > self.queue_size:
                self.counts["rejected"] += 1
                raise QueueFull
            self._queue.append(job)
            self.counts["admitted"] += 1
            self.arrivals.append(job.tag or job.id)
            self._cond.notify()

    def cancel(self, job: Job) -> None:
        """Drop ``job`` if it still waits; else stop it at the next block boundary."""
        with self._cond:
            if job.state == "queued" and job in self._queue:
                self._queue.remove(job)
                job.state = "dropped"
                self.counts["dropped"] += 1
                return
        job.cancel.set()

    def retry_after(self) -> int:
        """Seconds a rejected client should wait: recent latency x jobs ahead, clamped to [1, 120]."""
        mean = sum(self._latencies) / len(self._latencies) if self._latencies else 1.0
        return int(min(max(math.ceil(mean * (self.waiting() + 1)), 1), 120))

    def _loop(self) -> None:
        if self._warmup:  # one-time setup before the first request, not inside its latency
            try:
                self.llm.warmup()
            except Exception:
                log.exception("warm-up decode failed; serving anyway")
        self.ready.set()
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                job = self._queue.popleft()
                job.state, self.running = "running", job
                self.starts.append(job.tag or job.id)
            t0 = time.perf_counter()
            try:
                gen = self.llm.generate(**job.kwargs, on_text=lambda d, j=job: j.emit("text", d),
                                        cancel=job.cancel)
                self.counts["cancelled" if gen.finish_reason == "cancelled" else "completed"] += 1
                self.finished.append((job.id, job.tag, gen.finish_reason, gen.completion_tokens))
                job.emit("done", gen)
            except Exception as e:  # a failed request must not take the worker down
                log.exception("request %s failed", job.id)
                self.counts["failed"] += 1
                self.finished.append((job.id, job.tag, "error", 0))
                job.emit("error", e)
            finally:
                self._latencies.append(time.perf_counter() - t0)
                with self._cond:
                    job.state, self.running = "done", None


# --------------------------------------------------------------------------- response bodies
def _usage(gen) -> dict:
    return {"prompt_tokens": gen.prompt_tokens, "completion_tokens": gen.completion_tokens,
            "total_tokens": gen.prompt_tokens + gen.completion_tokens}


def _metrics(gen) -> dict:
    """orl extension: the decode's own numbers (clients ignore unknown top-level fields)."""
    return {k: getattr(gen, k) for k in ("tpf", "tpf_no_commit", "forwards", "latency_s", "request_tps")}


class _Shape:
    """The id, object names and choice layout of one endpoint's responses."""

    def __init__(self, chat: bool, model: str):
        self.chat, self.model = chat, model
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def full(self, gen) -> dict:
        choice = {"index": 0, "logprobs": None, "finish_reason": gen.finish_reason}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": gen.text}
        else:
            choice["text"] = gen.text
        return {**self._head("chat.completion" if self.chat else "text_completion"), "choices": [choice],
                "usage": _usage(gen), "metrics": _metrics(gen)}

    def chunk(self, text: str | None = None, finish: str | None = None, role: bool = False) -> dict:
        choice: dict = {"index": 0, "logprobs": None, "finish_reason": finish}
        if self.chat:
            delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text else {})
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        return {**self._head("chat.completion.chunk" if self.chat else "text_completion"), "choices": [choice]}

    def usage_chunk(self, gen) -> dict:
        return {**self._head("chat.completion.chunk" if self.chat else "text_completion"), "choices": [],
                "usage": _usage(gen), "metrics": _metrics(gen)}


def _sse(obj) -> str:
    return f"data: {json.dumps(obj)}\n\n"


# --------------------------------------------------------------------------- the app
def create_app(llm, model_name: str, queue_size: int = 16, max_body_bytes: int | None = None,
               warmup: bool = True) -> FastAPI:
    """The FastAPI app serving ``llm`` under ``model_name``. ``app.state.scheduler`` exposes the
    queue, its counters and its arrival/start/finish order."""
    scheduler = Scheduler(llm, queue_size, warmup)
    body_limit = max_body_bytes or max(BYTES_PER_CONTEXT_TOKEN * llm.context_length, 1 << 16)
    started = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        scheduler.start()
        yield
        await run_in_threadpool(scheduler.stop)

    app = FastAPI(title="orl", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.scheduler = scheduler
    app.state.model_name = model_name

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return error_response(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", kind)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception):
        log.exception("unhandled error on %s", request.url.path)
        return error_response(500, f"internal server error ({type(exc).__name__}); the server is still running",
                              "server_error")

    @app.get("/health")
    async def health():
        return {"status": "ok", "ready": scheduler.ready.is_set(), "running": scheduler.running is not None,
                "waiting": scheduler.waiting(), "queue_size": queue_size, "counts": dict(scheduler.counts)}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": started,
                                            "owned_by": "orl", "max_model_len": llm.context_length}]}

    async def handle(request: Request, schema) -> object:
        try:
            req = parse_request(await _read_body(request, body_limit), request.headers.get("content-type"), schema)
        except ClientDisconnect:  # gone before sending its whole body: nobody to answer
            return Response(status_code=499)
        except RequestError as e:
            return error_response(e.status, str(e), param=e.param, code=e.code)
        if req.model != model_name:
            return error_response(404, f"model {req.model!r} does not exist; this server serves {model_name!r} "
                                       "(see GET /v1/models)", param="model", code="model_not_found")
        chat = schema is ChatRequest
        prompt = req.prompt_value()
        prompt_param = "messages" if chat else "prompt"
        try:  # tokenising a long prompt must not block the event loop
            n_prompt = await run_in_threadpool(llm.count_tokens, prompt)
            max_tokens = req.max_tokens_value()
            if max_tokens is None:
                max_tokens = min(256, llm.max_new_tokens_fit(n_prompt)) or 1
            llm.check_lengths(n_prompt, max_tokens)
        except ValueError as e:
            param = getattr(e, "param", "prompt")
            param = prompt_param if param == "prompt" else req.max_tokens_param()
            return error_response(400, str(e), param=param,
                                  code="context_length_exceeded" if hasattr(e, "param") else None)
        job = Job(kwargs=dict(prompt=prompt, max_new_tokens=max_tokens, temperature=req.temperature_value(),
                              stop=req.stop, seed=req.seed, ignore_eos=bool(req.ignore_eos)),
                  loop=asyncio.get_running_loop(), tag=req.user)
        try:
            scheduler.submit(job)
        except QueueFull:
            wait = scheduler.retry_after()
            return error_response(429, f"the server is busy: {queue_size} requests already wait for the single "
                                       f"decoder; retry in about {wait} s", "rate_limit_error", code="queue_full",
                                  headers={"Retry-After": str(wait)})
        shape = _Shape(chat, model_name)
        if req.stream:
            usage = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(_stream(job, shape, usage), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return await _wait(request, job, shape)

    async def _stream(job: Job, shape: _Shape, include_usage: bool):
        done = False
        try:
            if shape.chat:
                yield _sse(shape.chunk(role=True))
            while True:
                kind, payload = await job.events.get()
                if kind == "text":
                    yield _sse(shape.chunk(payload))
                    continue
                if kind == "done":
                    yield _sse(shape.chunk(finish=payload.finish_reason))
                    if include_usage:
                        yield _sse(shape.usage_chunk(payload))
                elif kind == "error":
                    yield _sse({"error": {"message": f"decoding failed ({type(payload).__name__})",
                                          "type": "server_error", "param": None, "code": None}})
                done = True
                yield "data: [DONE]\n\n"
                return
        finally:  # the client went away (or the task was cancelled): free the decoder
            if not done:
                scheduler.cancel(job)

    async def _wait(request: Request, job: Job, shape: _Shape):
        while True:
            try:
                kind, payload = await asyncio.wait_for(job.events.get(), timeout=0.25)
            except TimeoutError:
                if await request.is_disconnected():
                    scheduler.cancel(job)
                    return error_response(499, "client closed the request", code="client_closed")
                continue
            if kind == "done":
                return JSONResponse(shape.full(payload))
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


# --------------------------------------------------------------------------- `orl serve`
def cli(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="orl serve", description="OpenAI-compatible HTTP server: one request "
                                 "decodes at a time, the rest wait in a bounded FIFO queue.")
    ap.add_argument("--model", required=True, help="checkpoint directory or named size (sdar/tiny, qwen3-4b)")
    ap.add_argument("--host", default="127.0.0.1", help="bind address (default loopback; there is no auth)")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--role", default="base", choices=("base", "orl"), help="decoding protocol role")
    ap.add_argument("--queue-size", type=int, default=16, help="requests that may wait (more get 429)")
    ap.add_argument("--served-model-name", default=None, help="name clients pass as `model` (default --model)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: per device)")
    ap.add_argument("--tokenizer", default=None, help="qwen3 | char | directory (default: from the model)")
    ap.add_argument("--engine", default="auto", choices=["auto", "reference", "runtime"],
                    help="decoder: auto = the fast runtime on CUDA for greedy SDAR/LLaDA requests, else the reference")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="override a decoding protocol field, e.g. --set threshold=0.8")
    ap.add_argument("--log-level", default="info")
    args = ap.parse_args(argv)
    import uvicorn  # noqa: PLC0415

    from .generate_cli import parse_sets  # noqa: PLC0415
    from .llm import LLM  # noqa: PLC0415
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"orl serve: warning: listening on {args.host}; the server has no authentication")
    llm = LLM(args.model, role=args.role, device=args.device, dtype=args.dtype, tokenizer=args.tokenizer,
              engine=args.engine, **parse_sets(args.set))
    app = create_app(llm, args.served_model_name or args.model, queue_size=args.queue_size)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0
