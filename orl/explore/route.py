"""``GET /explore`` on `orl serve --explore`: the explorer page for the served model.

Owns the route (registered on the server's FastAPI app by `add_explore_route`, which
`orl.serve.server`'s command calls when ``--explore`` is given; off by default) and its form
page. ``GET /explore`` answers a form; ``GET /explore?prompt=TEXT[&max_tokens=N][&threshold=V1,V2]
[&seed=S]`` decodes the prompt with the served `LLM`'s model and protocol on the reference decoder
(traced, `orl.explore.trace`; the decoder the server itself uses on the CPU, and the same tokens
as the runtime's under greedy decoding) and answers the self-contained page (`orl.explore.page`).

These decodes run in the request's worker thread, beside the server's queue rather than in it
(the scheduler runs ``LLM.generate`` only); one explore decode runs at a time (a lock), each is
bounded by the context and at most `MAX_SETTINGS` knob values, and the tokenizer is shared under
`LLM`'s own lock. That is why the route is off by default: on a busy server it costs the queue
a decoder's share of the machine.
Does not own: the app, its errors and its guards (`orl.serve.server`), decoding (`orl.decode`).
"""
from __future__ import annotations

import dataclasses
import html
import threading
from urllib.parse import urlencode

from fastapi import Request
from fastapi.responses import HTMLResponse
from starlette.concurrency import run_in_threadpool

MAX_SETTINGS = 4  # knob values one request may ask for


def build_page(llm, model_name: str, prompt: str, max_tokens: int | None = None, knobs: list[float] | None = None,
               seed: int = 0, command: str = "") -> str:
    """The explorer page of ``llm`` decoding ``prompt`` at its protocol, or at each knob value."""
    from ..eval.frontier import KNOBS, with_knob  # noqa: PLC0415
    from ..recipes.validate import validate  # noqa: PLC0415
    from .page import page_data, render  # noqa: PLC0415
    from .trace import budget, default_label, trace_run  # noqa: PLC0415
    ids = llm.encode(prompt)
    cfg = dataclasses.replace(llm.decode_config, max_new_tokens=budget(llm, len(ids), max_tokens))
    label = default_label(model_name)
    if knobs:
        name = KNOBS.get(cfg.rule)
        if name is None:
            raise ValueError(f"decode rule {cfg.rule!r} has no knob to sweep")
        settings = [(with_knob(cfg, v), f"{label} @ {name} {v:g}") for v in knobs]
    else:
        settings = [(cfg, label)]
    for c, _ in settings:
        validate(c)  # a knob value out of its range is the user's error, named
    runs = [trace_run(llm, ids, c, seed=seed, label=lab) for c, lab in settings]
    return render(page_data(runs, prompt, title=f"orl explore · {model_name}", command=command))


def form_page(model_name: str) -> str:
    """The page ``GET /explore`` answers without a prompt: a form that asks for one."""
    name = html.escape(model_name)
    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8"><title>orl explore · {name}</title>
<style>body{{font:14px/1.5 system-ui,sans-serif;margin:32px;max-width:720px;color:#1d1d1f}}
textarea,input{{font:13px ui-monospace,Menlo,Consolas,monospace;width:100%;box-sizing:border-box;margin:2px 0 10px}}
label{{color:#6e6e73;font-size:12px}} button{{font-size:14px;padding:4px 14px}}</style></head><body>
<h1>orl explore · {name}</h1>
<p>Decode one prompt with the served model and step through it forward by forward.</p>
<form method="get" action="/explore">
<label for="prompt">prompt</label><textarea id="prompt" name="prompt" rows="4" required></textarea>
<label for="max_tokens">max tokens (empty: up to 256)</label>
<input id="max_tokens" name="max_tokens" inputmode="numeric">
<label for="threshold">knob values, comma-separated (empty: the protocol's)</label>
<input id="threshold" name="threshold">
<button type="submit">explore</button></form></body></html>"""


def _error_page(status: int, message: str) -> HTMLResponse:
    return HTMLResponse(f"<!doctype html><meta charset='utf-8'><title>orl explore: error</title>"
                        f"<p>orl explore: {html.escape(message)}</p>", status_code=status)


def _int(params, key: str, default: int | None) -> int | None:
    raw = params.get(key)
    if raw in (None, ""):
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{key} must be an integer, got {raw!r}") from None


def add_explore_route(app, llm, model_name: str) -> None:
    """Register ``GET /explore`` on ``app`` (a FastAPI app serving ``llm`` as ``model_name``)."""
    from .trace import knob_values  # noqa: PLC0415
    lock = threading.Lock()

    def work(prompt, max_tokens, knobs, seed, command):
        with lock:
            return build_page(llm, model_name, prompt, max_tokens, knobs, seed, command)

    @app.get("/explore", include_in_schema=False)
    async def explore(request: Request):
        q = request.query_params
        prompt = q.get("prompt")
        if not prompt:
            return HTMLResponse(form_page(model_name))
        try:
            max_tokens = _int(q, "max_tokens", None)
            seed = _int(q, "seed", 0)
            knobs = knob_values(q.get("threshold"))
            if knobs and len(knobs) > MAX_SETTINGS:
                raise ValueError(f"at most {MAX_SETTINGS} knob values per request, got {len(knobs)}")
            command = "GET /explore?" + urlencode({k: v for k, v in q.items()})
            page = await run_in_threadpool(work, prompt, max_tokens, knobs, seed, command)
        except ValueError as e:  # lengths, knob values, an unencodable prompt: the user's to fix
            return _error_page(400, str(e))
        return HTMLResponse(page)
