"""The OpenAI-compatible wire formats of `orl.serve.server`: request schemas, their validation, and
the response bodies.

Owns the request bodies of /v1/completions, /v1/chat/completions, /tokenize and /detokenize
(strict pydantic models: no "8" -> 8 coercion), the fields accepted only where they are no-ops
(``IGNORED``, ``DEFAULT_ONLY``), unknown fields (kept aside and reported by `unknown_fields`, as
vLLM ignores them: the server answers and names them in a header), the checks pydantic cannot
express (text must be valid Unicode, bodies must be JSON objects, which combinations this server
can serve), the OpenAI-style error body every 4xx carries, and the response bodies (`Shape`:
choices, usage, log-probabilities, stream chunks).
Does not own: HTTP routing or streaming (`orl.serve.server`), the queue (`orl.serve.scheduler`),
token ids or text (the server hands `Shape` the `LLM`'s token strings).
"""
from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable
from typing import Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

log = logging.getLogger("orl.serve.server")


BYTES_PER_CONTEXT_TOKEN = 16  # request body limit: far above any prompt that fits the context
MAX_N = 16          # samples per prompt (OpenAI's n), decoded as one batch
MAX_PROMPTS = 64    # prompts in one completions request (decoded one after the other)
MAX_LOGPROBS = 20   # alternatives per token (OpenAI's top_logprobs cap; `orl.serve.llm.MAX_LOGPROBS`)
IGNORED_HEADER = "X-Ignored-Fields"


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
    # strict: no "10" -> 10 coercion; allow: an unknown field is kept in model_extra, ignored by the
    # server and named back to the client (`unknown_fields`), as vLLM ignores them
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)


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


def _messages(messages: list[Message]) -> list[dict]:
    return [{"role": m.role, "content": m.content if isinstance(m.content, str) else
             "".join(p.text for p in m.content)} for m in messages]


class _Common(_Strict):
    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)   # None: the decoding protocol's
    top_p: float | None = Field(None, gt=0, le=1)          # nucleus sampling (mask rules)
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
    prompt: str | list[str] | list[int] | list[list[int]]  # text, texts, token ids, lists of token ids
    max_tokens: int | None = Field(None, ge=0)            # 0 only with echo: the prompt back
    echo: bool | None = None
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    best_of: int | None = None
    suffix: str | None = None

    def prompts(self) -> list[str | list[int]]:
        """The prompts of this request, each a text or a list of token ids ([] stays one, empty, prompt)."""
        p = self.prompt
        if isinstance(p, str) or all(isinstance(t, int) for t in p):
            return [p]
        return list(p)

    def prompt_params(self) -> list[str]:
        """The ``param`` naming each prompt in an error."""
        n = len(self.prompts())
        return ["prompt"] if n == 1 and not self._listed() else [f"prompt[{i}]" for i in range(n)]

    def _listed(self) -> bool:
        return isinstance(self.prompt, list) and bool(self.prompt) and not isinstance(self.prompt[0], int)

    def logprobs_k(self) -> int | None:
        return self.logprobs


class ChatRequest(_Common):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    response_format: ResponseFormat | None = None
    tools: list[dict] | None = None
    tool_choice: Literal["none"] | None = None
    parallel_tool_calls: bool | None = None

    def max_tokens_value(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def max_tokens_param(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"

    def prompts(self) -> list[list[dict]]:
        return [_messages(self.messages)]

    def prompt_params(self) -> list[str]:
        return ["messages"]

    def logprobs_k(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


class TokenizeRequest(_Strict):
    """vLLM's /tokenize: a ``prompt`` or chat ``messages`` (one of them)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = None
    add_special_tokens: bool | None = None     # None: False, what generation feeds the model
    add_generation_prompt: bool | None = None  # messages only; None: True
    return_token_strs: bool | None = None

    def prompt_value(self) -> str | list[dict]:
        return self.prompt if self.prompt is not None else _messages(self.messages)


class DetokenizeRequest(_Strict):
    """vLLM's /detokenize."""

    model: str | None = None
    tokens: list[int]


# Fields accepted with any valid value and ignored (top_p is honoured: `DecodeConfig.top_p`):
# parallel_tool_calls, user (only logged), name on messages.
IGNORED = ("parallel_tool_calls",)
# Fields accepted only at their no-op value; anything else is a 400 naming the field.
DEFAULT_ONLY = {"presence_penalty": (None, 0), "frequency_penalty": (None, 0), "logit_bias": (None, {}),
                "best_of": (None, 1), "suffix": (None, ""), "tools": (None, [])}
_FIELD_NAMES = {f for m in (CompletionRequest, ChatRequest, Message, TextPart, StreamOptions, ResponseFormat,
                            TokenizeRequest, DetokenizeRequest) for f in m.model_fields}


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


def unknown_fields(model: BaseModel, prefix: str = "") -> list[str]:
    """The fields of a validated request that no schema names ('frobnicate', 'messages[0].x'):
    ignored by the server, named back in the ``X-Ignored-Fields`` header (top-level ones first, in
    the body's order, then those inside the known fields)."""
    out = [f"{prefix}{k}" for k in (model.model_extra or {})]
    for name in type(model).model_fields:
        value = getattr(model, name)
        items = value if isinstance(value, list) else [value]
        for i, item in enumerate(items):
            if isinstance(item, BaseModel):
                where = f"{prefix}{name}[{i}]." if isinstance(value, list) else f"{prefix}{name}."
                out += unknown_fields(item, where)
    return out


def parse_body(body: bytes, content_type: str | None, schema: type[BaseModel]) -> BaseModel:
    """A JSON object body validated against ``schema``; raise RequestError naming the first offending field."""
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
        return schema.model_validate(data)
    except RecursionError:
        raise RequestError("malformed JSON: nested too deeply", code="invalid_json") from None
    except ValidationError as e:
        errs = e.errors(include_url=False, include_input=False)
        first = errs[0]
        param = _param(first["loc"])
        if first["type"] == "missing":
            raise RequestError(f"missing required field {param!r}", param=param, code="missing_field") from None
        msgs = list(dict.fromkeys(x["msg"] for x in errs if _param(x["loc"]) == param))[:3]
        raise RequestError(f"invalid value for {param!r}: {'; or '.join(msgs)}", param=param,
                           code="invalid_value") from None


def parse_request(body: bytes, content_type: str | None, schema: type[_Common]) -> _Common:
    """Validate one generation request body (`parse_body`) and the combinations this server serves."""
    req = parse_body(body, content_type, schema)
    for name, allowed in DEFAULT_ONLY.items():
        value = getattr(req, name, None)
        if value not in allowed:  # pydantic already checked the type (strict: no bool for int)
            raise RequestError(f"{name}={json.dumps(value)[:100]} is not supported by this server; omit it",
                               param=name, code="unsupported")
    n = req.n or 1
    if n > MAX_N:
        raise RequestError(f"n={req.n} is more than this server decodes at once ({MAX_N}); lower n", param="n",
                           code="unsupported")
    if n > 1 and req.stream:
        raise RequestError("n > 1 with stream=true is not supported; stream one sample per request, or set "
                           "stream=false", param="n", code="unsupported")
    prompts = req.prompts()
    if len(prompts) > MAX_PROMPTS:
        raise RequestError(f"prompt is a list of {len(prompts)} prompts; at most {MAX_PROMPTS} per request",
                           param="prompt", code="unsupported")
    if len(prompts) > 1 and req.stream:
        raise RequestError("stream=true takes one prompt; send one request per prompt, or set stream=false",
                           param="prompt", code="unsupported")
    k = req.logprobs_k()
    if isinstance(req, CompletionRequest):
        if req.echo and k is not None:
            raise RequestError(
                "echo with logprobs asks for the log-probabilities of the prompt's own tokens (a log-likelihood "
                "request, as lm-eval's loglikelihood and multiple-choice tasks send); a block-diffusion model "
                "has no causal likelihood of a given text, so this server does not compute one: drop echo or "
                "logprobs (generation requests work, e.g. lm-eval's generate_until tasks)",
                param="echo", code="unsupported")
        if req.max_tokens == 0 and not req.echo:
            raise RequestError("max_tokens must be >= 1 (0 only with echo=true: the prompt back, nothing "
                               "generated)", param="max_tokens", code="invalid_value")
    elif req.top_logprobs and not req.logprobs:
        raise RequestError("top_logprobs needs logprobs=true", param="top_logprobs", code="invalid_value")
    if k is not None and req.stream:
        raise RequestError("logprobs with stream=true is not supported; set stream=false to receive them",
                           param="logprobs", code="unsupported")
    stops = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
    if len(stops) > 16 or any(not s for s in stops):
        raise RequestError("stop must be a non-empty string or a list of at most 16 non-empty strings",
                           param="stop")
    return req


# --------------------------------------------------------------------------- response bodies
def _usage(gens: list, n: int) -> dict:
    """Usage of ``gens`` (n samples per prompt, prompt-major): each prompt counted once."""
    prompt = sum(g.prompt_tokens for g in gens[::n])
    done = sum(g.completion_tokens for g in gens)
    return {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done}


def _metrics(gen) -> dict:
    """orl extension: the decode's own numbers (clients ignore unknown top-level fields)."""
    return {k: getattr(gen, k) for k in ("tpf", "tpf_no_commit", "forwards", "latency_s", "request_tps")}


def _lp(x: float) -> float | None:
    """A log-probability for JSON: None where no step committed the token (NaN), finite otherwise."""
    return None if x != x else max(x, -9999.0)


class Shape:
    """The id, object names and choice layout of one request's responses.

    ``n`` samples per prompt (choice ``index`` = prompt * n + sample, as OpenAI numbers them);
    ``echo``: each prompt's text, put before its choices' text; ``strings``: the LLM's
    `token_strings` (ids -> each token's text), for log-probabilities."""

    def __init__(self, chat: bool, model: str, n: int = 1, echo: list[str] | None = None,
                 strings: Callable[[list[int]], list[str]] | None = None):
        self.chat, self.model, self.n, self.echo, self.strings = chat, model, n, echo, strings
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def full(self, gens: list) -> dict:
        """The response to the request's Generations (prompt-major, ``n`` per prompt): one choice
        each, usage summed over them (each prompt counted once), metrics of the first."""
        choices = []
        for i, g in enumerate(gens):
            choice = {"index": i, "logprobs": None, "finish_reason": g.finish_reason}
            if self.chat:
                choice["message"] = {"role": "assistant", "content": g.text}
            else:
                choice["text"] = (self.echo[i // self.n] if self.echo else "") + g.text
            if g.logprobs is not None:
                choice["logprobs"] = self._chat_logprobs(g) if self.chat else self._completion_logprobs(g)
            choices.append(choice)
        return {**self._head("chat.completion" if self.chat else "text_completion"), "choices": choices,
                "usage": _usage(gens, self.n), "metrics": _metrics(gens[0])}

    def _strings(self, g) -> tuple[list[str], dict[int, str]]:
        alt = sorted({i for top in g.top_logprobs for i, _ in top} - set(g.token_ids))
        s = self.strings(list(g.token_ids) + alt)
        return s[:len(g.token_ids)], dict(zip(list(g.token_ids) + alt, s))

    def _completion_logprobs(self, g) -> dict:
        """OpenAI's legacy shape: tokens, token_logprobs, top_logprobs (the k most probable and the
        chosen token, as OpenAI always includes it) and text_offset (offsets of the token strings)."""
        toks, name = self._strings(g)
        tops, offsets, at = [], [], 0
        for t, lp, top in zip(g.token_ids, g.logprobs, g.top_logprobs):
            d: dict[str, float] = {}
            for i, v in top:
                d.setdefault(name[i], _lp(v))
            if lp == lp:
                d.setdefault(name[t], _lp(lp))
            tops.append(d)
            offsets.append(at)
            at += len(name[t])
        return {"tokens": toks, "token_logprobs": [_lp(x) for x in g.logprobs], "top_logprobs": tops,
                "text_offset": offsets}

    def _chat_logprobs(self, g) -> dict:
        toks, name = self._strings(g)

        def entry(s: str, lp: float) -> dict:
            v = _lp(lp)
            return {"token": s, "logprob": -9999.0 if v is None else v, "bytes": list(s.encode("utf-8"))}

        content = [{**entry(s, lp), "top_logprobs": [entry(name[i], v) for i, v in top]}
                   for s, lp, top in zip(toks, g.logprobs, g.top_logprobs)]
        return {"content": content, "refusal": None}

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
                "usage": _usage([gen], 1), "metrics": _metrics(gen)}

