"""The server's single worker: one thread decoding admitted requests in arrival order.

Owns the bounded FIFO queue (full: `QueueFull`, the app answers 429), the `Job` channel between a
request handler's event loop and the worker thread, cancellation (a job whose client went away is
cancelled at the next block boundary, or dropped before it starts) and the counters and
arrival/start/finish order that /health reports. Knows no HTTP and no tensors: it calls
``LLM.generate`` / ``LLM.stream`` with a job's arguments.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import math
import threading
import time
import uuid
from dataclasses import dataclass, field

log = logging.getLogger("orl.serve.server")


class QueueFull(Exception):
    pass


@dataclass(eq=False)
class Job:
    """One admitted request: the LLM.generate arguments and the channel back to its handler."""

    kwargs: dict
    loop: asyncio.AbstractEventLoop
    tag: str | None = None
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)
    state: str = "queued"  # queued -> running -> done | dropped

    def emit(self, kind: str, payload=None) -> None:
        """Called from the worker thread: hand (kind, payload) to the handler's event loop."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, payload))
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass


class Scheduler:
    """One worker thread decoding jobs in arrival order; at most ``queue_size`` jobs wait.

    Records arrival, start and finish order (bounded) and counters, which /health reports and
    tests use to check FIFO service and cancellation."""

    def __init__(self, llm, queue_size: int, warmup: bool = True):
        if queue_size < 0:
            raise ValueError(f"queue_size must be >= 0, got {queue_size}")
        self.llm, self.queue_size, self._warmup = llm, queue_size, warmup
        self._cond = threading.Condition()
        self._queue: collections.deque[Job] = collections.deque()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.ready = threading.Event()  # set once the warm-up decode is done
        self.running: Job | None = None
        self.counts = collections.Counter()
        self.arrivals: collections.deque = collections.deque(maxlen=1000)
        self.starts: collections.deque = collections.deque(maxlen=1000)
        self.finished: collections.deque = collections.deque(maxlen=1000)  # (id, tag, finish, tokens)
        self._latencies: collections.deque = collections.deque(maxlen=20)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, daemon=True, name="orl-engine-worker")
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        with self._cond:
            self._stopping = True
            for job in self._queue:
                job.state = "dropped"
                job.emit("dropped")
            self._queue.clear()
            if self.running is not None:
                self.running.cancel.set()
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def waiting(self) -> int:
        with self._cond:
            return len(self._queue)

    def submit(self, job: Job) -> None:
        with self._cond:
            busy = self.running is not None
            if self._stopping or len(self._queue) + busy > self.queue_size:
                self.counts["rejected"] += 1
                raise QueueFull
            self._queue.append(job)
            self.counts["admitted"] += 1
            self.arrivals.append(job.tag or job.id)
            self._cond.notify()

    def cancel(self, job: Job) -> None:
        """Drop ``job`` if it still waits; else stop it at the next block boundary."""
        with self._cond:
            if job.state == "queued" and job in self._queue:
                self._queue.remove(job)
                job.state = "dropped"
                self.counts["dropped"] += 1
                return
        job.cancel.set()

    def retry_after(self) -> int:
        """Seconds a rejected client should wait: recent latency x jobs ahead, clamped to [1, 120]."""
        mean = sum(self._latencies) / len(self._latencies) if self._latencies else 1.0
        return int(min(max(math.ceil(mean * (self.waiting() + 1)), 1), 120))

    def _loop(self) -> None:
        if self._warmup:  # one-time setup before the first request, not inside its latency
            try:
                self.llm.warmup()
            except Exception:
                log.exception("warm-up decode failed; serving anyway")
        self.ready.set()
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                job = self._queue.popleft()
                job.state, self.running = "running", job
                self.starts.append(job.tag or job.id)
            t0 = time.perf_counter()
            try:
                kw = dict(job.kwargs)
                n = kw.pop("n", 1)
                if n > 1:  # n samples of one prompt: one batched decode, no streaming
                    gen = self.llm.generate_n(n=n, **kw, cancel=job.cancel)
                    first = gen[0]
                else:
                    gen = first = self.llm.generate(**kw, on_text=lambda d, j=job: j.emit("text", d),
                                                    cancel=job.cancel)
                self.counts["cancelled" if first.finish_reason == "cancelled" else "completed"] += 1
                self.finished.append((job.id, job.tag, first.finish_reason, first.completion_tokens))
                job.emit("done", gen)
            except Exception as e:  # a failed request must not take the worker down
                log.exception("request %s failed", job.id)
                self.counts["failed"] += 1
                self.finished.append((job.id, job.tag, "error", 0))
                job.emit("error", e)
            finally:
                self._latencies.append(time.perf_counter() - t0)
                with self._cond:
                    job.state, self.running = "done", None
