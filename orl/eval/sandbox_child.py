"""The child side of `orl.eval.sandbox`: run as a script by ``python -I`` inside the sandbox.

It reads a one-time nonce from stdin (then points stdin at /dev/null), applies the resource
limits given as JSON in argv[1], installs the in-process guards (the "prelude") unless disabled,
then executes ``program.py`` from the current (fresh, temporary) directory. Only if the program
runs to its end without raising or calling ``exit`` does it write the nonce to stdout and exit 0:
the parent counts a pass only when it sees that nonce, so ``sys.exit(0)``, ``os._exit(0)`` or a
printed "passed" cannot fake one. Every other ending prints one ``ORL-SANDBOX-RESULT`` line.

The prelude is a speed bump against accidents and naive reward hacks, NOT a security boundary:
code in the same interpreter can undo any of it. The boundary is the parent's: separate process,
rlimits, namespaces where available, wall-clock kill of the whole process group.

This file imports nothing from orl (it runs with ``-I``, so orl is not importable here).
"""
import builtins
import io
import json
import linecache
import os
import sys
import traceback

RESULT = "ORL-SANDBOX-RESULT"
EXIT_FAIL, EXIT_ERROR = 2, 3


def _limit(resource, name: str, value: int, hard: int | None = None) -> None:
    try:
        resource.setrlimit(getattr(resource, name), (value, value if hard is None else hard))
    except (ValueError, OSError):
        pass  # cannot lower below current use, or not supported here: the parent's limits remain


def apply_limits(cfg: dict) -> None:
    import resource

    _limit(resource, "RLIMIT_CORE", 0)
    _limit(resource, "RLIMIT_CPU", cfg["cpu_s"], cfg["cpu_s"] + 1)  # SIGXCPU, then SIGKILL
    _limit(resource, "RLIMIT_AS", cfg["memory_bytes"])
    _limit(resource, "RLIMIT_FSIZE", cfg["file_bytes"])
    _limit(resource, "RLIMIT_NOFILE", cfg["open_files"])
    if cfg.get("nproc"):
        _limit(resource, "RLIMIT_NPROC", cfg["nproc"])


def _blocked(name: str):
    def blocked(*args, **kwargs):
        raise PermissionError(f"{name} is disabled in the orl sandbox")

    return blocked


def install_prelude(cwd: str) -> None:
    """Disable process creation, signals, sockets and ctypes; confine writes to ``cwd``."""
    import posix
    import socket

    import _posixsubprocess
    import _socket

    for mod in (os, posix):
        for name in ("fork", "forkpty", "vfork", "system", "popen", "kill", "killpg", "setsid",
                     "posix_spawn", "posix_spawnp", "execv", "execve", "execl", "execle", "execlp",
                     "execlpe", "execvp", "execvpe", "spawnv", "spawnve", "spawnl", "spawnle",
                     "spawnlp", "spawnlpe", "spawnvp", "spawnvpe"):
            if hasattr(mod, name):
                setattr(mod, name, _blocked(f"os.{name}"))
    _posixsubprocess.fork_exec = _blocked("subprocess")

    class NoNetwork:
        def __init__(self, *args, **kwargs):
            raise PermissionError("network access is disabled in the orl sandbox")

    for mod in (socket, _socket):
        for name in ("socket", "SocketType", "socketpair", "fromfd", "create_connection",
                     "create_server", "getaddrinfo", "gethostbyname"):
            if hasattr(mod, name):
                setattr(mod, name, NoNetwork)
    for name in ("ctypes", "_ctypes"):
        sys.modules[name] = None  # `import ctypes` now raises ImportError

    root = os.path.realpath(cwd)
    real = os.path.realpath

    def allowed(path, writing: bool) -> bool:
        if isinstance(path, int):
            return True
        p = real(os.fsdecode(path))
        if p.startswith("/proc/"):  # other processes' environ, mem, ...
            part = p.split("/")[2]
            if part.isdigit() and part != str(os.getpid()):
                return False
        if not writing:
            return True
        return p == root or p.startswith(root + os.sep) or p == os.devnull

    open_ = builtins.open

    def guarded_open(file, mode="r", *args, **kwargs):
        if not allowed(file, any(c in mode for c in "wax+")):
            raise PermissionError(f"the orl sandbox refuses to open {file!r} with mode {mode!r}")
        return open_(file, mode, *args, **kwargs)

    builtins.open = io.open = guarded_open
    os_open = os.open
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

    def guarded_os_open(path, flags, *args, **kwargs):
        if not allowed(path, bool(flags & write_flags)):
            raise PermissionError(f"the orl sandbox refuses to open {path!r}")
        return os_open(path, flags, *args, **kwargs)

    os.open = posix.open = guarded_os_open

    def guard_paths(name: str, n_paths: int):
        fn = getattr(os, name)

        def guarded(*args, **kwargs):
            for path in args[:n_paths]:
                if not allowed(path, True):
                    raise PermissionError(f"the orl sandbox refuses os.{name} on {path!r}")
            return fn(*args, **kwargs)

        setattr(os, name, guarded)
        setattr(posix, name, guarded)

    for name in ("remove", "unlink", "rmdir", "mkdir", "chmod", "chown", "truncate", "utime"):
        guard_paths(name, 1)
    for name in ("rename", "replace", "link", "symlink"):
        guard_paths(name, 2)


def describe(e: BaseException) -> str:
    """One line: the exception and the last line of program.py it passed through."""
    where = ""
    for frame, lineno in traceback.walk_tb(e.__traceback__):
        if frame.f_code.co_filename == "program.py":
            where = f" (program.py line {lineno}: {linecache.getline('program.py', lineno).strip()})"
    text = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    return text + where


def report(status: str, reason: str, code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.write(2, f"\n{RESULT} {json.dumps({'status': status, 'reason': reason[-500:]})}\n".encode())
    os._exit(code)


def main() -> None:
    nonce = sys.stdin.readline().strip().encode()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    cfg = json.loads(sys.argv[1])
    apply_limits(cfg)
    with open("program.py", encoding="utf-8") as f:
        source = f.read()
    if cfg["prelude"]:
        install_prelude(os.getcwd())
    try:
        code = compile(source, "program.py", "exec")
    except (SyntaxError, ValueError) as e:
        report("error", f"{type(e).__name__}: {e}", EXIT_ERROR)
    try:
        exec(code, {"__name__": "__main__", "__builtins__": builtins})
    except SystemExit as e:
        report("fail", f"program called exit({e.code!r}) before it finished", EXIT_FAIL)
    except AssertionError:
        report("fail", describe(sys.exc_info()[1]), EXIT_FAIL)
    except BaseException as e:  # noqa: BLE001 - anything the program raises is its failure
        report("error", describe(e), EXIT_ERROR)
    sys.stdout.flush()
    sys.stderr.flush()
    os.write(1, b"\n" + nonce + b"\n")
    os._exit(0)


if __name__ == "__main__":
    main()
