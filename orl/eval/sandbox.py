"""Run untrusted Python (model-written code) against trusted tests and say whether it passed.

Two entry points:

* `run_tests` (what the code tasks use): the candidate's code runs in a sandboxed child
  (`orl.eval.sandbox_child`); the task's tests run in a separate harness process
  (`orl.eval.sandbox_harness`) that never executes candidate code. The tests call the candidate
  through proxies: arguments and return values cross a pipe as plain data
  (`orl.eval.sandbox_wire`: JSON with tags, no pickle, only builtin values come out), and every
  comparison runs in the harness. The verdict is the harness's, on a pipe only this process
  holds, so nothing the candidate does in its own process (reading its memory, exiting with 0,
  printing result lines, overriding ``__eq__`` or ``__repr__``, patching builtins, writing to the
  pipes it holds) turns a failure into a pass. The price: tests give and receive only plain data
  (None, bool, int, float, str, bytes, complex, and lists, tuples, dicts, sets of them); a
  candidate returning anything else fails with that reason. All 164 HumanEval tests work this
  way (tests/test_tasks_code.py).
* `run_program`: one whole program (code and tests together) as ``__main__``; it passes if it
  runs to its end (a one-time nonce printed after it). The program can read that nonce from its
  own memory, so this verdict is the program's claim: fine for trusted or accidental code, never
  for grading adversarial code (tests/test_sandbox_redteam.py forges it on purpose).

Both run the child as ``python -I orl/eval/sandbox_child.py`` with:

* a fresh temporary working directory (also ``$HOME`` and ``$TMPDIR``), removed afterwards;
* a scrubbed environment (none of the parent's variables) and proxies pointing at a closed port;
* rlimits: CPU seconds, address space, file size, open files, no core dumps, and RLIMIT_NPROC when
  not root; open descriptors: its stdout/stderr (a file) and, in `run_tests`, its two pipe ends;
* a new session, so a wall-clock timeout kills the whole process group;
* where this machine allows it (root, or unprivileged user namespaces), util-linux ``unshare
  --net --pid --fork --mount-proc``: no network, its own PID space (this process and the harness
  are invisible to it), every process it started dies with it; inside, every mount read-only but
  the working directory (`SandboxConfig.read_only_mounts`), which also stops chmod, chown, utime
  and xattr changes outside;
* Landlock where the kernel has it (Linux 5.13+): no write, create, remove, rename, link,
  truncate or exec outside the working directory by any syscall path (directory descriptors, symlinks, /proc links), no ptrace-like access to outside
  processes, no signals to them (ABI 6+), no TCP without a network namespace (ABI 4+);
* no capabilities and ``no_new_privs``, also when the parent is root;
* an in-process prelude that stubs fork/exec/kill/sockets/ctypes and path-checks writes: a speed
  bump against accidents, not a boundary.

`SandboxResult.isolation` says which kernel mechanisms were in force: "namespaces",
"read-only-mounts", "landlock" joined by "+", or "none". A child asked for one that it cannot
apply refuses to run the code ("sandbox failure"), so the field never overstates. What is lost
without each (tests skip with these reasons where a machine lacks one):

* no "landlock" and no "read-only-mounts": file-system confinement is the prelude's only;
* no "read-only-mounts": chmod, chown, utime and xattrs outside are not stopped (Landlock does
  not cover metadata);
* no "namespaces": a candidate past the prelude can leave a process running (its own session);
* no "landlock" and no "namespaces": a candidate past the prelude can signal or read the memory
  of the harness (same user, visible PIDs) and so forge its verdict.

Not guaranteed: reads are not confined (the candidate can read any file its user can, including
the installed benchmark data, so it could look up an answer key); pathname UNIX sockets stay
reachable past the prelude; there is no seccomp filter and no cgroup (memory is per-process
RLIMIT_AS; a fork bomb is bounded by the wall-clock kill and, outside root, RLIMIT_NPROC). On
shared machines run the whole job in a container as well (nsjail, gVisor).

Does not own: what code and tests to build from a completion (the code tasks), process pools for
scoring many problems (`orl.eval.pool`; `run_many` here is a small thread pool for programs).
"""
from __future__ import annotations

import json
import math
import os
import platform
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
from typing import Sequence

CHILD = Path(__file__).with_name("sandbox_child.py")
HARNESS = Path(__file__).with_name("sandbox_harness.py")
RESULT = "ORL-SANDBOX-RESULT"
_DEAD_PROXY = "http://127.0.0.1:9"
_UNSHARE = ["unshare", "--net", "--pid", "--fork", "--mount-proc", "--kill-child"]


@dataclass(frozen=True)
class SandboxConfig:
    """Limits for one run. Sizes in MiB; a kernel feature set to ``None`` is used if available
    (``True`` demands it: a run without it is a "sandbox failure")."""

    timeout_s: float = 10.0
    memory_mb: int = 1024
    file_size_mb: int = 16
    open_files: int = 64
    max_processes: int = 512  # RLIMIT_NPROC counts all of the user's processes; not for root
    namespaces: bool | None = None
    read_only_mounts: bool | None = None  # needs namespaces
    landlock: bool | None = None
    prelude: bool = True
    output_tail_chars: int = 2000
    max_reply_bytes: int = 1 << 20  # one message between harness and candidate
    python: str = ""  # interpreter; default: the one running orl


@dataclass(frozen=True)
class SandboxResult:
    """``status``: pass | fail (tests failed, exit() called) | timeout | error (crash, limit)."""

    status: str
    reason: str
    stdout: str  # tail of the candidate's stdout and stderr
    wall_s: float
    isolation: str = "none"  # kernel mechanisms in force (see the module docstring)

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


@lru_cache(maxsize=None)
def landlock_abi() -> int:
    """This kernel's Landlock ABI version; 0 if it has none (or a seccomp filter hides it)."""
    if platform.system() != "Linux":
        return 0
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        # landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)
        version = libc.syscall(ctypes.c_long(444), None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    except (OSError, AttributeError, ImportError):
        return 0
    return max(0, int(version))


@lru_cache(maxsize=None)
def read_only_mounts_available() -> bool:
    """Whether the child can make its mounts read-only (probed once: needs namespaces and
    ``mount_setattr``, Linux 5.12+)."""
    if not namespaces_available():
        return False
    cfg = {"probe": True, "read_only_mounts": True, "parent_mnt_ns": _mnt_ns()}
    with tempfile.TemporaryDirectory(prefix="orl-sandbox-probe-") as d:
        try:
            r = subprocess.run(_unshare_prefix() + [sys.executable, "-I", str(CHILD), json.dumps(cfg)],
                               cwd=d, capture_output=True, timeout=20)
        except (OSError, subprocess.SubprocessError):
            return False
    return r.returncode == 0


def _mnt_ns() -> str:
    return os.readlink("/proc/self/ns/mnt")


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


def _child(config: SandboxConfig, **mode) -> tuple[list[str], dict, str]:
    """The child's command line, its configuration and the ``isolation`` it will have."""
    use_ns = namespaces_available() if config.namespaces is None else config.namespaces
    ro = ((use_ns and read_only_mounts_available()) if config.read_only_mounts is None
          else config.read_only_mounts)  # demanded without namespaces: the child refuses
    abi = landlock_abi() if config.landlock in (None, True) else 0
    if config.landlock and not abi:
        abi = -1  # demanded but absent: the child reports a sandbox failure
    cfg = {
        "cpu_s": math.ceil(config.timeout_s) + 1,
        "memory_bytes": config.memory_mb << 20,
        "file_bytes": config.file_size_mb << 20,
        "open_files": config.open_files,
        "nproc": config.max_processes if os.geteuid() != 0 else 0,
        "prelude": config.prelude,
        "namespaces": use_ns,
        "read_only_mounts": ro,
        "parent_mnt_ns": _mnt_ns(),
        "landlock": abi,
        "max_bytes": config.max_reply_bytes,
        **mode,
    }
    cmd = [config.python or sys.executable, "-I", str(CHILD), json.dumps(cfg)]
    if use_ns:
        cmd = _unshare_prefix() + cmd
    kinds = [k for k, on in (("namespaces", use_ns), ("read-only-mounts", ro), ("landlock", abi > 0)) if on]
    return cmd, cfg, "+".join(kinds) or "none"


def _reported(lines: list[str]) -> tuple[str, str] | None:
    """The child's own ``ORL-SANDBOX-RESULT`` (fail or error only; never a pass)."""
    reported = [l for l in lines if l.startswith(RESULT + " ")]
    if reported:
        try:
            info = json.loads(reported[-1][len(RESULT) + 1:])
            status = info["status"] if info.get("status") in ("fail", "error") else "error"
            return status, str(info.get("reason", ""))
        except (json.JSONDecodeError, TypeError, KeyError, AttributeError):
            pass
    return None


def _signal_name(rc: int) -> str:
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return str(-rc)


def _output(out_path: Path, config: SandboxConfig, hide: str = "") -> tuple[list[str], str]:
    lines = _tail(out_path, 4 * config.output_tail_chars + 4096).splitlines()
    shown = "\n".join(l for l in lines if (not hide or l != hide) and not l.startswith(RESULT))
    return lines, shown.strip("\n")[-config.output_tail_chars:]


def _sandboxed(fn, *args) -> SandboxResult:
    start = time.monotonic()
    base = Path(tempfile.mkdtemp(prefix="orl-sandbox-"))
    try:
        return fn(*args, base, start)
    except OSError as e:  # the sandbox itself could not run (no interpreter, no disk, ...)
        return SandboxResult("error", f"sandbox failure: {type(e).__name__}: {e}", "",
                             time.monotonic() - start)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def run_program(source: str, config: SandboxConfig = SandboxConfig()) -> SandboxResult:
    """Run ``source`` as ``__main__`` in a sandboxed child; never raises for program behaviour.
    Its pass is the program's claim (see the module docstring): grade with `run_tests`."""
    return _sandboxed(_run_program, source, config)


def _run_program(source: str, config: SandboxConfig, base: Path, start: float) -> SandboxResult:
    cwd = base / "work"
    cwd.mkdir()
    (cwd / "program.py").write_text(source, encoding="utf-8")
    out_path = base / "output.txt"  # outside the program's directory
    nonce = secrets.token_hex(16)
    cmd, cfg, isolation = _child(config)
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
    if not timed_out and not cfg["namespaces"]:
        _kill_group(proc.pid)  # anything the program left behind in its group
    wall = time.monotonic() - start
    lines, shown = _output(out_path, config, hide=nonce)

    def result(status: str, reason: str) -> SandboxResult:
        return SandboxResult(status, reason, shown, wall, isolation)

    if timed_out:
        return result("timeout", f"wall-clock limit of {config.timeout_s:g} s exceeded")
    if rc == 0 and nonce in lines:
        return result("pass", "")
    if rc == -signal.SIGXCPU:
        return result("timeout", f"CPU-time limit of {cfg['cpu_s']} s exceeded")
    reported = _reported(lines)
    if reported:
        return result(*reported)
    if rc == 0:
        return result("fail", "exited with status 0 before it finished (no completion marker)")
    if rc < 0:
        return result("error", f"killed by signal {_signal_name(rc)}")
    return result("error", f"exited with status {rc}")


def run_tests(candidate: str, test: str, names: Sequence[str], setup: str = "",
              config: SandboxConfig = SandboxConfig()) -> SandboxResult:
    """Run the trusted ``setup`` + ``test`` code in the harness with each of ``names`` bound to
    the function of that name defined by the untrusted ``candidate`` code, which runs (as
    ``__main__``) in the sandboxed child; never raises for candidate behaviour."""
    return _sandboxed(_run_tests, candidate, test, list(names), setup, config)


def _run_tests(candidate: str, test: str, names: list[str], setup: str, config: SandboxConfig,
               base: Path, start: float) -> SandboxResult:
    cwd = base / "work"
    cwd.mkdir()
    (cwd / "program.py").write_text(candidate, encoding="utf-8")
    out_path = base / "output.txt"  # outside the candidate's directory
    child_in, harness_out = os.pipe()
    harness_in, child_out = os.pipe()
    unclosed = {child_in, harness_out, harness_in, child_out}

    def close(*fds: int) -> None:
        for fd in fds:
            os.close(fd)
            unclosed.discard(fd)

    cmd, cfg, isolation = _child(config, serve=[child_in, child_out])
    spec = {"setup": setup, "test": test, "names": names, "fds": [harness_in, harness_out],
            "max_bytes": config.max_reply_bytes}
    child = harness = None
    timed_out = False
    try:
        with open(out_path, "wb") as out:
            child = subprocess.Popen(cmd, cwd=cwd, env=_env(str(cwd)), stdin=subprocess.DEVNULL,
                                     stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                     pass_fds=(child_in, child_out))
        close(child_in, child_out)  # from here the child holds the only copies of its ends
        harness = subprocess.Popen([config.python or sys.executable, "-I", "-S", str(HARNESS)], cwd=base,
                                   env=_env(str(base)), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, start_new_session=True,
                                   pass_fds=(harness_in, harness_out))
        close(harness_in, harness_out)
        try:
            verdict_text, harness_err = harness.communicate(
                json.dumps(spec).encode(), timeout=max(0.1, config.timeout_s - (time.monotonic() - start)))
        except subprocess.TimeoutExpired:
            timed_out = True
            harness.kill()
            verdict_text, harness_err = harness.communicate()
        verdict = _harness_verdict(verdict_text, harness_err)
        if verdict.get("ended") and not timed_out:
            try:  # it closed its pipe: let it finish dying, so its exit status says how
                child.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass
    finally:
        close(*unclosed)
        if harness is not None and harness.poll() is None:
            harness.kill()
            harness.wait()
        if child is not None:
            _kill_group(child.pid)  # the candidate waits for calls that will not come, or worse
            rc = child.wait()
    wall = time.monotonic() - start
    lines, shown = _output(out_path, config)

    def result(status: str, reason: str) -> SandboxResult:
        return SandboxResult(status, reason, shown, wall, isolation)

    if timed_out:
        return result("timeout", f"wall-clock limit of {config.timeout_s:g} s exceeded")
    status, reason = verdict["status"], verdict["reason"]
    if status == "pass" or not verdict.get("ended"):
        return result(status, reason)
    # the candidate's process ended early: its own report and exit status explain why
    if rc == -signal.SIGXCPU:
        return result("timeout", f"CPU-time limit of {cfg['cpu_s']} s exceeded")
    reported = _reported(lines)
    if reported:
        return result(*reported)
    if rc < 0:
        return result("error", f"{reason} (killed by signal {_signal_name(rc)})")
    return result(status, f"{reason} (exit status {rc})")


def _harness_verdict(text: bytes, err: bytes) -> dict:
    """The harness's verdict line; any other output is a harness failure, never a pass."""
    try:
        verdict = json.loads(text.decode().strip().splitlines()[-1])
        if verdict["status"] in ("pass", "fail", "error") and isinstance(verdict["reason"], str):
            return verdict
    except (ValueError, IndexError, KeyError, TypeError):
        pass
    tail = err.decode(errors="replace").strip()[-500:]
    return {"status": "error", "reason": f"sandbox failure: the harness gave no verdict: {tail}"}


def run_many(sources: list[str], config: SandboxConfig = SandboxConfig(),
             workers: int | None = None) -> list[SandboxResult]:
    """Run several programs, ``workers`` at a time (threads waiting on child processes)."""
    workers = workers or min(8, (os.cpu_count() or 1) * 2)
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(lambda s: run_program(s, config), sources))
