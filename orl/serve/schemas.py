"""The OpenAI-compatible request schemas of `orl.serve.server` and their validation.

Owns the request bodies of /v1/completions and /v1/chat/completions (strict pydantic models: an
unknown field is an error that names it), the fields accepted only where they are no-ops
(``IGNORED``, ``DEFAULT_ONLY``), the checks pydantic cannot express (text must be valid Unicode,
bodies must be JSON objects) and the OpenAI-style error body every 4xx carries.
Does not own: HTTP routing or streaming (`orl.serve.server`), the queue (`orl.serve.scheduler`).
"""
from __future__ import annotations

import json
import logging
from typing import Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

log = logging.getLogger("orl.serve.server")


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


# Fields accepted with any valid value and ignored (top_p is honoured: `DecodeConfig.top_p`):
# which tokens commit, there is no nucleus), parallel_tool_calls, user (only logged), name.
IGNORED = ("parallel_tool_calls",)
# Fields accepted only at their no-op value; anything else is a 400 naming the field.
MAX_N = 16  # samples per request (OpenAI's n), decoded as one batch
DEFAULT_ONLY = {"presence_penalty": (None, 0), "frequency_penalty": (None, 0),
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
    if (req.n or 1) > MAX_N:
        raise RequestError(f"n={req.n} is more than this server decodes at once ({MAX_N}); lower n", param="n",
                           code="unsupported")
    if (req.n or 1) > 1 and req.stream:
        raise RequestError("n > 1 with stream=true is not supported; stream one sample per request, or set "
                           "stream=false", param="n", code="unsupported")
    if isinstance(req, CompletionRequest) and isinstance(req.prompt, list) and len(req.prompt) != 1:
        raise RequestError(f"prompt must be one string (got a list of {len(req.prompt)}); batched prompts are "
                           "not supported, send one request per prompt", param="prompt")
    stops = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
    if len(stops) > 16 or any(not s for s in stops):
        raise RequestError("stop must be a non-empty string or a list of at most 16 non-empty strings",
                           param="stop")
    return req
