"""Step 1 of evaluation: render a task's prompts to a folder that later steps trust.

``prepare(task_name, out_dir)`` writes

* ``prompts.jsonl``: one line per problem: ``id``, ``prompt`` (what the model sees, after the
  chat template if one was given), ``problem_prompt`` (the task's own text), ``answer`` and
  ``meta`` (what scoring needs: the gold answer, or a code task's tests);
* ``manifest.json``: task name and options, split, limit, count, the SHA256 of
  ``prompts.jsonl`` and of the source data file, and the chat template's hash.

``load_prepared(dir)`` re-hashes both files and refuses a mismatch, so generations and scores
always refer to exactly the prompts that were prepared. The folder is self-contained: scoring
needs the task's verifier but not its data file. ``prepare_if_needed`` reuses a folder only when
its manifest records the options asked for now (task, options, split, limit, chat template) and
prepares it again otherwise, so ``--limit 50`` never reports an earlier ``--limit 30``'s set.
``subset`` writes a prepared folder of some of another's rows (the prompts that fit a model's
context), its manifest naming the parent and every row it left out and why.

Does not own: data loading or prompt wording (the tasks), generation (`orl.eval.generate`).
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orl.tasks.base import Problem, Task, check_problems
from orl.tasks.datafile import sha256_file
from orl.tasks.registry import get_task

PROMPTS, MANIFEST, FORMAT = "prompts.jsonl", "manifest.json", 1


def render(prompt: str, tokenizer: Any = None) -> str:
    """The text the model sees: the prompt as one user turn of ``tokenizer``'s chat template."""
    if tokenizer is None:
        return prompt
    return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True)


def _template_info(tokenizer: Any) -> dict | None:
    if tokenizer is None:
        return None
    template = getattr(tokenizer, "chat_template", None)
    return {
        "tokenizer": getattr(tokenizer, "name_or_path", type(tokenizer).__name__),
        "template_sha256": hashlib.sha256(str(template).encode()).hexdigest() if template else None,
    }


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def prepare(task_name: str, out_dir: str | os.PathLike, limit: int | None = None,
            chat_template_tokenizer: Any = None, *, split: str = "test",
            task_kwargs: dict[str, Any] | None = None) -> Path:
    """Write prompts and manifest for ``task_name`` (a built-in name or ``module:function``)."""
    task_kwargs = dict(task_kwargs or {})
    try:
        json.dumps(task_kwargs)
    except TypeError:
        raise TypeError(f"task_kwargs must be JSON values (they are recorded in the manifest "
                        f"and used again when scoring), got {task_kwargs!r}") from None
    task = get_task(task_name, **task_kwargs)
    problems = check_problems(task.problems(split), f"{task_name}.problems({split!r})")
    if limit is not None:
        problems = problems[:limit]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lines = []
    for p in problems:
        row = {"id": p.id, "prompt": render(p.prompt, chat_template_tokenizer),
               "problem_prompt": p.prompt, "answer": p.answer, "meta": p.meta}
        lines.append(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")
    text = "".join(lines)
    _write_atomic(out / PROMPTS, text)
    source = None
    if callable(getattr(task, "data_file", None)):
        path = Path(task.data_file(split).path)
        source = {"path": str(path), "sha256": sha256_file(path)}
    manifest = {
        "format": FORMAT, "task": task_name, "task_name": task.name, "task_kwargs": task_kwargs,
        "split": split, "limit": limit, "n": len(problems), "prompts_file": PROMPTS,
        "prompts_sha256": sha256_file(out / PROMPTS),
        "source": source, "chat_template": _template_info(chat_template_tokenizer),
    }
    _write_atomic(out / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return out


@dataclass(frozen=True)
class Prepared:
    """A verified prepared folder: its manifest, the manifest's hash and the prompt rows."""

    dir: Path
    manifest: dict
    manifest_sha256: str
    rows: list[dict]

    def problems(self) -> list[Problem]:
        return [Problem(r["id"], r["problem_prompt"], r["answer"], r.get("meta") or {})
                for r in self.rows]

    def task(self) -> Task:
        return get_task(self.manifest["task"], **self.manifest.get("task_kwargs", {}))


def load_prepared(prepared_dir: str | os.PathLike) -> Prepared:
    """Load a prepared folder after checking every hash its manifest records."""
    d = Path(prepared_dir)
    mpath = d / MANIFEST
    if not mpath.is_file():
        raise FileNotFoundError(f"{mpath} not found; run orl.eval.prepare.prepare(task, {str(d)!r}) first")
    manifest = json.loads(mpath.read_text(encoding="utf-8"))
    ppath = d / manifest.get("prompts_file", PROMPTS)
    if not ppath.is_file():
        raise FileNotFoundError(f"{ppath} (listed in {mpath}) not found; re-run prepare")
    actual = sha256_file(ppath)
    if actual != manifest["prompts_sha256"]:
        raise ValueError(
            f"{ppath} does not match its manifest: expected sha256 {manifest['prompts_sha256']}, "
            f"actual {actual}. It was changed after prepare; re-run prepare into this folder "
            "(and regenerate), rather than editing prompts by hand."
        )
    source = manifest.get("source")
    if source and Path(source["path"]).is_file():
        now = sha256_file(source["path"])
        if now != source["sha256"]:
            raise ValueError(
                f"source data {source['path']} changed since prepare: manifest {source['sha256']}, "
                f"now {now}. Re-run prepare so prompts and answers match the data."
            )
    rows = []
    with open(ppath, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{ppath}:{lineno}: malformed JSON line ({e.msg})") from None
    if len(rows) != manifest["n"]:
        raise ValueError(f"{ppath} has {len(rows)} rows, its manifest says {manifest['n']}")
    return Prepared(d, manifest, sha256_file(mpath), rows)


def _wanted(task_name: str, limit: int | None, chat_template_tokenizer: Any, split: str,
            task_kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """The manifest entries that decide which prompts a folder holds, as the manifest stores them."""
    return json.loads(json.dumps({"task": task_name, "task_kwargs": dict(task_kwargs or {}), "split": split,
                                  "limit": limit, "chat_template": _template_info(chat_template_tokenizer)}))


def prepare_if_needed(task_name: str, out_dir: str | os.PathLike, limit: int | None = None,
                      chat_template_tokenizer: Any = None, *, split: str = "test",
                      task_kwargs: dict[str, Any] | None = None) -> tuple[Prepared, str | None]:
    """The prepared folder ``out_dir`` for exactly these options, and why it was (re)built: None when
    the folder already held them (reused as is), else a reason such as ``"limit 30 -> 50"``,
    ``"not prepared yet"`` or the hash mismatch that made its files untrustworthy."""
    wanted = _wanted(task_name, limit, chat_template_tokenizer, split, task_kwargs)
    try:
        old = load_prepared(out_dir)
    except FileNotFoundError:
        reason = "not prepared yet"
    except (ValueError, KeyError) as e:
        reason = f"its files do not match its manifest: {str(e).splitlines()[0]}"
    else:
        changed = [f"{k} {json.dumps(old.manifest.get(k))} -> {json.dumps(v)}" for k, v in wanted.items()
                   if old.manifest.get(k) != v]
        if not changed:
            return old, None
        reason = "; ".join(changed)
    prepare(task_name, out_dir, limit, chat_template_tokenizer, split=split, task_kwargs=task_kwargs)
    return load_prepared(out_dir), reason


def subset(prepared: Prepared, out_dir: str | os.PathLike, keep: Iterable[str], excluded: dict[str, str],
           note: dict[str, Any] | None = None) -> Prepared:
    """A prepared folder holding ``prepared``'s rows whose ids are in ``keep`` (in their order), its
    manifest the parent's plus ``subset_of`` (the parent manifest's hash), ``excluded`` (id -> why
    it was left out) and ``note``. Written only when its content changes, so the same subset keeps
    its manifest hash and generations over it resume."""
    keep = set(keep)
    rows = [r for r in prepared.rows if r["id"] in keep]
    text = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    manifest = {**prepared.manifest, "n": len(rows), "prompts_file": PROMPTS,
                "prompts_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
                "subset_of": prepared.manifest_sha256, "excluded": dict(excluded), "subset_note": note or {}}
    mtext = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    if not ((out / PROMPTS).is_file() and (out / MANIFEST).is_file()
            and (out / MANIFEST).read_text(encoding="utf-8") == mtext
            and sha256_file(out / PROMPTS) == manifest["prompts_sha256"]):
        _write_atomic(out / PROMPTS, text)
        _write_atomic(out / MANIFEST, mtext)
    return load_prepared(out)
