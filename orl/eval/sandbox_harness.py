"""The trusted side of `orl.eval.sandbox`: runs a task's tests against a candidate it never imports.

Run by the parent as ``python -I sandbox_harness.py`` with two inherited pipe ends (to and from
the candidate's process) and a JSON spec on stdin: ``setup`` (trusted code: the dataset's
imports and helpers), ``test`` (the dataset's test code), ``names`` (the functions the tests
call on the candidate), ``fds`` and ``max_bytes``. It executes ``setup``, binds each name to a
`Candidate` proxy, executes ``test``, and writes one JSON verdict to its stdout, which only the
parent holds.

A proxy call sends its arguments (plain data only) to the candidate's process and decodes the
reply with `orl.eval.sandbox_wire`, which builds nothing but builtin values, so every ``==``,
``assert`` and ``sorted`` of the tests runs here on plain data: a returned object cannot lie
about its equality or its repr, and nothing in the candidate's memory (no nonce exists) decides
the verdict. An exception the candidate raised is re-raised here as the builtin exception of the
same name (else `CandidateError`), so tests that expect one still work. A broken exchange (the
process ended, a malformed or oversized reply, an answer that is not plain data, an exit or a
``BaseException`` in the candidate) raises `CandidateFailure`, a ``BaseException`` the tests
cannot catch with ``except Exception``, and fails the run even if a bare ``except:`` swallowed it.

This process never executes the candidate's code: it does not need the sandbox's limits, and the
parent's wall-clock limit bounds it. This file imports nothing from orl (it runs with ``-I``).
"""
import builtins
import json
import os
import sys

ENDED = "the candidate's process ended"


class CandidateError(Exception):
    """An exception raised by the candidate that is not a builtin one."""


class CandidateFailure(BaseException):
    """The exchange with the candidate broke; the run cannot pass."""


class Channel:
    """The pipes to the candidate's process; ``broken`` is the first failure's reason."""

    def __init__(self, wire, rfd: int, wfd: int, max_bytes: int):
        self.wire, self.wfd, self.broken = wire, wfd, ""
        self.reader = wire.LineReader(rfd, max_bytes)

    def fail(self, reason: str):
        self.broken = self.broken or reason
        raise CandidateFailure(self.broken)

    def receive(self):
        try:
            line = self.reader.readline()
            if line is None:
                self.fail(ENDED)
            reply = self.wire.loads(line)
        except self.wire.WireError as e:
            self.fail(f"malformed reply from the candidate: {e}")
        if type(reply) is not tuple or not reply or type(reply[0]) is not str:
            self.fail(f"malformed reply from the candidate: {str(reply)[:80]}")
        return reply

    def call(self, name: str, args: tuple, kwargs: dict):
        if self.broken:
            raise CandidateFailure(self.broken)
        try:
            data = self.wire.dumps(("call", name, args, kwargs))
        except self.wire.NotPlainData as e:
            self.fail(f"the test passes {e} to {name}: only plain data crosses to the candidate")
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self.wfd, view):]
        except OSError:
            self.fail(ENDED)
        reply = self.receive()
        kind = reply[0]
        if kind == "return" and len(reply) == 2:
            return reply[1]
        if kind == "raise" and len(reply) == 4 and all(type(v) is str for v in reply[1:3]):
            _, exc_name, text, is_exception = reply
            if is_exception is not True:
                self.fail(f"the candidate raised {exc_name}: {text}".rstrip(": "))
            raise _exception(exc_name, text)
        if kind == "error" and len(reply) == 2 and type(reply[1]) is str:
            self.fail(reply[1][:500])
        self.fail(f"malformed reply from the candidate: {str(reply)[:80]}")


def _exception(name: str, text: str) -> Exception:
    cls = getattr(builtins, name, None)
    message = f"{text} (raised by the candidate)"
    if isinstance(cls, type) and issubclass(cls, Exception) and not issubclass(cls, StopIteration):
        try:
            return cls(message)
        except Exception:  # noqa: BLE001 - e.g. UnicodeDecodeError needs five arguments
            pass
    return CandidateError(message)


class Candidate:
    """Stands for the candidate's function ``name`` in the test code."""

    def __init__(self, name: str, channel: Channel):
        self.name, self.channel = name, channel

    def __call__(self, *args, **kwargs):
        return self.channel.call(self.name, args, kwargs)

    def __repr__(self) -> str:
        return f"<candidate {self.name}>"


def describe(e: BaseException, lines: list[str]) -> str:
    """One line: the exception and the last line of the test code (``lines``) it passed through."""
    import traceback  # only on failure: it is a slow import, and most runs pass or fail once

    where = ""
    for frame, lineno in traceback.walk_tb(e.__traceback__):
        if frame.f_code.co_filename == "test.py" and 0 < lineno <= len(lines):
            where = f" (test line {lineno}: {lines[lineno - 1].strip()})"
    text = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    return text + where


def run(spec: dict, channel: Channel) -> dict:
    """The verdict: status pass | fail | error, a reason, and whether the candidate's process
    ended early (``ended``: the parent then looks at how it ended)."""
    try:
        first = channel.receive()
    except CandidateFailure as e:
        return {"status": "error", "reason": f"{e} before its definitions finished",
                "ended": channel.broken == ENDED}
    if first != ("ready",):
        return {"status": "error", "reason": f"the candidate did not start: {str(first)[:80]}"}
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    try:
        exec(compile(spec["setup"], "setup.py", "exec"), namespace)
    except BaseException as e:  # noqa: BLE001 - the dataset's own code; report, do not pass
        return {"status": "error", "reason": f"the test setup failed: {type(e).__name__}: {e}"}
    for name in spec["names"]:
        namespace[name] = Candidate(name, channel)
    lines = spec["test"].splitlines()
    status, reason = "pass", ""
    try:
        exec(compile(spec["test"], "test.py", "exec"), namespace)
    except CandidateFailure:
        pass  # channel.broken says why
    except AssertionError as e:
        status, reason = "fail", describe(e, lines)
    except SystemExit as e:
        status, reason = "error", f"the test code called exit({e.code!r})"
    except BaseException as e:  # noqa: BLE001 - a candidate's exception, or a wrong-typed answer
        status, reason = "error", describe(e, lines)
    if channel.broken:
        return {"status": "error", "reason": channel.broken, "ended": channel.broken == ENDED}
    return {"status": status, "reason": reason}


def _load_wire():
    from importlib.util import module_from_spec, spec_from_file_location

    spec = spec_from_file_location("sandbox_wire", os.path.join(os.path.dirname(__file__), "sandbox_wire.py"))
    wire = module_from_spec(spec)
    spec.loader.exec_module(wire)
    return wire


def main() -> None:
    spec = json.loads(sys.stdin.read())
    verdict = os.dup(1)
    os.dup2(2, 1)  # what the test code prints goes to stderr, not into the verdict
    channel = Channel(_load_wire(), spec["fds"][0], spec["fds"][1], spec["max_bytes"])
    try:
        result = run(spec, channel)
    except BaseException as e:  # noqa: BLE001 - a bug here must still produce a verdict
        result = {"status": "error", "reason": f"harness failure: {type(e).__name__}: {e}"}
    os.write(verdict, (json.dumps(result) + "\n").encode())
    os._exit(0)


if __name__ == "__main__":
    main()
