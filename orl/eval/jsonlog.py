"""Append-only JSONL logs with a header line: the file format of generations and scores.

A log's first line is ``{"type": "header", ...}``; every later line is one record. Writers
append one line per finished item and flush it, so a crash loses at most the line being
written. `open_log` resumes: it checks the existing header against the new one (refusing to mix
runs), drops a truncated last line (no final newline: the write a crash interrupted) by
truncating the file, and returns the records already there. A malformed line anywhere else is
an error naming its line number: that is corruption, not a crash, and is not repaired silently.

Does not own: what the records contain (`orl.eval.generate`, `orl.eval.score`).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, TextIO


def read_log(path: str | os.PathLike) -> tuple[dict | None, list[dict], int, bool]:
    """Return (header, records, bytes of complete lines, whether a truncated last line was seen)."""
    data = Path(path).read_bytes()
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" if the file ends with a newline, else an unterminated last line
    truncated = tail != b""
    header, records, seen = None, [], {}
    for lineno, raw in enumerate(lines, start=1):
        try:
            obj = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{path}:{lineno}: malformed JSON line ({e}); the file is corrupted "
                             "(only a truncated last line is repaired automatically)") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
        if lineno == 1:
            if obj.get("type") != "header":
                raise ValueError(f"{path}:1: the first line must be a header record "
                                 f"({{\"type\": \"header\", ...}}), got {raw[:80]!r}")
            header = obj
            continue
        if "id" not in obj:
            raise ValueError(f"{path}:{lineno}: record has no 'id'")
        if obj["id"] in seen:
            raise ValueError(f"{path}:{lineno}: id {obj['id']!r} repeats line {seen[obj['id']]}")
        seen[obj["id"]] = lineno
        records.append(obj)
    return header, records, len(data) - len(tail), truncated


def open_log(path: str | os.PathLike, header: dict[str, Any]) -> tuple[list[dict], TextIO]:
    """Open a log for appending: create it with ``header``, or validate and repair an existing one.

    Returns the records already present and a text file positioned at the end.
    """
    path = Path(path)
    header = json.loads(json.dumps(header))  # compare as stored (tuples become lists, ...)
    records: list[dict] = []
    if path.exists() and path.stat().st_size > 0:
        old, records, good_bytes, truncated = read_log(path)
        if old is not None:
            for key, value in header.items():
                if old.get(key) != value:
                    raise ValueError(
                        f"{path} was written with a different {key!r}:\n  in file: "
                        f"{json.dumps(old.get(key), sort_keys=True)}\n  now:     "
                        f"{json.dumps(value, sort_keys=True)}\nRefusing to mix two runs in one file; "
                        "use a new output path, or delete the file to start over."
                    )
        if truncated:
            with open(path, "r+b") as f:
                f.truncate(good_bytes)
        if old is None:  # the crash cut the header itself
            path.write_text(json.dumps(header, sort_keys=True) + "\n", encoding="utf-8")
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(header, sort_keys=True) + "\n", encoding="utf-8")
    return records, open(path, "a", encoding="utf-8")


def append(f: TextIO, record: dict[str, Any]) -> None:
    """Write one record as one line and push it to disk (a crash loses at most this line)."""
    f.write(json.dumps(record, ensure_ascii=False, sort_keys=True) + "\n")
    f.flush()
    os.fsync(f.fileno())
