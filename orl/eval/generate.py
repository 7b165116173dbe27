"""Step 2 of evaluation: run a model over prepared prompts into a resumable JSONL.

``generate_jsonl(prepared_dir, out_path, generate_fn, protocol)`` calls ``generate_fn(prompt)``
once per problem not yet in ``out_path``. ``generate_fn`` returns a dict with at least
``completion`` (text), ``n_tokens`` (generated tokens, counted as `orl.decode.tpf.generated_tokens`:
the EOS that ended a completion included), ``forwards`` (all forward passes, including one
cache-commit forward per block: ORL's TPF convention), ``forwards_no_commit`` (denoising forwards
only: the Hugging Face convention) and ``latency_s``; other keys are kept.

The file's first line is ``{"type": "header", "protocol": ..., "manifest_sha256": ...}``:
``protocol`` is the caller's description of everything that decides the outputs (model,
checkpoint, decoder and its thresholds, block length, seed ...). A restart with a different
protocol or different prepared prompts is refused; a restart with the same ones skips finished
ids and repairs a line cut by a crash (see `orl.eval.jsonlog`).

Does not own: the model or decoder (``generate_fn`` is the caller's), scoring (`orl.eval.score`).
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable

from tqdm import tqdm

from orl.eval.jsonlog import append, open_log
from orl.eval.prepare import load_prepared

REQUIRED = ("completion", "n_tokens", "forwards", "forwards_no_commit", "latency_s")


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def make_record(problem_id: str, out: dict[str, Any], wall_s: float) -> dict[str, Any]:
    """One result line from ``generate_fn``'s output; TPF = generated tokens / forwards."""
    if not isinstance(out, dict):
        raise TypeError(f"generate_fn must return a dict, got {type(out).__name__} for {problem_id}")
    missing = [k for k in REQUIRED if k not in out]
    if missing:
        raise KeyError(f"generate_fn's result for {problem_id} lacks {', '.join(missing)}; "
                       f"it must return at least {', '.join(REQUIRED)}")
    if not isinstance(out["completion"], str):
        raise TypeError(f"generate_fn's completion for {problem_id} is {type(out['completion']).__name__}")
    record = {k: v for k, v in out.items() if k not in ("type", "id")}
    record.update({
        "type": "result", "id": problem_id, "wall_s": wall_s,
        "tpf": _ratio(out["n_tokens"], out["forwards"]),
        "tpf_no_commit": _ratio(out["n_tokens"], out["forwards_no_commit"]),
    })
    return record


def generate_jsonl(prepared_dir: str | os.PathLike, out_path: str | os.PathLike,
                   generate_fn: Callable[[str], dict[str, Any]], protocol: dict[str, Any],
                   limit: int | None = None, progress: bool = True) -> dict[str, Any]:
    """Generate for every prepared problem (the first ``limit``) not already in ``out_path``.

    Returns ``{"path", "n", "n_done_before", "n_new"}``.
    """
    prepared = load_prepared(prepared_dir)
    header = {"type": "header", "protocol": protocol, "manifest_sha256": prepared.manifest_sha256,
              "task": prepared.manifest["task"]}
    records, f = open_log(out_path, header)
    known = {r["id"] for r in prepared.rows}
    stray = [r["id"] for r in records if r["id"] not in known]
    if stray:
        f.close()
        raise ValueError(f"{out_path} holds ids that are not in {prepared_dir}: {stray[:5]}")
    rows = prepared.rows if limit is None else prepared.rows[:limit]
    done = {r["id"] for r in records}
    todo = [r for r in rows if r["id"] not in done]
    with f, tqdm(total=len(rows), initial=len(rows) - len(todo), disable=not progress,
                 desc=f"generate {prepared.manifest['task']}", unit="problem") as bar:
        for row in todo:
            start = time.monotonic()
            out = generate_fn(row["prompt"])
            append(f, make_record(row["id"], out, time.monotonic() - start))
            bar.update(1)
    return {"path": str(Path(out_path)), "n": len(rows), "n_done_before": len(rows) - len(todo),
            "n_new": len(todo)}
