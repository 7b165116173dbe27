"""OpenAI-compatible HTTP server around one `LLM`: validation, a bounded FIFO queue, SSE streaming.

Owns the HTTP surface (docs/engine.md section 6): POST /v1/completions and /v1/chat/completions
(non-streaming and SSE), GET /v1/models, GET /health; request validation with errors that name
the offending field (OpenAI-style bodies, always 4xx); a single worker thread that decodes one
request at a time while the rest wait in a bounded FIFO queue (full: 429 + Retry-After); and
cancellation (a client that goes away is cancelled at the next block boundary, or dropped from
the queue). Nothing a client sends may crash or wedge it: unexpected errors become 500 JSON and
the worker keeps running.

The request schemas and their validation are `orl.serve.schemas`; the single worker and its queue
`orl.serve.scheduler`; this module is the app (routes, response bodies, SSE) and `orl serve`.
Does not own: tensors, token ids or the decoder (`orl.serve.llm.LLM` turns text into text),
sampling features the block decoder lacks (penalties, logprobs: accepted only where
they are no-ops, see ``IGNORED`` and ``DEFAULT_ONLY``), batching (one request at a time).
"""
from __future__ import annotations

import argparse
import dataclasses
import asyncio
import json
import logging
import time
import uuid
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from .scheduler import Job, QueueFull, Scheduler
from .schemas import (BYTES_PER_CONTEXT_TOKEN, DEFAULT_ONLY, IGNORED, ChatRequest, CompletionRequest,  # noqa: F401
                      RequestError, error_response, parse_request)

log = logging.getLogger("orl.serve.server")


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
        """The response to one Generation, or to the list of n samples of one request (``n``: one
        choice each, usage summed over them, the prompt counted once; metrics of the first)."""
        gens = gen if isinstance(gen, list) else [gen]
        choices = []
        for i, g in enumerate(gens):
            choice = {"index": i, "logprobs": None, "finish_reason": g.finish_reason}
            if self.chat:
                choice["message"] = {"role": "assistant", "content": g.text}
            else:
                choice["text"] = g.text
            choices.append(choice)
        usage = _usage(gens[0])
        if len(gens) > 1:
            done = sum(g.completion_tokens for g in gens)
            usage = {**usage, "completion_tokens": done, "total_tokens": usage["prompt_tokens"] + done}
        return {**self._head("chat.completion" if self.chat else "text_completion"), "choices": choices,
                "usage": usage, "metrics": _metrics(gens[0])}

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
        if req.top_p is not None:
            try:  # the family must take it (DiffusionGemma's rule samples its own schedule)
                dataclasses.replace(llm.decode_config, top_p=req.top_p)
            except ValueError as e:
                return error_response(400, str(e), param="top_p")
        job = Job(kwargs=dict(prompt=prompt, max_new_tokens=max_tokens, temperature=req.temperature_value(),
                              stop=req.stop, seed=req.seed, ignore_eos=bool(req.ignore_eos), n=req.n or 1,
                              top_p=req.top_p),
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
    from .generate_cli import add_llm_args  # noqa: PLC0415
    ap = argparse.ArgumentParser(prog="orl serve", description="OpenAI-compatible HTTP server: one request "
                                 "decodes at a time, the rest wait in a bounded FIFO queue.")
    ap.add_argument("--model", required=True, help="checkpoint directory or named size (sdar/tiny, qwen3-4b)")
    ap.add_argument("--host", default="127.0.0.1", help="bind address (default loopback; there is no auth)")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--role", default="base", choices=("base", "orl"), help="decoding protocol role")
    ap.add_argument("--queue-size", type=int, default=16, help="requests that may wait (more get 429)")
    ap.add_argument("--served-model-name", default=None, help="name clients pass as `model` (default --model)")
    add_llm_args(ap)
    ap.add_argument("--log-level", default="info")
    args = ap.parse_args(argv)
    import uvicorn  # noqa: PLC0415

    from ..recipes.overrides import parse_sets  # noqa: PLC0415
    from .llm import LLM  # noqa: PLC0415
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"orl serve: warning: listening on {args.host}; the server has no authentication")
    llm = LLM(args.model, role=args.role, device=args.device, dtype=args.dtype, tokenizer=args.tokenizer,
              engine=args.engine, **parse_sets(args.set))
    app = create_app(llm, args.served_model_name or args.model, queue_size=args.queue_size)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0
