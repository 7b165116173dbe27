"""The server's single worker: one thread decoding admitted requests in arrival order.

Owns the bounded FIFO queue (full: `QueueFull`, the app answers 429), the `Job` channel between a
request handler's event loop and the worker thread, cancellation (a job whose client went away is
cancelled at the next block boundary, or dropped before it starts) and the counters and
arrival/start/finish order that /health reports, and the serving metrics /metrics renders as
Prometheus text (`Metrics`: requests by endpoint and status, latency, tokens, TPF, tokens/s).
Knows no HTTP and no tensors: it calls ``LLM.generate`` / ``LLM.generate_n`` with a job's
arguments, once per prompt of the job.
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
    """One admitted request: its ``prompts`` and ``n`` samples of each, the other LLM.generate
    arguments, and the channel back to its handler (``done`` carries the list of Generations,
    prompt-major)."""

    kwargs: dict
    loop: asyncio.AbstractEventLoop
    prompts: list = field(default_factory=list)
    n: int = 1
    tag: str | None = None
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)
    state: str = "queued"  # queued -> running -> done | dropped
    submitted: float = 0.0  # perf_counter at admission (latency counts the queue wait)

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
        self.metrics = Metrics()

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
            job.submitted = time.perf_counter()
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
                gens = []
                for prompt in job.prompts:  # a cancelled job's later prompts stop at their first block
                    if job.n > 1:  # n samples of one prompt: one batched decode, no streaming
                        gens += self.llm.generate_n(prompt, n=job.n, **job.kwargs, cancel=job.cancel)
                    else:
                        gens.append(self.llm.generate(prompt, **job.kwargs, cancel=job.cancel,
                                                      on_text=lambda d, j=job: j.emit("text", d)))
                cancelled = any(g.finish_reason == "cancelled" for g in gens)
                self.counts["cancelled" if cancelled else "completed"] += 1
                self.finished.append((job.id, job.tag, "cancelled" if cancelled else gens[0].finish_reason,
                                      sum(g.completion_tokens for g in gens)))
                t1 = time.perf_counter()
                self.metrics.served(gens, job.n, t1 - job.submitted, t1 - t0)
                job.emit("done", gens)
            except Exception as e:  # a failed request must not take the worker down
                log.exception("request %s failed", job.id)
                self.counts["failed"] += 1
                self.finished.append((job.id, job.tag, "error", 0))
                job.emit("error", e)
            finally:
                self._latencies.append(time.perf_counter() - t0)
                with self._cond:
                    job.state, self.running = "done", None


# Upper bounds (s) of the latency histogram's buckets: a one-block tiny decode to a long queue wait.
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class Metrics:
    """What /metrics reports, counted since the server started (thread-safe: the worker and the
    event loop both write). `prometheus` renders them in Prometheus' text format 0.0.4.

    Generation requests (admitted and served, one per job) feed the latency histogram (admission
    to the last token: queue wait included), the token counters, the decode time and TPF (the
    decoded tokens over the model forwards of every sample, cache-commit passes counted and not);
    every HTTP response the app sends feeds the request counter by endpoint and status."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.http: collections.Counter = collections.Counter()   # (endpoint, status) -> responses
        self.buckets = [0] * (len(LATENCY_BUCKETS) + 1)          # the last one is +Inf
        self.latency_sum = 0.0
        self.served_requests = 0
        self.prompt_tokens = self.completion_tokens = self.decoded_tokens = 0
        self.forwards = self.forwards_no_commit = 0
        self.decode_s = 0.0

    def response(self, endpoint: str, status: int) -> None:
        with self._lock:
            self.http[(endpoint, status)] += 1

    def served(self, gens: list, n: int, latency_s: float, decode_s: float) -> None:
        """One generation request: its Generations (``n`` per prompt), latency and decode time."""
        with self._lock:
            self.served_requests += 1
            self.latency_sum += latency_s
            self.buckets[next((i for i, b in enumerate(LATENCY_BUCKETS) if latency_s <= b), len(LATENCY_BUCKETS))] += 1
            self.prompt_tokens += sum(g.prompt_tokens for g in gens[::n])
            self.completion_tokens += sum(g.completion_tokens for g in gens)
            self.decoded_tokens += sum(round(g.tpf * g.forwards) for g in gens)  # TPF's numerator
            self.forwards += sum(g.forwards for g in gens)
            self.forwards_no_commit += sum(g.forwards_no_commit for g in gens)
            self.decode_s += decode_s

    def prometheus(self, scheduler: "Scheduler") -> str:
        """The exposition text: counters ``_total``, one histogram, gauges for the ratios and the queue."""
        out: list[str] = []

        def metric(name: str, kind: str, doc: str, samples: list[tuple[str, float]]) -> None:
            out.extend([f"# HELP {name} {doc}", f"# TYPE {name} {kind}"])
            out.extend(f"{name}{labels} {_num(v)}" for labels, v in samples)

        with self._lock:
            http = sorted(self.http.items())
            metric("orl_http_requests_total", "counter", "HTTP responses of the app by endpoint and status code.",
                   [(f'{{endpoint="{e}",status="{s}"}}', c) for (e, s), c in http])
            counts = dict(scheduler.counts)
            metric("orl_scheduler_requests_total", "counter", "Generation requests by what the queue did with "
                   "them (admitted, rejected: queue full, completed, cancelled, dropped: gone while queued, failed).",
                   [(f'{{outcome="{k}"}}', counts.get(k, 0))
                    for k in ("admitted", "rejected", "completed", "cancelled", "dropped", "failed")])
            cum, hist = 0, []
            for b, c in zip((*LATENCY_BUCKETS, math.inf), self.buckets):
                cum += c
                hist.append((f'_bucket{{le="{"+Inf" if b == math.inf else _num(b)}"}}', cum))
            hist += [("_sum", self.latency_sum), ("_count", self.served_requests)]
            name = "orl_request_latency_seconds"
            out.extend([f"# HELP {name} Generation request latency, admission to the last token (queue wait "
                        "included).", f"# TYPE {name} histogram"])
            out.extend(f"{name}{suffix} {_num(v)}" for suffix, v in hist)
            for name, v, doc in (
                    ("orl_prompt_tokens_total", self.prompt_tokens, "Prompt tokens of served requests."),
                    ("orl_completion_tokens_total", self.completion_tokens,
                     "Completion tokens returned (before EOS or the stop string)."),
                    ("orl_decoded_tokens_total", self.decoded_tokens, "Tokens decoded (TPF's numerator)."),
                    ("orl_model_forwards_total", self.forwards, "Model forwards, cache-commit passes included."),
                    ("orl_model_forwards_no_commit_total", self.forwards_no_commit, "Denoising forwards only."),
                    ("orl_decode_seconds_total", self.decode_s, "Seconds the decoder spent on requests.")):
                metric(name, "counter", doc, [("", v)])
            for name, v, doc in (
                    ("orl_tokens_per_forward", self.decoded_tokens / self.forwards if self.forwards else 0.0,
                     "TPF over every served sample: decoded tokens / forwards (commit passes counted)."),
                    ("orl_tokens_per_forward_no_commit",
                     self.decoded_tokens / self.forwards_no_commit if self.forwards_no_commit else 0.0,
                     "TPF without the commit passes (the HF / DiffusionGemma count)."),
                    ("orl_tokens_per_second", self.completion_tokens / self.decode_s if self.decode_s else 0.0,
                     "Completion tokens / decode seconds over every served request."),
                    ("orl_requests_running", int(scheduler.running is not None), "Requests decoding now."),
                    ("orl_requests_waiting", scheduler.waiting(), "Requests waiting in the queue.")):
                metric(name, "gauge", doc, [("", v)])
        return "\n".join(out) + "\n"


def _num(v: float) -> str:
    """A sample value as Prometheus writes it (integers without a fraction)."""
    return str(int(v)) if float(v).is_integer() else repr(float(v))
