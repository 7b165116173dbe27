"""The `LLM` object: text in, text out, over one block-diffusion model and its decoding protocol.

Owns loading (a checkpoint directory or a named size with random weights), the tokenizer, the
decoding protocol of the model's family and role, and the request-level work around one decode:
prompt encoding (plain text, chat messages through the tokenizer's chat template, or token ids;
an empty prompt is an `EmptyPromptError`), length checks against the context, incremental
detokenisation as blocks commit (the text of a block is released only once it cannot change and
cannot be the start of a stop string), stop strings, cancellation at block boundaries, the
per-token log-probabilities a request may ask for (``logprobs``: each token's at the denoising
step that committed it, `_committed_logprobs`), and the per-request numbers (TPF with and without
the commit pass, forwards, latency, tokens/s).

Does not own: the denoising loop (`orl.decode`), HTTP or queueing (`orl.serve.server`), or
batching: one request decodes at a time. Every decode goes through `LLM._decode`, which picks the
decoder (``engine``): the fast runtime (`orl.engine.runtime`: static buffers, the block's rounds in
one CUDA graph) for the requests it runs -- greedy SDAR/LLaDA rules, DiffusionGemma's rule sampled
or greedy (`orl.engine.rules.CanvasRule`) -- on a CUDA device, the reference decoder (`orl.decode`) otherwise.
What "the same result" means differs by family:
  * SDAR/LLaDA: both decoders give the same tokens under greedy decoding (no random numbers).
  * DiffusionGemma draws random numbers even when greedy (the starting canvas, the re-noising), and
    the runtime draws them from its own counter RNG (`orl.decode.rng.CounterRNG`) seeded with the
    request's seed, the reference decoder from a torch.Generator seeded with it: the same seed gives
    each decoder its own reproducible text (same seed, same engine -> same text), the two texts
    differ, and their distributions are the same (up to float32 rounding of the sampler's CDF).
    Driven by the same stream (``rng=CounterRNG(seed)``), the reference decoder gives the
    runtime's tokens, rounds and forwards (tests/test_llm_dgemma_engine.py).
Stop strings, EOS, streaming and cancellation are this object's work on the blocks either decoder
hands back (``on_block``), so they behave the same whichever decoder runs. A request for
log-probabilities runs on the reference decoder (the runtime captures only a top-k, which may miss
a sampled token), traced with every step's logits; one the runtime would have run is driven by
the runtime's counter stream, so it gets the runtime's text.
"""
from __future__ import annotations

import dataclasses
import math
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from ..decode import DecodeConfig, DecodeOutput, decode, protocol
from ..decode.rng import CounterRNG, TorchRNG
from ..decode.tpf import tpf
from ..model import build_model, find_size, load_pretrained
from ..tokenizer import CHAR_VOCAB_MAX, load_tokenizer, tokenizer_for

Prompt = str | list[dict] | list[int]  # text, chat messages, or token ids
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
ENGINES = ("auto", "reference", "runtime")
MAX_LOGPROBS = 20  # alternatives per token a request may ask for (OpenAI's and vLLM's cap)


class ContextLengthError(ValueError):
    """A prompt or token budget that does not fit the context. ``param`` is "prompt" or
    "max_new_tokens": the argument the caller should change."""

    code = "context_length_exceeded"  # the server's error code

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


class EmptyPromptError(ValueError):
    """A prompt with nothing in it (no text, no token ids, messages that render to nothing): a
    block-diffusion decoder needs at least one committed token to attend to."""

    param, code = "prompt", "empty_prompt"


@dataclass
class Generation:
    text: str
    token_ids: list[int]          # completion ids before EOS / the stop string
    finish_reason: str            # "stop" (EOS or stop string), "length" or "cancelled"
    tpf: float                    # tokens per forward, counting the cache-commit pass
    tpf_no_commit: float          # ... without it (HF / DiffusionGemma count)
    forwards: int                 # model forwards of the decode, commit passes included
    forwards_no_commit: int       # ... denoising forwards only
    request_tps: float            # completion tokens / latency
    latency_s: float
    prompt_tokens: int
    completion_tokens: int
    # ``logprobs`` requests only, one entry per completion token: its log-probability under the
    # model's distribution (log-softmax of the raw logits: temperature 1, no top_p) at the
    # denoising step that committed it, and the k most probable (token id, log-probability) there
    logprobs: list[float] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None


def resolve_dtype(dtype: str | torch.dtype | None, device: str) -> torch.dtype:
    if dtype is None:
        return torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(DTYPES)}")
    return DTYPES[dtype]


class LLM:
    """One model, its tokenizer and its decoding protocol; ``generate`` and ``stream`` on text.

    ``model``: a checkpoint directory (tokenizer read from it when it holds tokenizer files)
    or a named size ("sdar/tiny", "qwen3-4b") built with random weights (seed 0).
    ``decode_overrides``: DecodeConfig fields replacing the protocol's (e.g. threshold=0.8).
    ``engine``: "auto" (the runtime on CUDA for the requests it supports, else the reference
    decoder), "reference", or "runtime" (always, falling back only for requests it cannot run;
    on the CPU it runs eagerly -- a check, not a speed-up). The runtime keeps its own baked copy of
    the weights (one more copy of the model in memory) and a static KV cache of ``engine_max_len``.
    For DiffusionGemma the engine is part of what a seed means (module docstring): the runtime and
    the reference decoder sample different texts for the same seed, unless ``rng="counter"``: then
    the reference decoder draws the runtime's counter stream (`orl.decode.rng.CounterRNG`) for the
    request's seed and both decoders give the same text ("torch", the default: torch.Generator).
    """

    def __init__(self, model: str, role: str = "base", device: str = "cpu",
                 dtype: str | torch.dtype | None = None, tokenizer=None, engine: str = "auto",
                 engine_max_len: int = 4096, rng: str = "torch", **decode_overrides):
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
        if rng not in ("torch", "counter"):
            raise ValueError(f"rng must be 'torch' (torch.Generator) or 'counter' (the runtime's stream), got {rng!r}")
        self.rng = rng
        self.engine, self.engine_max_len, self._runtime = engine, engine_max_len, None
        self._runtimes: dict = {}  # batch size -> Runtime (``_runtime`` is the batch-1 one)
        self.name = model
        self.device = device
        dt = resolve_dtype(dtype, device)
        if os.path.isdir(model):
            self.model = load_pretrained(model, dtype=dt, device=device)
            if tokenizer is None:
                has_files = any(os.path.exists(os.path.join(model, f)) for f in TOKENIZER_FILES)
                mc = self.model.config  # no tokenizer files: the bundled one that fits, or a clear error
                mask = mc.mask_token_id if mc.noise == "mask" else None
                tokenizer = model if has_files else tokenizer_for(mc.vocab_size, mask)
            self.tokenizer = load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
        else:
            try:
                cfg = find_size(model)
            except ValueError as e:
                raise ValueError(f"model {model!r} is neither a checkpoint directory nor a named size: {e}") \
                    from None
            if tokenizer is None:  # the bundled tokenizer of the size's vocabulary and mask id, or a clear error
                tokenizer = tokenizer_for(cfg.vocab_size, cfg.mask_token_id if cfg.noise == "mask" else None)
            self.tokenizer = load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
            if cfg.vocab_size < CHAR_VOCAB_MAX:  # a tiny size: random weights sized to the tokenizer
                over = {"vocab_size": len(self.tokenizer)}
                if cfg.noise == "mask":
                    over["mask_token_id"] = self.tokenizer.mask_token_id
                cfg = dataclasses.replace(cfg, **over)
            with torch.random.fork_rng(devices=[]):  # seeded init must not reseed the caller's RNG
                self.model = build_model(cfg, seed=0, dtype=dt, device=device)
        self.model.eval()
        cfg = self.model.config
        if len(self.tokenizer) > cfg.vocab_size:
            raise ValueError(f"the tokenizer has {len(self.tokenizer)} tokens but the model's vocabulary is "
                             f"{cfg.vocab_size}; pass the tokenizer these weights were trained with")
        tok_mask = getattr(self.tokenizer, "mask_token_id", None)
        if cfg.noise == "mask" and tok_mask is not None and tok_mask != cfg.mask_token_id:
            raise ValueError(f"the tokenizer's mask id {tok_mask} differs from the model's mask_token_id "
                             f"{cfg.mask_token_id}; pass the tokenizer these weights were trained with")
        self.decode_config: DecodeConfig = protocol(cfg.family, role, **{"block_size": cfg.block_size,
                                                                          **decode_overrides})
        self.role = role
        self.eos_ids = sorted({i for i in (self.tokenizer.eos_token_id, self.tokenizer.pad_token_id)
                               if i is not None})
        # Fast tokenizers are not safe to call from two threads at once ("Already borrowed").
        self._tok_lock = threading.Lock()

    # ------------------------------------------------------------------ facts
    @property
    def context_length(self) -> int:
        return self.model.config.max_position

    @property
    def block_size(self) -> int:
        return self.decode_config.block_size

    # ------------------------------------------------------------------ prompts and lengths
    def tokenize(self, prompt: Prompt, *, add_special_tokens: bool = False,
                 add_generation_prompt: bool = True) -> list[int]:
        """The ids of ``prompt`` as given: text, chat messages rendered with the tokenizer's chat
        template (``add_generation_prompt``: the assistant's opening after them), or token ids
        (checked against the vocabulary). Generation never adds special tokens; ``/tokenize`` may ask
        for them. No length or emptiness checks (`encode` makes those)."""
        if isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt):
            if not getattr(self.tokenizer, "chat_template", None):
                raise ValueError("this tokenizer has no chat template; send a plain text prompt instead")
            try:
                with self._tok_lock:
                    text = self.tokenizer.apply_chat_template(prompt, add_generation_prompt=add_generation_prompt,
                                                              tokenize=False)
            except Exception as e:  # jinja errors of a template that rejects these messages
                raise ValueError(f"the chat template cannot render these messages: {e}") from None
        elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            V = self.model.config.vocab_size
            for i, t in enumerate(prompt):
                if not 0 <= t < V:
                    raise ValueError(f"prompt token id {t} (position {i}) is outside the vocabulary [0, {V})")
            return list(prompt)
        elif isinstance(prompt, str):
            text = prompt
        else:
            raise ValueError("prompt must be a string, a list of message dicts or a list of token ids, got "
                             f"{type(prompt).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"the prompt is not valid Unicode text ({e.reason} at character {e.start})") from None
        with self._tok_lock:
            return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def encode(self, prompt: Prompt) -> list[int]:
        """Prompt ids as generation uses them (`tokenize`); an empty prompt is an `EmptyPromptError`."""
        ids = self.tokenize(prompt)
        if ids:
            return ids
        if isinstance(prompt, str) and prompt:  # text the tokenizer maps to no token at all
            if self.tokenizer.bos_token_id is None:
                raise EmptyPromptError(f"the prompt {prompt[:40]!r} encodes to no tokens; send other text")
            return [self.tokenizer.bos_token_id]
        if isinstance(prompt, str):
            raise EmptyPromptError("the prompt is empty; send some text (or token ids)")
        if prompt:
            raise EmptyPromptError("the messages render to an empty prompt (every content is empty and the chat "
                                   "template adds nothing); send some text")
        raise EmptyPromptError("the prompt is empty (no messages, no token ids); send at least one")

    def detokenize(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        """The text of ``ids`` (special tokens kept unless ``skip_special_tokens``: a round trip of `tokenize`)."""
        V = self.model.config.vocab_size
        for i, t in enumerate(ids):
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < V:
                raise ValueError(f"token id {t!r} (position {i}) is outside the vocabulary [0, {V})")
        with self._tok_lock:
            return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_strings(self, ids: list[int]) -> list[str]:
        """Each id's own text (special tokens spelt out), as log-probabilities name the tokens."""
        with self._tok_lock:
            return [self.tokenizer.decode([t], skip_special_tokens=False) for t in ids]

    def token_pieces(self, ids: list[int]) -> list[str]:
        """Each id's vocabulary entry (e.g. byte-level BPE's 'Ġhello'), as vLLM's /tokenize reports them."""
        with self._tok_lock:
            return [str(p) for p in self.tokenizer.convert_ids_to_tokens(ids)]

    def count_tokens(self, prompt: Prompt) -> int:
        return len(self.encode(prompt))

    def max_new_tokens_fit(self, n_prompt: int) -> int:
        """The largest token budget that fits after ``n_prompt`` tokens (whole blocks)."""
        K = self.block_size
        return max((self.context_length - n_prompt) // K * K, 0)

    def check_lengths(self, n_prompt: int, max_new_tokens: int) -> None:
        """Raise ContextLengthError unless the prompt and ``max_new_tokens`` (rounded up to whole
        blocks, as the decoder allocates them) fit the context."""
        C, K = self.context_length, self.block_size
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ContextLengthError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}",
                                     "max_new_tokens")
        if n_prompt + K > C:
            raise ContextLengthError(f"the prompt has {n_prompt} tokens but the model context is {C} tokens, "
                                     f"and at least one block of {K} must fit after it; shorten the prompt",
                                     "prompt")
        rounded = math.ceil(max_new_tokens / K) * K
        if n_prompt + rounded > C:
            raise ContextLengthError(
                f"the prompt ({n_prompt} tokens) + max_new_tokens {max_new_tokens} (rounded up to whole blocks "
                f"of {K}: {rounded}) = {n_prompt + rounded} exceeds the model context of {C} tokens; lower "
                f"max_new_tokens to at most {self.max_new_tokens_fit(n_prompt)} or shorten the prompt",
                "max_new_tokens")

    def warmup(self) -> None:
        """Decode one block once, so one-time setup (kernel selection, allocations) is not billed
        to the first request's latency."""
        self.generate(self.tokenizer.decode([self.eos_ids[0]]) if self.eos_ids else " ",
                      max_new_tokens=1, ignore_eos=True)

    def _text(self, ids: list[int]) -> str:
        with self._tok_lock:
            return self.tokenizer.decode(ids, skip_special_tokens=True)

    # ------------------------------------------------------------------ decoding
    def uses_runtime(self, cfg: DecodeConfig, n_prompt: int) -> bool:
        """Whether a request with ``cfg`` goes to the fast runtime (see ``engine``): the model's
        block size, prompt + budget (whole blocks) + one block within ``engine_max_len``, and
        SDAR/LLaDA: a threshold/topk/llada rule, greedy or sampled (in the graph, from the counter
        RNG); DiffusionGemma: rule "dgemma", sampled or greedy, on a model of the shape `CanvasRule`
        is built for (`_dgemma_runtime_fits`).
        Stop strings, EOS, streaming, cancellation and seeds never decide (module docstring)."""
        if self.engine == "reference" or (self.engine == "auto" and not str(self.device).startswith("cuda")):
            return False
        mcfg = self.model.config
        n = n_prompt + math.ceil(cfg.max_new_tokens / cfg.block_size) * cfg.block_size + cfg.block_size
        if cfg.block_size != mcfg.block_size or n > self.engine_max_len:
            return False
        if mcfg.noise == "uniform":
            # the counter RNG samples inside the loop, so temperature does not matter here
            return cfg.rule == "dgemma" and _dgemma_runtime_fits(mcfg)
        return mcfg.noise == "mask" and cfg.rule in ("threshold", "topk", "llada")

    def _decode(self, prompt_ids: list[int], cfg: DecodeConfig, eos_ids: list[int], seed: int | None,
                on_block: Callable, rows: int = 1, trace_logits: bool = False) -> DecodeOutput:
        """The one call into a decoder: the runtime when `uses_runtime`, else the reference decoder,
        for ``rows`` samples of the prompt (one launch per block for all of them on the runtime).
        ``seed`` None: fresh random numbers from torch's global RNG (so torch.manual_seed still
        makes an unseeded sampled request reproducible, with either decoder); on the counter stream
        row r draws from seed + r. ``trace_logits`` (log-probability requests): the reference
        decoder with every step's logits in the output's trace; a request the runtime would run is
        driven by the runtime's counter stream, so its text is the runtime's (module docstring)."""
        prompt = torch.tensor([prompt_ids], dtype=torch.long, device=self.device)
        with torch.inference_mode():
            runtime = self.uses_runtime(cfg, len(prompt_ids))
            if runtime and not trace_logits:
                rt = self._runtimes.get(rows)
                if rt is None:  # one runtime per batch size, kept (graphs and cache are per shape)
                    from ..engine.runtime import Runtime  # noqa: PLC0415 - only when used
                    rt = self._runtimes[rows] = Runtime(self.model, cfg.block_size, max_len=self.engine_max_len,
                                                        batch=rows)
                    if rows == 1:
                        self._runtime = rt
                return rt.decode(prompt, cfg, eos_ids=eos_ids, on_block=on_block, seed=_counter_seed(seed, rows))
            if self.rng == "counter" or runtime:
                rng = CounterRNG(_counter_seed(seed, rows))
            else:
                rng = TorchRNG(torch.Generator().manual_seed(seed) if seed is not None else None)
            return decode(self.model, prompt.expand(rows, -1), cfg, eos_ids=eos_ids, rng=rng, on_block=on_block,
                          trace=trace_logits, trace_logits=trace_logits)

    def _request(self, prompt, max_new_tokens: int, temperature, stop, ignore_eos: bool, top_p=None,
                 logprobs: int | None = None):
        """(prompt ids, DecodeConfig, EOS ids, stop strings) of one request, validated (``top_p``
        None: the protocol's)."""
        if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int)
                                     or not 0 <= logprobs <= MAX_LOGPROBS):
            raise ValueError(f"logprobs must be an integer in [0, {MAX_LOGPROBS}] or None, got {logprobs!r}")
        ids = self.encode(prompt)
        self.check_lengths(len(ids), max_new_tokens)
        if temperature is None:
            temperature = self.decode_config.temperature
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if any(not isinstance(s, str) or not s for s in stops):
            raise ValueError(f"stop must be a non-empty string or a list of them, got {stop!r}")
        cfg = dataclasses.replace(self.decode_config, max_new_tokens=max_new_tokens, temperature=temperature,
                                  **({} if top_p is None else {"top_p": top_p}))
        return ids, cfg, ([] if ignore_eos else self.eos_ids), stops

    def _timed_decode(self, ids, cfg: DecodeConfig, eos, seed, on_block, rows: int, logprobs: int | None = None):
        """`_decode` and its wall time; greedy decoding without a seed uses seed 0. ``logprobs`` (k):
        also each row's `_committed_logprobs` (None: not asked for)."""
        if seed is None and cfg.temperature == 0:
            seed = 0
        t0 = time.perf_counter()
        out = self._decode(ids, cfg, eos, seed, on_block, rows=rows, trace_logits=logprobs is not None)
        lps = None
        if logprobs is not None:
            lps = _committed_logprobs(out, min(logprobs, self.model.config.vocab_size))
            out.trace = []  # the logits of every step: let them go now
        return out, time.perf_counter() - t0, lps

    def generate(self, prompt: Prompt, max_new_tokens: int = 256, temperature: float | None = 0.0,
                 stop: str | list[str] | None = None, seed: int | None = None, *, ignore_eos: bool = False,
                 on_text: Callable[[str], object] | None = None,
                 cancel: threading.Event | None = None, top_p: float | None = None,
                 logprobs: int | None = None) -> Generation:
        """Decode one prompt (text or chat messages). ``temperature=None`` keeps the protocol's;
        greedy decoding without a ``seed`` uses seed 0, so it is deterministic for every family
        (DiffusionGemma draws its starting canvas at random even when greedy; its text for a seed
        depends on the decoder, see the module docstring).
        ``ignore_eos`` decodes the whole budget (benchmarks). ``on_text(delta)`` receives text as
        blocks commit (returning False cancels); ``cancel``, set by another thread, stops the
        decode at the next block boundary. ``top_p`` (sampling, mask rules): the nucleus; None: the protocol's.
        ``logprobs`` k (0..20): the Generation's ``logprobs`` and ``top_logprobs`` (k per token); the
        decode then runs on the reference decoder holding each step's logits (K x V floats a step)."""
        ids, cfg, eos, stops = self._request(prompt, max_new_tokens, temperature, stop, ignore_eos, top_p, logprobs)
        text = _IncrementalText(self._text, max_new_tokens, eos, stops)
        flags = {"cancelled": False}

        def emit(delta: str) -> None:
            if delta and on_text is not None and on_text(delta) is False:
                flags["cancelled"] = True

        def on_block(b: int, canvas: torch.Tensor) -> bool:
            emit(text.add(canvas[0].tolist()))
            if cancel is not None and cancel.is_set():
                flags["cancelled"] = True
            return not (flags["cancelled"] or text.stopped or text.full)

        out, latency, lps = self._timed_decode(ids, cfg, eos, seed, on_block, 1, logprobs)
        emit(text.flush())
        return _generation(text, out, 0, flags["cancelled"], latency, len(ids), lps)

    def generate_n(self, prompt: Prompt, n: int, max_new_tokens: int = 256, temperature: float | None = 0.0,
                   stop: str | list[str] | None = None, seed: int | None = None, *, ignore_eos: bool = False,
                   cancel: threading.Event | None = None, top_p: float | None = None,
                   logprobs: int | None = None) -> list[Generation]:
        """``n`` samples of one prompt in one decode (OpenAI's ``n``): the runtime decodes the n rows
        in one launch per block (prefilling the prompt once), the reference decoder as n rows. Each
        sample has its own stop strings, EOS and finish reason; forwards and TPF are per sample,
        latency the decode's. ``cancel`` stops all of them at the next block boundary. ``logprobs``
        as in `generate`, per sample."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive integer, got {n!r}")
        ids, cfg, eos, stops = self._request(prompt, max_new_tokens, temperature, stop, ignore_eos, top_p, logprobs)
        texts = [_IncrementalText(self._text, max_new_tokens, eos, stops) for _ in range(n)]
        flags = {"cancelled": False}

        def on_block(b: int, canvas: torch.Tensor) -> bool:
            for r, t in enumerate(texts):
                t.add(canvas[r].tolist())
            if cancel is not None and cancel.is_set():
                flags["cancelled"] = True
            return not (flags["cancelled"] or all(t.stopped or t.full for t in texts))

        out, latency, lps = self._timed_decode(ids, cfg, eos, seed, on_block, n, logprobs)
        for t in texts:
            t.flush()
        return [_generation(t, out, r, flags["cancelled"], latency, len(ids), lps) for r, t in enumerate(texts)]

    def stream(self, prompt: Prompt, max_new_tokens: int = 256, temperature: float | None = 0.0,
               stop: str | list[str] | None = None, seed: int | None = None, *,
               ignore_eos: bool = False, top_p: float | None = None) -> "Stream":
        """Text increments as blocks commit. Iterate it; ``.result`` is the Generation once done;
        ``.close()`` (or leaving a ``with`` block early) cancels at the next block boundary."""
        self.check_lengths(self.count_tokens(prompt), max_new_tokens)  # fail here, not in the thread
        return Stream(self, dict(prompt=prompt, max_new_tokens=max_new_tokens, temperature=temperature,
                                 stop=stop, seed=seed, ignore_eos=ignore_eos, top_p=top_p))


def _generation(text: "_IncrementalText", out: DecodeOutput, r: int, cancelled: bool, latency: float,
                n_prompt: int, lps: tuple | None = None) -> Generation:
    """Row ``r`` of a decode as a `Generation`: its text (stop strings cut), finish reason, forwards
    and TPF (`orl.decode.tpf`), the decode's latency, and (``lps``: `_committed_logprobs`) the
    log-probabilities of its completion tokens (a prefix of the row's blocks)."""
    if text.stopped or text.hit_eos:
        finish = "stop"
    elif cancelled and out.finish_reason[r] == "cancelled" and not text.full:
        finish = "cancelled"
    else:
        finish = "length"
    completion = text.completion_ids()
    f, fnc = out.forwards(r, True), out.forwards(r, False)
    lp = top = None
    if lps is not None:
        lp, top = lps[0][r][:len(completion)], lps[1][r][:len(completion)]
    return Generation(text=text.text, token_ids=completion, finish_reason=finish,
                      tpf=tpf(len(out.tokens[r]), f) or 0.0, tpf_no_commit=tpf(len(out.tokens[r]), fnc) or 0.0,
                      forwards=f, forwards_no_commit=fnc, request_tps=len(completion) / max(latency, 1e-9),
                      latency_s=latency, prompt_tokens=n_prompt, completion_tokens=len(completion),
                      logprobs=lp, top_logprobs=top)


def _committed_logprobs(out: DecodeOutput, k: int) -> tuple[list[list[float]], list[list[list[tuple[int, float]]]]]:
    """Per row of a decode traced with logits: for each token of its blocks (``block_tokens``), the
    log-probability the model gave it at the denoising step that last wrote it -- the step that
    committed it; for LLaDA's editing the step of the last edit, for DiffusionGemma the step that
    stopped the block -- as log-softmax of that step's raw logits (temperature 1, before top_p:
    the model's distribution, not the sampler's), and the k most probable (id, log p) at that step.
    A position no step committed (a rule that ran out of steps) gets NaN and no alternatives.
    Shapes: the trace's logits (B, K, V) and committed (B, K) per step."""
    K, B = out.block_size, len(out.block_tokens)
    lps: list[list[float]] = [[] for _ in range(B)]
    tops: list[list[list[tuple[int, float]]]] = [[] for _ in range(B)]
    by_block: dict[int, list] = {}
    for rec in out.trace:
        by_block.setdefault(rec.block, []).append(rec)
    for b in sorted(by_block):
        rows = [r for r in range(B) if len(out.block_tokens[r]) >= (b + 1) * K]
        if not rows:
            continue
        recs = by_block[b]
        dev = recs[0].logits.device
        sel = torch.tensor(rows, device=dev)
        tok = torch.tensor([out.block_tokens[r][b * K:(b + 1) * K] for r in rows], device=dev)  # (R, K)
        val = torch.full(tok.shape, float("nan"), device=dev)
        top_v = torch.zeros(*tok.shape, k, device=dev)
        top_i = torch.full((*tok.shape, k), -1, dtype=torch.long, device=dev)
        for rec in recs:
            lsm = torch.log_softmax(rec.logits[sel].float(), -1)            # (R, K, V)
            c = rec.committed[sel]                                          # (R, K)
            val = torch.where(c, lsm.gather(-1, tok[..., None]).squeeze(-1), val)
            if k:
                v, i = lsm.topk(k, -1)
                top_v, top_i = torch.where(c[..., None], v, top_v), torch.where(c[..., None], i, top_i)
        val, top_v, top_i = val.cpu().tolist(), top_v.cpu().tolist(), top_i.cpu().tolist()
        for j, r in enumerate(rows):
            lps[r] += val[j]
            tops[r] += [[(i, v) for i, v in zip(ids, vs) if i >= 0] for ids, vs in zip(top_i[j], top_v[j])]
    return lps, tops


def _dgemma_runtime_fits(mcfg) -> bool:
    """Whether the runtime's `orl.engine.rules.CanvasRule` decodes this uniform-noise model as the reference
    decoder does: it hard-wires DiffusionGemma's layout (committed text causal) and its
    self-conditioning input on every canvas position (no "rcd" pathway, no unresolved-only rows)."""
    return mcfg.clean_attention == "causal" and (mcfg.pathway == "none" or
                                                 (mcfg.pathway == "mlp" and mcfg.pathway_where == "canvas"))


def _counter_seed(seed: int | None, rows: int = 1) -> int:
    """The DiffusionGemma runtime's counter-RNG seed for a request seed: requests may carry any
    64-bit seed (the server accepts -2^63 .. 2^64 - 1, as torch.Generator does), the runtime takes
    [0, 2^62) and hashes only the low 32 bits of it, so seeds equal mod 2^32 sample the same text.
    None: drawn from torch's global RNG, as the reference decoder draws without a generator."""
    if seed is None:
        return int(torch.randint((1 << 62) - rows, (1,)))
    return seed % ((1 << 62) - rows)  # rows seed .. seed + rows - 1 stay in range


_DONE = object()


class Stream:
    """Runs ``LLM.generate`` in a worker thread and yields its text increments.

    The thread holds no reference to this object, so dropping an unfinished stream also
    cancels it (its iterator's cleanup sets the cancel flag and joins the thread)."""

    def __init__(self, llm: LLM, kwargs: dict):
        self._cancel = threading.Event()
        self._box: dict = {}
        q: queue.Queue = queue.Queue()
        cancel, box = self._cancel, self._box

        def work() -> None:
            try:
                box["result"] = llm.generate(**kwargs, on_text=q.put, cancel=cancel)
            except BaseException as e:  # re-raised in the consuming thread
                box["error"] = e
            finally:
                q.put(_DONE)

        self._thread = threading.Thread(target=work, daemon=True, name="orl-llm-stream")
        self._thread.start()
        self._iter = _drain(q, cancel, self._thread, box)

    @property
    def result(self) -> Generation | None:
        """The finished Generation (None until the stream is exhausted or closed)."""
        return self._box.get("result")

    def __iter__(self) -> "Stream":
        return self

    def __next__(self) -> str:
        return next(self._iter)

    def cancel(self) -> None:
        """Stop decoding at the next block boundary; iteration then ends."""
        self._cancel.set()

    def close(self) -> None:
        self._cancel.set()
        self._iter.close()
        self._thread.join()

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _drain(q: queue.Queue, cancel: threading.Event, thread: threading.Thread, box: dict) -> Iterator[str]:
    try:
        while (item := q.get()) is not _DONE:
            yield item
    finally:
        cancel.set()
        thread.join()
    if "error" in box:
        raise box["error"]


class _IncrementalText:
    """Completion text as blocks arrive: cut at the token budget, EOS and the first stop string.

    ``add`` returns the newly safe text: held back are a trailing U+FFFD (half of a multi-byte
    character split across blocks) and any suffix that could begin a stop string."""

    def __init__(self, detok: Callable[[list[int]], str], max_new_tokens: int, eos_ids: list[int],
                 stops: list[str]):
        self.detok, self.max_new, self.eos, self.stops = detok, max_new_tokens, set(eos_ids), stops
        self.ids: list[int] = []
        self.text = ""
        self.emitted = 0
        self.hit_eos = self.stopped = False
        self._stop_at: int | None = None  # char index where the first stop string begins

    @property
    def full(self) -> bool:
        return self.hit_eos or len(self.ids) >= self.max_new

    def add(self, block_ids: list[int]) -> str:
        if self.full or self.stopped:
            return ""
        for t in block_ids[:self.max_new - len(self.ids)]:
            if t in self.eos:
                self.hit_eos = True
                break
            self.ids.append(t)
        self.text = self.detok(self.ids)
        self._find_stop()
        return self._release(final=False)

    def flush(self) -> str:
        return self._release(final=True)

    def _find_stop(self) -> None:
        hits = [i for i in (self.text.find(s, max(self.emitted - len(s), 0)) for s in self.stops) if i >= 0]
        if hits:
            self._stop_at = min(hits)
            self.text = self.text[:self._stop_at]
            self.stopped = True

    def _release(self, final: bool) -> str:
        end = len(self.text)
        if not final and not self.stopped:
            while end > self.emitted and self.text[end - 1] == "\ufffd":
                end -= 1
            hold = end
            for s in self.stops:  # longest suffix of text[:end] that is a proper prefix of a stop string
                for k in range(min(len(s) - 1, end - self.emitted), 0, -1):
                    if self.text.endswith(s[:k], 0, end):
                        hold = min(hold, end - k)
                        break
            end = hold
        if end <= self.emitted:
            return ""
        delta, self.emitted = self.text[self.emitted:end], end
        return delta

    def completion_ids(self) -> list[int]:
        """Ids before EOS; with a stop string, the shortest prefix whose text reaches it."""
        if not self.stopped:
            return list(self.ids)
        lo, hi = 0, len(self.ids)
        while lo < hi:  # smallest m with len(text(ids[:m])) >= stop position
            mid = (lo + hi) // 2
            if len(self.detok(self.ids[:mid])) >= self._stop_at:
                hi = mid
            else:
                lo = mid + 1
        return self.ids[:lo]
