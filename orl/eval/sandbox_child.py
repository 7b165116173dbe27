"""The child side of `orl.eval.sandbox`: run as a script by ``python -I`` inside the sandbox.

Everything below happens before any untrusted code runs, in this order:

1. read the configuration (JSON in argv[1]); in program mode, a one-time nonce from stdin;
   stdin then points at /dev/null;
2. resource limits (rlimits) and the source of ``program.py`` from the working directory;
3. kernel confinement, each step only where the parent asks for it (it asks for what its probes
   found); a requested step that fails ends the child before the program runs ("sandbox
   failure"), so the parent's ``isolation`` report is never wrong in the optimistic direction:

   * read-only mounts (only inside the sandbox's own mount namespace, checked against the
     parent's): every mount becomes read-only except a bind mount of the working directory, so
     chmod, chown, utime, xattrs, links and writes outside it fail with EROFS;
   * Landlock (Linux 5.13+): writes, creations, removals, renames, links, truncation and
     ``execve`` are denied everywhere except inside the working directory (and writing
     /dev/null); with ABI 6+ no signals to, or abstract sockets of, processes outside; with
     ABI 4+ and no network namespace, no TCP connect or bind. Landlock checks the object an
     operation reaches, so descriptors (``openat`` on a directory fd), symlinks and ``/proc``
     magic links do not get around it, and it cannot be undone by the program. It also forbids
     ptrace-like access to processes outside (``/proc/<pid>/mem``, ``/fd``, ``environ``);
   * no capabilities (``no_new_privs`` and an empty capability set): a child running as root
     can no longer mount, set the clock, load modules or bypass file permissions;

4. the in-process prelude (unless disabled): fork/exec/kill/sockets/ctypes replaced by stubs
   and writes outside the working directory refused. A speed bump against accidents and naive
   reward hacks, NOT a boundary: code in the same interpreter can undo it.

Then one of two modes:

* program mode: execute ``program.py`` as ``__main__``; if it runs to its end, write the nonce to
  stdout and exit 0, else one ``ORL-SANDBOX-RESULT`` line. The program can read the nonce from
  its own memory, so this verdict is the program's claim, not a check (see `orl.eval.sandbox`);
* serve mode (``"serve": [read_fd, write_fd]``): execute ``program.py`` (the candidate's
  definitions), send ``("ready",)`` over the write fd, then answer each ``("call", name, args,
  kwargs)`` from the harness with ``("return", value)``, ``("raise", type, text, is_exception)``
  or ``("error", text)``, in `orl.eval.sandbox_wire`'s format, until the read fd closes. Nothing
  here decides a verdict: the candidate can rewrite all of this code, and can only change what it
  answers.

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

# Landlock (include/uapi/linux/landlock.h); syscalls 444-446 on every architecture.
FS_EXECUTE, FS_WRITE_FILE = 1 << 0, 1 << 1
FS_REMOVE_DIR, FS_REMOVE_FILE, FS_MAKE_CHAR, FS_MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
FS_MAKE_REG, FS_MAKE_SOCK, FS_MAKE_FIFO, FS_MAKE_BLOCK = 1 << 8, 1 << 9, 1 << 10, 1 << 11
FS_MAKE_SYM, FS_REFER, FS_TRUNCATE = 1 << 12, 1 << 13, 1 << 14
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1
SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF, SYS_MOUNT_SETATTR = 444, 445, 446, 442
MOUNT_ATTR_RDONLY, AT_RECURSIVE, AT_FDCWD, MS_BIND = 0x1, 0x8000, -100, 4096
PR_SET_NO_NEW_PRIVS, CAPS_V3 = 38, 0x20080522


class SetupError(Exception):
    """A confinement step the parent asked for could not be applied."""


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


def _libc():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return ctypes, libc


def _check(result: int, what: str) -> int:
    if result < 0:
        import ctypes

        errno = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(errno)} (errno {errno})")
    return result


def read_only_mounts(cwd: str, parent_mnt_ns: str) -> None:
    """Every mount read-only except a bind mount of ``cwd`` (only in our own mount namespace)."""
    if os.readlink("/proc/self/ns/mnt") == parent_mnt_ns:
        raise SetupError("read-only mounts: not in a mount namespace of its own")
    ctypes, libc = _libc()

    class MountAttr(ctypes.Structure):
        _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                    ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]

    def setattr_(path: str, flags: int, attr) -> None:
        _check(libc.syscall(ctypes.c_long(SYS_MOUNT_SETATTR), ctypes.c_int(AT_FDCWD),
                                    ctypes.c_char_p(path.encode()), ctypes.c_uint(flags),
                                    ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr))),
               f"mount_setattr {path}")

    _check(libc.mount(cwd.encode(), cwd.encode(), None, ctypes.c_ulong(MS_BIND), None),
           "bind mount of the working directory")
    setattr_("/", AT_RECURSIVE, MountAttr(attr_set=MOUNT_ATTR_RDONLY))
    setattr_(cwd, 0, MountAttr(attr_clr=MOUNT_ATTR_RDONLY))
    os.chdir(cwd)  # the old working directory is the directory under the bind mount, now read-only


def landlock(cwd: str, abi: int, deny_tcp: bool) -> None:
    """Restrict this process and its descendants (see the module docstring); cannot be undone."""
    ctypes, libc = _libc()

    class RulesetAttr(ctypes.Structure):
        _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    inside = (FS_WRITE_FILE | FS_REMOVE_DIR | FS_REMOVE_FILE | FS_MAKE_DIR | FS_MAKE_REG
              | FS_MAKE_SYM | (FS_REFER if abi >= 2 else 0) | (FS_TRUNCATE if abi >= 3 else 0))
    attr = RulesetAttr(fs=inside | FS_EXECUTE | FS_MAKE_CHAR | FS_MAKE_SOCK | FS_MAKE_FIFO | FS_MAKE_BLOCK,
                       net=(NET_BIND_TCP | NET_CONNECT_TCP) if abi >= 4 and deny_tcp else 0,
                       scoped=(SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL) if abi >= 6 else 0)
    size = 8 if abi < 4 else 16 if abi < 6 else 24  # the struct as this ABI knows it
    sys_ = libc.syscall
    ruleset = _check(sys_(ctypes.c_long(SYS_CREATE_RULESET), ctypes.byref(attr),
                                  ctypes.c_size_t(size), ctypes.c_uint32(0)), "landlock_create_ruleset")
    try:
        for path, allowed in ((cwd, inside), (os.devnull, FS_WRITE_FILE | (FS_TRUNCATE if abi >= 3 else 0))):
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = PathBeneath(allowed=allowed, parent_fd=fd)
                _check(sys_(ctypes.c_long(SYS_ADD_RULE), ctypes.c_int(ruleset), ctypes.c_int(1),
                                    ctypes.byref(rule), ctypes.c_uint32(0)), f"landlock_add_rule {path}")
            finally:
                os.close(fd)
        _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        _check(sys_(ctypes.c_long(SYS_RESTRICT_SELF), ctypes.c_int(ruleset), ctypes.c_uint32(0)),
               "landlock_restrict_self")
    finally:
        os.close(ruleset)


def drop_capabilities() -> None:
    """``no_new_privs`` and empty effective/permitted/inheritable sets: root loses its powers."""
    ctypes, libc = _libc()

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    _check(libc.capset(ctypes.byref(Header(CAPS_V3, 0)), ctypes.byref((Data * 2)())),
           "capset")


def confine(cfg: dict, cwd: str) -> None:
    """The kernel steps of the module docstring, as requested by the parent."""
    if cfg.get("read_only_mounts"):
        read_only_mounts(cwd, cfg["parent_mnt_ns"])
    if cfg.get("landlock", 0) < 0:
        raise SetupError("Landlock was demanded, and this kernel has none")
    if cfg.get("landlock"):
        landlock(cwd, cfg["landlock"], deny_tcp=not cfg.get("namespaces"))
    drop_capabilities()
    for name in ("ctypes", "_ctypes"):
        sys.modules.pop(name, None)


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


def describe(e: BaseException, with_type: bool = True) -> str:
    """One line: the exception and the last line of program.py it passed through."""
    where = ""
    for frame, lineno in traceback.walk_tb(e.__traceback__):
        if frame.f_code.co_filename == "program.py":
            where = f" (program.py line {lineno}: {linecache.getline('program.py', lineno).strip()})"
    if not with_type:
        return f"{e}{where}"
    text = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    return text + where


def report(status: str, reason: str, code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.write(2, f"\n{RESULT} {json.dumps({'status': status, 'reason': reason[-500:]})}\n".encode())
    os._exit(code)


def _load_wire():
    from importlib.util import module_from_spec, spec_from_file_location

    spec = spec_from_file_location("sandbox_wire", os.path.join(os.path.dirname(__file__), "sandbox_wire.py"))
    wire = module_from_spec(spec)
    spec.loader.exec_module(wire)
    return wire


def _send(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def serve(namespace: dict, wire, rfd: int, wfd: int, max_bytes: int) -> None:
    """Answer the harness's calls until it closes the pipe (see the module docstring)."""
    sys.stdout.flush()  # what the setup printed, before the harness hears from this process (as each answer below)
    sys.stderr.flush()
    _send(wfd, wire.dumps(("ready",)))
    reader = wire.LineReader(rfd, max_bytes)
    while True:
        line = reader.readline()
        if line is None:
            os._exit(0)
        _, name, args, kwargs = wire.loads(line)
        if name not in namespace:
            _send(wfd, wire.dumps(("error", f"the candidate's code defines no {name!r}")))
            continue
        try:
            value = namespace[name](*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - the harness decides what an exception means
            reply = ("raise", type(e).__name__, describe(e, with_type=False), isinstance(e, Exception))
        else:
            reply = ("return", value)
        try:
            data = wire.dumps(reply)
        except Exception as e:  # noqa: BLE001 - NotPlainData, or a value whose iteration raised
            data = wire.dumps(("error", f"the candidate returned {e}"))
        if len(data) > max_bytes:
            data = wire.dumps(("error", f"the candidate's answer is larger than {max_bytes} bytes"))
        # what the call printed reaches the output file before its answer leaves: the parent kills this process as
        # soon as the tests end, which may be before it runs another line (a flush after the send lost the output
        # when this process was descheduled in between: the flaky test of issue 26)
        sys.stdout.flush()
        sys.stderr.flush()
        _send(wfd, data)


def main() -> None:
    cfg = json.loads(sys.argv[1])
    if cfg.get("probe"):  # the parent asks whether the requested confinement works here
        try:
            confine(cfg, os.getcwd())
        except Exception as e:  # noqa: BLE001 - any failure means "not here"
            os.write(2, f"{type(e).__name__}: {e}\n".encode())
            os._exit(EXIT_ERROR)
        os._exit(0)
    serving = cfg.get("serve")
    nonce = b"" if serving else sys.stdin.readline().strip().encode()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    apply_limits(cfg)
    with open("program.py", encoding="utf-8") as f:
        source = f.read()
    wire = _load_wire() if serving else None
    cwd = os.getcwd()
    try:
        confine(cfg, cwd)
    except Exception as e:  # noqa: BLE001 - no ctypes, no such libc function, a kernel refusal
        report("error", f"sandbox failure: {type(e).__name__}: {e}", EXIT_ERROR)
    if cfg["prelude"]:
        install_prelude(cwd)
    try:
        code = compile(source, "program.py", "exec")
    except (SyntaxError, ValueError) as e:
        report("error", f"{type(e).__name__}: {e}", EXIT_ERROR)
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    try:
        exec(code, namespace)
    except SystemExit as e:
        report("fail", f"program called exit({e.code!r}) before it finished", EXIT_FAIL)
    except AssertionError:
        report("fail", describe(sys.exc_info()[1]), EXIT_FAIL)
    except BaseException as e:  # noqa: BLE001 - anything the program raises is its failure
        report("error", describe(e), EXIT_ERROR)
    if serving:
        serve(namespace, wire, serving[0], serving[1], cfg["max_bytes"])
    sys.stdout.flush()
    sys.stderr.flush()
    os.write(1, b"\n" + nonce + b"\n")
    os._exit(0)


if __name__ == "__main__":
    main()
