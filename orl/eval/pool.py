"""The one reward path: ``task.verify`` in worker processes, and what it returns validated.

Training rewards (`orl.train.rollout.rollout_group`), the in-process held-out evaluation
(`orl.eval.heldout.evaluate`) and the scored benchmark pipeline (`orl.eval.score`) all score
through `rewards`, so a verifier is run, bounded and judged the same way for a reward as for a
published number (docs/STYLE.md convention 6).

Why processes: math-verify bounds its work with ``signal.alarm``, which only works in a main
thread, and a verifier can hang, crash or eat memory. Each worker runs ``task.verify`` in its own
main thread under an address-space limit (``memory_mb`` beyond what the worker started with); the
parent gives every item a wall-clock budget (``timeout_s``) and, when an item overruns or its
worker dies, kills that worker, records the reason and starts a fresh one.

What a verifier may return: a float in [0, 1], a bool, or the int 0 or 1 (0-d numpy/torch values
are read with ``.item()``). Anything else -- NaN, inf, 2.0, -5, None, a string -- and a raise, a
timeout or a dead worker is a verifier error. ``reward_errors="raise"`` (the default) raises
`RewardError` naming the task, the problems and the values once the batch is done;
``reward_errors="zero"`` scores those items 0 and counts them (`Rewards.n_errors`, and
``Rollout.reward_error`` in training), for a run that must go on.

`VerifierPool` keeps its workers between calls: a training loop makes one, starts it before it
loads its model (`VerifierPool.start`) and hands it to every `rollout_group`, so a rollout costs a
pipe round trip (~0.1 ms), not a process start. Without one, `rewards` forks a pool for the call
and stops it afterwards: ~10 ms, and the caller then takes a page fault on the first write to each
page it shared with the fork -- per group, about a quarter of a CPU demo step (docs/LOG.md).

Workers die with their parent: each asks Linux to SIGKILL it when the thread that started it ends
(``PR_SET_PDEATHSIG``), and under "fork" closes the copies of the pool's pipe ends it inherited
from the parent, so that without the signal (other systems) it still reads EOF once the parent
is gone. A pool is driven from one thread at a time, one that outlives it (its workers die with
the thread that started them).

The default start method is "fork": the task object is inherited, not pickled, so user tasks
defined anywhere work; pass ``start_method="spawn"`` or ``"forkserver"`` for a parent with many
threads (the task must then pickle). ``timeout_s`` must exceed the task's own limits (a code
task's sandbox timeout), so that the sandbox, not this pool, stops a slow program and cleans up.

Does not own: what a verifier does (the tasks), the sandbox (`orl.eval.sandbox`), what callers do
with the scores (aggregation: `orl.eval.score`; the training step: `orl.train.loop`).
"""
from __future__ import annotations

import math
import multiprocessing as mp
import numbers
import os
import signal
import sys
import time
import weakref
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Callable, Iterable, Iterator

from orl.tasks.base import Problem, Task

REWARD_ERRORS = ("raise", "zero")
RULE = "a reward is a float in [0, 1], a bool, or the int 0 or 1"
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# A pool starts one worker and adds one (up to ``workers``) whenever items wait and no answer came
# for this long: a microsecond verifier (arith) is served by one process, so a small batch pays one
# process start, not one per CPU; math-verify (milliseconds an item) or a sandbox soon gets them all.
GROW_S = 0.02


@dataclass(frozen=True)
class Verdict:
    """The score of item ``index``; ``error`` is "" unless verify returned an invalid value,
    raised, timed out or its worker died (then ``score`` is 0.0)."""

    index: int
    score: float
    error: str = ""


@dataclass
class Rewards:
    """Validated scores of a batch, in input order; ``errors[i]`` is "" where item i verified."""

    scores: list[float]
    errors: list[str]

    @property
    def n_errors(self) -> int:
        return sum(1 for e in self.errors if e)


class RewardError(ValueError):
    """Verifier errors of one batch under ``reward_errors="raise"``; ``failures`` holds
    (problem id, reason) of each."""

    def __init__(self, task_name: str, failures: list[tuple[str, str]], n: int):
        self.task_name, self.failures = task_name, failures
        counts: dict[tuple[str, str], int] = {}
        for f in failures:  # a group's G rollouts of one problem often fail alike: one line each
            counts[f] = counts.get(f, 0) + 1
        lines = [f"\n  problem {pid!r}{f' ({c} items)' if c > 1 else ''}: {why}" for (pid, why), c in counts.items()]
        shown = "".join(lines[:5])
        more = f"\n  ... and {len(lines) - 5} more" if len(lines) > 5 else ""
        super().__init__(
            f"task {task_name!r}: verify failed on {len(failures)} of {n} items ({RULE}):{shown}{more}\n"
            "Fix the verifier, or pass reward_errors='zero' to score such items 0 and count them.")


def _show(value) -> str:
    r = repr(value)
    r = r if len(r) <= 80 else r[:77] + "..."
    return r if value is None or isinstance(value, (int, float)) else f"{r} (a {type(value).__name__})"


def check_reward(value) -> tuple[float, str]:
    """``(score, "")`` for a valid reward (see the module docstring), else ``(0.0, why)``."""
    if getattr(value, "shape", None) == () and callable(getattr(value, "item", None)):
        value = value.item()  # numpy scalars (np.bool_ included), 0-d arrays and tensors
    if isinstance(value, bool):
        return float(value), ""
    if isinstance(value, numbers.Integral):
        return (float(value), "") if value in (0, 1) else (0.0, f"verify returned {_show(value)}")
    if isinstance(value, numbers.Real):
        f = float(value)
        if math.isfinite(f) and 0.0 <= f <= 1.0:
            return f, ""
    return 0.0, f"verify returned {_show(value)}"


def _die_with_parent(parent_pid: int | None) -> None:
    """SIGKILL this process when the thread that started it ends (Linux), and leave at once if
    that parent is already gone."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes  # noqa: PLC0415
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(0)


def _limit_memory(memory_mb: float | None) -> None:
    """Let this process map at most ``memory_mb`` MiB beyond what it holds now (RLIMIT_AS, soft:
    a forked worker starts with the parent's address space, which may be large)."""
    if not memory_mb:
        return
    try:
        import resource  # noqa: PLC0415
        with open("/proc/self/statm") as f:
            now = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        want = now + int(memory_mb * 2**20)
        if hard != resource.RLIM_INFINITY:
            want = min(want, hard)
        if soft == resource.RLIM_INFINITY or want < soft:
            resource.setrlimit(resource.RLIMIT_AS, (want, hard))
    except (ImportError, OSError, ValueError):
        pass  # no /proc or no rlimits here: the pool's timeout still bounds the item


def _worker(task: Task, conn, inherited: list, memory_mb: float | None, parent_pid: int | None) -> None:
    _die_with_parent(parent_pid)
    for c in inherited:  # the parent's pipe ends a fork copied here: without them, EOF when it dies
        c.close()
    if parent_pid is not None and inherited:  # forked: every other descriptor too, e.g. a run directory's
        keep = conn.fileno()                  # lock (flock is shared by a fork: the lock would outlive its run)
        os.closerange(3, keep)
        os.closerange(keep + 1, max(keep + 1, os.sysconf("SC_OPEN_MAX")))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _limit_memory(memory_mb)
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        index, problem, completion = msg
        try:
            score, error = check_reward(task.verify(problem, completion))
        except Exception as e:  # noqa: BLE001 - a verifier bug is reported, not fatal to the worker
            score, error = 0.0, f"verify raised {type(e).__name__}: {e}"[:300]
        conn.send((index, score, error))


class _Slot:
    """One worker process and the item it is working on."""

    def __init__(self, ctx, task: Task, memory_mb: float | None, others: list):
        self.conn, child = ctx.Pipe()
        method = ctx.get_start_method()
        inherited = [*others, self.conn] if method == "fork" else []  # spawn/forkserver inherit no fds
        parent = None if method == "forkserver" else os.getpid()  # a forkserver child's parent is the server
        self.proc = ctx.Process(target=_worker, args=(task, child, inherited, memory_mb, parent), daemon=True)
        self.proc.start()
        child.close()
        self.item: tuple[int, float] | None = None  # (index, start time)

    def give(self, index: int, problem: Problem, completion: str) -> None:
        self.item = (index, time.monotonic())
        try:
            self.conn.send((index, problem, completion))
        except (OSError, ValueError):
            pass  # the worker is gone: its end reads EOF, and the item is reported as a dead worker's

    def stop(self, kill: bool = False) -> None:
        """An idle worker is told to leave and not waited for (it exits on its own, and
        multiprocessing reaps it at the next start or at exit); a busy one is killed."""
        if kill:
            self.proc.kill()
            self.proc.join()
        else:
            try:
                self.conn.send(None)
            except (OSError, ValueError):
                self.proc.kill()
                self.proc.join()
        self.conn.close()


def _stop_all(slots: list) -> None:
    for s in slots:
        s.stop(kill=s.item is not None)
    slots.clear()


class VerifierPool:
    """Up to ``workers`` (default: CPU count) persistent processes running ``task.verify``; they
    start when needed (one first, see `GROW_S`) and live until `close` (or the pool's garbage
    collection)."""

    def __init__(self, task: Task, workers: int | None = None, timeout_s: float = 60.0,
                 memory_mb: float | None = 4096, start_method: str = "fork"):
        self.task, self.timeout_s, self.memory_mb = task, timeout_s, memory_mb
        self.workers = max(1, workers or os.cpu_count() or 1)
        self._ctx = mp.get_context(start_method)
        self._slots: list[_Slot] = []
        self._finalizer = weakref.finalize(self, _stop_all, self._slots)

    def __enter__(self) -> "VerifierPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._finalizer()

    def start(self, n: int | None = None) -> "VerifierPool":
        """Start workers now, up to ``n`` (default ``workers``). A trainer calls this before it
        loads its model: a forked worker shares every page its parent has at the fork, and the
        parent then pays a page fault (and a copy) on each first write to one -- started first,
        the workers share none of the model's or optimizer's memory."""
        if not self._finalizer.alive:
            raise RuntimeError("this VerifierPool is closed")
        while len(self._slots) < min(n or self.workers, self.workers):
            self._slots.append(self._new())
        return self

    def pids(self) -> list[int]:
        """The live workers' process ids."""
        return [s.proc.pid for s in self._slots]

    def _new(self, replacing: _Slot | None = None) -> _Slot:
        others = [s.conn for s in self._slots if s is not replacing]
        return _Slot(self._ctx, self.task, self.memory_mb, others)

    def iter(self, pairs: Iterable[tuple[Problem, str]]) -> Iterator[Verdict]:
        """One `Verdict` per pair, in completion order (``Verdict.index`` is the pair's position)."""
        if not self._finalizer.alive:
            raise RuntimeError("this VerifierPool is closed")
        pending = deque(enumerate(pairs))
        if not pending:
            return
        slots, timeout_s = self._slots, self.timeout_s
        if not slots:
            slots.append(self._new())  # more join while items wait and answers are slow (GROW_S)

        def feed(slot: _Slot) -> None:
            if pending:
                index, (problem, completion) = pending.popleft()
                slot.give(index, problem, completion)

        def replace(k: int) -> None:
            slots[k].stop(kill=True)
            slots[k] = self._new(replacing=slots[k])
            feed(slots[k])

        try:
            for slot in slots:
                feed(slot)
            while any(s.item for s in slots):
                busy = [s for s in slots if s.item]
                now = time.monotonic()
                wake = min(s.item[1] for s in busy) + timeout_s
                grow = bool(pending) and len(slots) < self.workers
                if grow:
                    wake = min(wake, now + GROW_S)
                ready = wait([s.conn for s in busy], timeout=max(0.0, wake - now))
                if grow and not ready:
                    slots.append(self._new())
                    feed(slots[-1])
                for k, slot in enumerate(slots):
                    if slot.item is None:
                        continue
                    index, started = slot.item
                    if slot.conn in ready or slot.conn.poll():
                        try:
                            got, score, error = slot.conn.recv()
                        except (EOFError, OSError):
                            slot.proc.join(timeout=1)
                            code = slot.proc.exitcode
                            replace(k)
                            yield Verdict(index, 0.0, f"verifier process died (exit code {code})")
                            continue
                        slot.item = None
                        feed(slot)
                        yield Verdict(got, score, error)
                    elif time.monotonic() - started > timeout_s:
                        replace(k)
                        yield Verdict(index, 0.0, f"timeout: verify took longer than {timeout_s:g} s")
        finally:  # left early (an error, or the caller stopped): in-flight answers would be stale
            for k in reversed(range(len(slots))):
                if slots[k].item is not None:
                    slots.pop(k).stop(kill=True)


def check_reward_errors(reward_errors: str) -> str:
    """``reward_errors`` itself, or ``ValueError`` naming the choices."""
    if reward_errors not in REWARD_ERRORS:
        raise ValueError(f"reward_errors must be one of {REWARD_ERRORS}, got {reward_errors!r}")
    return reward_errors


def rewards(task: Task, pairs: Iterable[tuple[Problem, str]], *, reward_errors: str = "raise",
            pool: VerifierPool | None = None, workers: int | None = None, timeout_s: float = 60.0,
            on_verdict: Callable[[Verdict], None] | None = None) -> Rewards:
    """Validated scores of ``task.verify`` on every (problem, completion) pair: THE reward function
    of training and evaluation. ``pool``: persistent workers to use (else a pool of ``workers``
    with ``timeout_s`` for this call); ``on_verdict``: called with each `Verdict` as it arrives
    (completion order). ``reward_errors="raise"``: after the batch, `RewardError` if any item
    failed; ``"zero"``: failed items score 0.0 and are counted."""
    check_reward_errors(reward_errors)
    pairs = list(pairs)
    own = pool is None
    if own:
        pool = VerifierPool(task, workers=workers, timeout_s=timeout_s)
    elif pool.task is not task:
        raise ValueError(f"this VerifierPool verifies task {pool.task.name!r}, not {task.name!r}")
    scores, errors = [0.0] * len(pairs), [""] * len(pairs)
    try:
        for v in pool.iter(pairs):
            scores[v.index], errors[v.index] = v.score, v.error
            if on_verdict is not None:
                on_verdict(v)
    finally:
        if own:
            pool.close()
    failed = [(pairs[i][0].id, e) for i, e in enumerate(errors) if e]
    if failed and reward_errors == "raise":
        raise RewardError(task.name, failed, len(pairs))
    return Rewards(scores, errors)


def verify_iter(task: Task, pairs: Iterable[tuple[Problem, str]], workers: int | None = None,
                timeout_s: float = 60.0, start_method: str = "fork",
                memory_mb: float | None = 4096) -> Iterator[Verdict]:
    """`VerifierPool.iter` of a pool made for this call: every verdict, errors included (it never
    raises for a verifier's failure; `rewards` applies the ``reward_errors`` policy)."""
    with VerifierPool(task, workers, timeout_s, memory_mb, start_method) as pool:
        yield from pool.iter(pairs)


def verify_all(task: Task, pairs: list[tuple[Problem, str]], workers: int | None = None,
               timeout_s: float = 60.0, reward_errors: str = "raise") -> list[float]:
    """`rewards`' scores for ``pairs``, in input order."""
    return rewards(task, pairs, reward_errors=reward_errors, workers=workers, timeout_s=timeout_s).scores
