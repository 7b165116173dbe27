"""One ORL step at a real shape on one GPU, with the co-designed parts on and off, in one run.

    python benchmarks/train_step.py --out DIR [--family sdar] [--prompts 8] [--group 16] [--new-tokens 256]
                                    [--rows full,no-runtime,no-packing,dense,no-balance,all-off] [--row-limit S]

The QwenDLM-4B shape (Qwen3-4B with the residual pathway, block 32; ``--family llada``: the
LLaDA-2.1-mini width with ``--layers`` layers, for the MoE path), random float32 master weights
built on the GPU, a task whose every rollout verifies (so every rollout supervises), ``--prompts``
prompts of 128 random token ids (from the lower half of the vocabulary) x ``--group`` rollouts x ``--new-tokens`` tokens, no EOS (every
rollout runs to its length), sampled at temperature 1 with a threshold that never fires (2
tokens a round, as `benchmarks/rollout.py`). One warm-up step (graph capture, compilation), then
one measured step per row, each with `orl.train.loop.ORLTrainer` on the same model:

  full        rollouts through the runtime (bf16, G rows per launch, capture in the graph), packed
              replay, the staircase mask as a FlexAttention BlockMask, cost-balanced rows
  no-runtime  ... the eager reference decoder for the rollouts (the float32 policy, TF32 matmuls)
  no-packing  ... per-state replay rows [prompt | clean < b | state]
  dense       ... the dense (B, T, T) mask through SDPA
  no-balance  ... rows filled in order
  all-off     all four off
  triton      ``full`` with `orl.kernels.staircase` instead of FlexAttention (when asked for)

Every row keeps the memory settings (bf16 autocast with float32 master weights and AdamW state,
activation checkpointing per layer, a bf16 frozen anchor, the LM head at the states' tokens,
micro-batches of ``--micro`` tokens): they are what makes the step fit, not what makes it fast.
Printed per row: the time split (rollouts + capture, replay forward + backward, optimizer), the
step time, its ratio to ``full``, peak GPU memory, rollout and training tokens/s. Writes
DIR/train_step_results.md.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import os
import random
import signal
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from orl.decode import DecodeConfig  # noqa: E402
from orl.model import build_model, get_config  # noqa: E402
from orl.tasks import Problem  # noqa: E402
from orl.train.losses import LossConfig  # noqa: E402
from orl.train.loop import ORLConfig, ORLTrainer  # noqa: E402

P = 128
LINES: list[str] = []


class RowTimeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raise RowTimeout in the main thread after ``seconds`` (0: no limit); SIGALRM, so POSIX only."""
    if seconds <= 0:
        yield
        return

    def stop(signum, frame):
        raise RowTimeout

    old = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def say(s: str = "") -> None:
    print(s, flush=True)
    LINES.append(s)


class IdTokenizer:
    """Token ids written as decimal words: what a task of random prompts needs, and no EOS (every
    rollout runs to its length). ``mask_token_id`` is the model's."""

    eos_token_id = None
    pad_token_id = None

    def __init__(self, mask_id: int):
        self.mask_token_id = mask_id

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [int(t) for t in text.split()]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return " ".join(str(int(i)) for i in ids)


class AlwaysTask:
    """Prompts of P random token ids; every completion verifies."""

    name = "always"

    def __init__(self, vocab: int):
        self.vocab = vocab

    def sample(self, split: str, index: int) -> Problem:
        r = random.Random(f"{split}:{index}")
        return Problem(id=f"{split}-{index}", prompt=" ".join(str(r.randrange(self.vocab // 8, self.vocab // 2))
                                                              for _ in range(P)), answer=None)

    def problems(self, split: str) -> list[Problem]:
        return [self.sample(split, i) for i in range(64)]

    def verify(self, problem: Problem, completion: str) -> float:
        return 1.0


ROWS = {  # name -> the config fields that row changes from "full"
    "full": {},
    "no-runtime": dict(rollout_engine="reference"),
    "no-packing": dict(pack_mode="per_state"),
    "dense": dict(replay_attention="dense"),
    "no-balance": dict(balance=False),
    "all-off": dict(rollout_engine="reference", pack_mode="per_state", replay_attention="dense", balance=False),
    "triton": dict(replay_attention="triton"),
    "torch-sampler": dict(rollout_sampler="torch"),  # the rollouts' logits pass in torch ops (vs --sampler)
}

OWN_WARMUP = ("triton", "torch-sampler")  # rows whose compiled code the common warm-up step does not reach (Triton JIT)


def model_of(family: str, layers: int, device: str = "cuda", size: str | None = None):
    if size:  # a named small size (a CPU check of this script: --device cpu --size tiny --rows dense)
        return build_model(get_config(family, size), seed=0, device=device)
    if family == "sdar":  # QwenDLM-4B: Qwen3-4B + the MLP residual pathway, block 32 (the release's shape)
        cfg = get_config("sdar", "qwendlm-4b", block_size=32)
    else:  # LLaDA-2.1-mini width, ``layers`` layers (all of them do not fit one GPU's AdamW state)
        cfg = get_config("llada", "llada2.1-mini", num_layers=layers, pathway="mlp", pathway_intermediate=2048)
    return build_model(cfg, seed=0, dtype=torch.float32, device=device)


def base_config(a, model) -> ORLConfig:
    K = model.config.block_size
    return ORLConfig(
        init="<in memory>", steps=10_000, prompts_per_step=a.prompts, group_size=a.group, lr=1e-6, warmup=1,
        states_per_response=a.states, pack_mode="packed", max_row_tokens=a.row_tokens,
        loss=LossConfig(anchor="frozen"),
        decode=DecodeConfig(rule="threshold", block_size=K, max_new_tokens=a.new_tokens, temperature=1.0,
                            threshold=1.01, steps=K // 2),
        device=a.device, rollout_engine="runtime", rollout_dtype="bfloat16", max_prompt_tokens=P,
        precision="bf16", checkpoint_layers=True, anchor_dtype="bfloat16", replay_attention="flex" if a.device == "cuda" else "dense",
        micro_batch_tokens=a.micro, balance=True, replay_head="states", out=os.path.join(a.out, "run"), save_every=10**9,
        rollout_sampler=a.sampler)


def one_step(tr: ORLTrainer, cfg: ORLConfig) -> dict:
    tr.cfg = cfg
    cuda = cfg.device == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    m = tr.step()
    if cuda:
        torch.cuda.synchronize()
    wall = time.time() - t0
    return {**tr.timing, "wall": wall, "peak_gb": torch.cuda.max_memory_allocated() / 1e9 if cuda else 0.0,
            "verified": m["verified"], "loss": m.get("loss"), "tpf": m["tpf"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--family", default="sdar", choices=["sdar", "llada"])
    ap.add_argument("--layers", type=int, default=6, help="llada: layers of the LLaDA-2.1-mini-width model")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--states", type=int, default=8, help="states per response (selection budget)")
    ap.add_argument("--row-tokens", type=int, default=4096)
    ap.add_argument("--micro", type=int, default=8192, help="replay micro-batch, packed tokens")
    ap.add_argument("--warmup", type=int, default=1, help="warm-up steps before the rows (0: rows that need no "
                    "graphs or compilation, e.g. --rows no-runtime,all-off in a call of their own)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--size", default=None, help="a named small size instead of the real shape (CPU checks)")
    ap.add_argument("--rows", default="full,dense,no-balance,no-packing,no-runtime,all-off")
    ap.add_argument("--sampler", default="auto", choices=["auto", "torch", "triton"],
                    help="the runtime's logits pass for every row's rollouts (ORLConfig.rollout_sampler)")
    ap.add_argument("--row-limit", type=float, default=0, help="stop a row after this many seconds and report its "
                    "step time as a lower bound (0: no limit); for the eager rows, which may not fit one call")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.set_float32_matmul_precision("high")  # TF32 for the float32 reference rollouts (the fair baseline)
    t0 = time.time()
    model = model_of(a.family, a.layers, a.device, a.size)
    n_par = sum(p.numel() for p in model.parameters())
    tok, task = IdTokenizer(model.config.mask_token_id), AlwaysTask(model.config.vocab_size)
    cfg = base_config(a, model)
    tr = ORLTrainer(cfg, resume=False, model=model, tokenizer=tok, task=task)
    card = torch.cuda.get_device_name() if a.device == "cuda" else "cpu"
    say(f"# One ORL step at the {a.family} shape ({datetime.date.today()}, {card}, "
        f"torch {torch.__version__})\n")
    say(f"`python benchmarks/train_step.py --family {a.family} --prompts {a.prompts} --group {a.group} "
        f"--new-tokens {a.new_tokens} --states {a.states} --row-tokens {a.row_tokens} --micro {a.micro} "
        f"--sampler {a.sampler}`; "
        f"{n_par / 1e9:.2f} B parameters ({model.config.num_layers} layers, D {model.config.hidden_size}, "
        f"block {model.config.block_size}), built in {time.time() - t0:.0f} s\n")
    for _ in range(a.warmup):
        w = one_step(tr, cfg)
        say(f"warm-up step (graph capture, compilation): {w['wall']:.1f} s, peak {w['peak_gb']:.1f} GB\n")
    rows, res = [], {}
    for name in a.rows.split(","):
        say(f"  [{time.time() - t0:.0f} s] {name} ...")
        if name in OWN_WARMUP and a.warmup:  # its kernels compile on first use: not in the measured step
            w = one_step(tr, dataclasses.replace(cfg, **ROWS[name]))
            say(f"  {name}: its own warm-up step {w['wall']:.1f} s")
        try:
            with time_limit(a.row_limit):
                r = one_step(tr, dataclasses.replace(cfg, **ROWS[name]))
        except RowTimeout:  # the row is slower than the limit: its step time is a measured lower bound
            res[name] = {"wall": a.row_limit, "bound": True}
            full = res.get("full", {})
            vs = f"> {a.row_limit / full['wall']:.1f}x" if full and not full.get("bound") else "--"
            rows.append([name, "--", "--", "--", f"> {a.row_limit:g}", vs, "--", "--", "--", "--", "--"])
            say("  " + " | ".join(str(x) for x in rows[-1]) + "   (stopped at the row limit)")
            torch.cuda.empty_cache()
            continue
        except Exception as exc:  # noqa: BLE001 - a row that fails is reported, the others still run
            say(f"  {name}: failed: {type(exc).__name__}: {str(exc)[:400]}")
            torch.cuda.empty_cache()
            continue
        res[name] = r
        full = res.get("full", r)  # a full row stopped at the limit: its time is a bound, so is the ratio
        vs = f"< {r['wall'] / full['wall']:.2f}x" if full.get("bound") else f"{r['wall'] / full['wall']:.2f}x"
        row = [name, f"{r['t_rollout']:.2f}", f"{r['t_replay']:.2f}", f"{r['t_optim']:.2f}", f"{r['wall']:.2f}",
               vs, f"{r['peak_gb']:.1f}", f"{r['rollout_tokens'] / r['t_rollout']:.0f}",
               f"{r['train_tokens'] / max(r['t_replay'], 1e-9):.0f}", r["train_tokens"], r["verified"]]
        rows.append(row)
        say("  " + " | ".join(str(x) for x in row))
    say("\n| row | rollouts + capture s | replay fwd+bwd s | optimizer s | step s | vs full | peak GB | "
        "rollout tok/s | replay tok/s | replay tokens | verified |")
    say("|" + "---|" * 11)
    for row in rows:
        say("| " + " | ".join(str(x) for x in row) + " |")
    if "full" in res and "all-off" in res and not res["full"].get("bound"):  # else: another call's full row
        more = "> " if res["all-off"].get("bound") else ""
        say(f"\nco-designed step vs all off: **{more}{res['all-off']['wall'] / res['full']['wall']:.2f}x** (target >= 6x); "
            f"peak memory of the full step {res['full']['peak_gb']:.1f} GB (target <= 120 GB)")
    with open(os.path.join(a.out, "train_step_results.md"), "w") as f:
        f.write("\n".join(LINES) + "\n")


if __name__ == "__main__":
    main()
