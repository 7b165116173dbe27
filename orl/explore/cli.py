"""`orl explore`: decode one prompt with several models (or settings) and write the explorer page.

    orl explore --model A [--model B ...] (--prompt TEXT | --task NAME --index I) [--out page.html]
                [--role R ...] [--label L ...] [--threshold V1,V2 | --knob V1,V2] [--recipe R] [--serve]
    orl explore plot PATH [PATH ...]      PNGs beside frontier / summary JSON, metrics.jsonl, engine profiles

Each ``--model`` (a checkpoint directory or a named size such as ``sdar/tiny``) decodes with its
family's protocol for its ``--role`` (one ``--role`` for all models, or one per model), changed by
``--recipe`` (the named recipe's task, task options and evaluation decoder: ``orl_suite_arith`` is
the demo's), ``--set FIELD=VALUE`` and ``--threshold``/``--knob`` (one run per value: the rule's
knob, `orl.eval.frontier.KNOBS`). With ``--task`` the prompt is the task's problem ``--index`` of
``--split`` and every run gets the task's verdict (`orl.eval.pool.rewards`). The page is written to
``--out``; ``--serve`` also serves it on loopback until interrupted; ``--screenshot PNG`` renders it
in headless Chromium (`orl.explore.browser`).
Owns argument parsing and the order of the work. Does not own: traces (`orl.explore.trace`), the
page (`orl.explore.page`), plots (`orl.explore.plots`).
"""
from __future__ import annotations

import argparse
import dataclasses
import http.server
import os
import shlex
import sys

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _per_model(values: list[str], n: int, what: str, default):
    """One value per model: none given -> ``default`` for all, one -> it for all, n -> each its own."""
    if not values:
        return [default] * n
    if len(values) == 1:
        return values * n
    if len(values) != n:
        raise ValueError(f"give one {what} for all models or one per --model ({n}); got {len(values)}")
    return values


def _recipe(name: str | None):
    """(task name, task kwargs, chat, DecodeConfig or None) of a named recipe; Nones without one."""
    if name is None:
        return None, {}, False, None
    from ..recipes import get_recipe  # noqa: PLC0415
    cfg = get_recipe(name)
    dcfg = getattr(cfg, "eval_decode", None) or getattr(cfg, "decode", None)
    return cfg.task, dict(cfg.task_kwargs), bool(getattr(cfg, "chat", False)), dcfg


def build(a) -> dict:
    """The page data (`orl.explore.page.page_data`) of the parsed arguments ``a``."""
    from ..decode import DecodeConfig  # noqa: PLC0415
    from ..eval.frontier import KNOBS, with_knob  # noqa: PLC0415
    from ..recipes.overrides import parse_sets  # noqa: PLC0415
    from ..recipes.validate import validate  # noqa: PLC0415
    from ..serve.llm import LLM  # noqa: PLC0415
    from .page import page_data  # noqa: PLC0415
    from .trace import budget, default_label, knob_values, trace_run  # noqa: PLC0415

    if (a.prompt is None) == (a.task is None and a.recipe is None):
        raise ValueError("give either --prompt TEXT or --task NAME --index I (or --recipe R --index I)")
    if a.threshold and a.knob:
        raise ValueError("give --threshold or --knob, not both")
    roles = _per_model(a.role, len(a.model), "--role", "base")
    if a.label and len(a.label) != len(a.model):
        raise ValueError(f"give one --label per --model ({len(a.model)}); got {len(a.label)}")
    labels = a.label or [None] * len(a.model)
    task_name, task_kwargs, chat, rdcfg = _recipe(a.recipe)
    problem = task = None
    if a.prompt is None:
        from ..tasks.registry import get_task  # noqa: PLC0415
        task = get_task(a.task or task_name, **(task_kwargs if (a.task in (None, task_name)) else {}))
        problems = task.problems(a.split)
        if a.index is None or not 0 <= a.index < len(problems):
            raise ValueError(f"--index must be in [0, {len(problems) - 1}] for task {task.name!r} split "
                             f"{a.split!r} (got {a.index})")
        problem = problems[a.index]
    text = a.prompt if problem is None else problem.prompt
    prompt = [{"role": "user", "content": text}] if (a.chat or chat) else text
    overrides = {}
    if rdcfg is not None:  # the recipe's evaluation decoder, as the demo evaluates
        overrides = {k: v for k, v in dataclasses.asdict(rdcfg).items() if k != "max_new_tokens"}
    overrides.update(parse_sets(a.set, DecodeConfig))
    knobs = knob_values(a.threshold or a.knob)
    max_new = a.max_new_tokens if a.max_new_tokens is not None else (rdcfg.max_new_tokens if rdcfg else None)

    runs, pairs = [], []
    for model, role, label in zip(a.model, roles, labels):
        llm = LLM(model, role=role, device=a.device, dtype=a.dtype, tokenizer=a.tokenizer, engine="reference",
                  **overrides)
        ids = llm.encode(prompt)
        cfg = dataclasses.replace(llm.decode_config, max_new_tokens=budget(llm, len(ids), max_new))
        label = label or default_label(model)
        settings = [(cfg, label)]
        if knobs:
            field = KNOBS.get(cfg.rule)
            if field is None:
                raise ValueError(f"{model}: decode rule {cfg.rule!r} has no knob to sweep")
            if a.threshold and field != "threshold":
                raise ValueError(f"{model}: rule {cfg.rule!r} has no threshold; its knob is {field} (use --knob)")
            settings = [(with_knob(cfg, v), f"{label} @ {field} {v:g}") for v in knobs]
        for c, lab in settings:
            validate(c)
            run = trace_run(llm, ids, c, eos_ids=[] if a.ignore_eos else None, seed=a.seed, label=lab)
            run["role"] = role
            runs.append(run)
            pairs.append(run["completion"])
        print(f"orl explore: {label}: decoded {len(settings)} setting(s)", file=sys.stderr)
    if task is not None:
        from ..eval.pool import rewards  # noqa: PLC0415
        got = rewards(task, [(problem, c) for c in pairs], reward_errors="zero")
        for run, score in zip(runs, got.scores):
            run["verdict"] = float(score)
    title = "orl explore" + (f" · {task.name} #{a.index}" if task is not None else "")
    command = "orl explore " + shlex.join(a.argv)
    return page_data(runs, text, title=title, answer=None if problem is None else problem.answer, command=command)


def serve_page(page: str, port: int = 8001, host: str = "127.0.0.1") -> http.server.ThreadingHTTPServer:
    """An HTTP server on loopback answering the page at ``/`` (and any path); the caller runs
    ``serve_forever``. Refuses a non-loopback host: the page may hold anything a prompt held."""
    if host not in LOOPBACK:
        raise ValueError(f"orl explore serves on loopback only (127.0.0.1, localhost, ::1), not {host!r}")
    body = page.encode("utf-8")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):  # quiet
            pass

    srv = http.server.ThreadingHTTPServer((host, port), Handler)
    srv.daemon_threads = True
    return srv


def _parser() -> argparse.ArgumentParser:
    from ..cli import HelpFormatter  # noqa: PLC0415
    ap = argparse.ArgumentParser(prog="orl explore", description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("--model", action="append", required=True,
                    help="checkpoint directory or named size (repeat for side-by-side runs)")
    ap.add_argument("--role", action="append", default=[], choices=("base", "orl"),
                    help="decoding protocol role: once for all models or once per --model (default base)")
    ap.add_argument("--label", action="append", default=[], help="a name per --model (default: from its path)")
    src = ap.add_argument_group("the prompt")
    src.add_argument("--prompt", default=None, help="the prompt text")
    src.add_argument("--task", default=None,
                     help="a task name (orl.tasks.registry) whose problem --index is the prompt")
    src.add_argument("--index", type=int, default=None, help="the problem's index in --split")
    src.add_argument("--split", default="test", help="the task's split the problem comes from")
    src.add_argument("--recipe", default=None,
                     help="take the task, its options and the evaluation decoder from this recipe "
                          "(orl_suite_arith: the demo's)")
    src.add_argument("--chat", action="store_true", help="send the prompt as one user message (chat template)")
    dec = ap.add_argument_group("decoding")
    dec.add_argument("--threshold", default=None, metavar="V1,V2", help="one run per threshold value, per model")
    dec.add_argument("--knob", default=None, metavar="V1,V2",
                     help="one run per value of the rule's knob (orl.eval.frontier.KNOBS), per model")
    dec.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                     help="override a decoding protocol field for every model, e.g. --set steps=4")
    dec.add_argument("--max-new-tokens", type=int, default=None,
                     help="token budget (default: the recipe's, else up to 256)")
    dec.add_argument("--ignore-eos", action="store_true", help="decode the whole budget")
    dec.add_argument("--seed", type=int, default=0, help="random stream of sampled decoding")
    dec.add_argument("--device", default="cpu", help="torch device of the models")
    dec.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: per device)")
    dec.add_argument("--tokenizer", default=None, help="qwen3 | char | directory (default: from the model)")
    out = ap.add_argument_group("output")
    out.add_argument("--out", default="explore.html", help="the page")
    out.add_argument("--serve", action="store_true", help="also serve the page on loopback until interrupted")
    out.add_argument("--port", type=int, default=8001, help="--serve's port (0: any free one)")
    out.add_argument("--screenshot", default=None, metavar="PNG",
                     help="render the page in headless Chromium and save a PNG (needs chromium)")
    out.add_argument("--screenshot-forward", type=int, default=None, metavar="F",
                     help="the forward the screenshot shows (default: a third of the way)")
    return ap


def cli(argv: list[str]) -> int:
    if argv and argv[0] == "plot":
        from .plots import cli as plot_cli  # noqa: PLC0415
        return plot_cli(argv[1:])
    from ..cli import check_device  # noqa: PLC0415
    a = _parser().parse_args(argv)
    a.argv = list(argv)
    check_device(a.device)
    from .page import render  # noqa: PLC0415
    data = build(a)
    page = render(data)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w", encoding="utf-8") as f:
        f.write(page)
    for r in data["runs"]:
        verdict = "" if r["verdict"] is None else ("  correct" if r["verdict"] >= 1 else "  wrong")
        print(f"{r['label']}: {r['forwards']} forwards, {r['n_tokens']} tokens, TPF {r['tpf']:.2f}{verdict}")
    print(f"wrote {a.out} ({len(page) // 1024} KiB, self-contained: open it in a browser, offline)")
    if a.screenshot:
        from .browser import screenshot  # noqa: PLC0415
        f = a.screenshot_forward if a.screenshot_forward is not None else data["fmax"] // 3
        screenshot(os.path.abspath(a.out), a.screenshot, forward=f)
        print(f"wrote {a.screenshot} (forward {f})")
    if a.serve:
        srv = serve_page(page, a.port)
        print(f"serving on http://127.0.0.1:{srv.server_address[1]}/ (Ctrl-C stops)", flush=True)
        try:
            srv.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            srv.server_close()
    return 0

