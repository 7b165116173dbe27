"""Call ``task.verify`` on many (problem, completion) pairs in worker processes.

Why processes: math-verify bounds its work with ``signal.alarm``, which only works in a main
thread, and a verifier can hang or crash. Each worker runs ``task.verify`` in its own main
thread; the parent gives every item a wall-clock budget and, when an item overruns or its worker
dies, kills that worker, scores the item 0.0 with the reason, and starts a fresh worker.
Training rewards and `orl.eval.score` both use this, so they share one verification path.

The default start method is "fork": the task object is inherited, not pickled, so user tasks
defined anywhere work; pass ``start_method="spawn"`` for a parent with many threads.
``timeout_s`` must exceed the task's own limits (a code task's sandbox timeout), so that the
sandbox, not this pool, stops a slow program and cleans up after it.

Does not own: what a verifier does (the tasks), the sandbox (`orl.eval.sandbox`).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Iterable, Iterator

from orl.tasks.base import Problem, Task


@dataclass(frozen=True)
class Verdict:
    """The score of item ``index``; ``error`` is "" unless verify raised, timed out or crashed."""

    index: int
    score: float
    error: str = ""


def _worker(task: Task, conn) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        index, problem, completion = msg
        try:
            score, error = float(task.verify(problem, completion)), ""
        except Exception as e:  # noqa: BLE001 - a verifier bug scores 0 and is reported
            score, error = 0.0, f"error: {type(e).__name__}: {e}"
        conn.send((index, score, error))


class _Slot:
    """One worker process and the item it is working on."""

    def __init__(self, ctx, task: Task):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(task, child), daemon=True)
        self.proc.start()
        child.close()
        self.item: tuple[int, float] | None = None  # (index, start time)

    def give(self, index: int, problem: Problem, completion: str) -> None:
        self.conn.send((index, problem, completion))
        self.item = (index, time.monotonic())

    def stop(self, kill: bool = False) -> None:
        if not kill:
            try:
                self.conn.send(None)
            except (OSError, ValueError):
                kill = True
            self.proc.join(timeout=2)
        if kill or self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.conn.close()


def verify_iter(task: Task, pairs: Iterable[tuple[Problem, str]], workers: int | None = None,
                timeout_s: float = 60.0, start_method: str = "fork") -> Iterator[Verdict]:
    """Yield one `Verdict` per pair, in completion order (use ``Verdict.index`` to match)."""
    pending = deque(enumerate(pairs))
    if not pending:
        return
    ctx = mp.get_context(start_method)
    n = max(1, min(workers or os.cpu_count() or 1, len(pending)))
    slots = [_Slot(ctx, task) for _ in range(n)]

    def feed(slot: _Slot) -> None:
        if pending:
            index, (problem, completion) = pending.popleft()
            slot.give(index, problem, completion)

    try:
        for slot in slots:
            feed(slot)
        while any(s.item for s in slots):
            busy = [s for s in slots if s.item]
            deadline = min(s.item[1] for s in busy) + timeout_s
            ready = wait([s.conn for s in busy], timeout=max(0.0, deadline - time.monotonic()))
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
                        slot.stop(kill=True)
                        slots[k] = _Slot(ctx, task)
                        yield Verdict(index, 0.0, f"error: verifier process died (exit code {code})")
                        feed(slots[k])
                        continue
                    slot.item = None
                    yield Verdict(got, score, error)
                    feed(slot)
                elif time.monotonic() - started > timeout_s:
                    slot.stop(kill=True)
                    slots[k] = _Slot(ctx, task)
                    yield Verdict(index, 0.0, f"timeout: verify took longer than {timeout_s:g} s")
                    feed(slots[k])
    finally:
        for slot in slots:
            slot.stop(kill=slot.item is not None)


def verify_all(task: Task, pairs: list[tuple[Problem, str]], workers: int | None = None,
               timeout_s: float = 60.0) -> list[float]:
    """Scores for ``pairs`` in input order (errors and timeouts score 0.0)."""
    scores = [0.0] * len(pairs)
    for verdict in verify_iter(task, pairs, workers=workers, timeout_s=timeout_s):
        scores[verdict.index] = verdict.score
    return scores
