"""Offline block-diffusion SFT (`orl sft`): staged recipes, two-pass self-conditioning, exact resume.

Owns the SFT loop: model construction (from scratch, from an autoregressive Qwen3 checkpoint, or
from an orl checkpoint), per-stage LR schedule, batches from a task's worked solutions, the
two-pass self-conditioning that trains the residual pathway (2.2: first pass without residual,
its distribution detached into z, second pass with z at the residual positions), checkpoints,
the loggers' scalars (`orl.train.loggers`), a progress bar and the held-out check: the task's
accuracy on ``eval_n`` held-out problems (greedy decode with the family's base protocol, scored by
the task's verifier) at the end of each stage and every ``eval_every`` steps, shown in the bar as
``heldout_acc`` beside ``masked_acc`` (the loss's masked-token accuracy, a different and much higher
number), and a warning when the last one is near chance: ORL learns only from verified rollouts.
Batch contents and corruption are functions of (seed, step) only, so a resumed run reproduces
an uninterrupted one bit for bit on CPU; the held-out check draws no training randomness (its decode
runs under a forked RNG) and changes no weight.
`more_sft_from` derives the "more SFT" baseline's config from an ORL run's.
Does not own: the loss and corruption (`orl.train.noise`), checkpoint files (`orl.train.checkpoint`).
"""
from __future__ import annotations

import copy
import contextlib
import dataclasses
import math
import os
import sys
import time
from dataclasses import dataclass, field

import torch

from ..model import build_model, get_config, load_pretrained, save_pretrained
from ..model.convert import ensure_pathway
from .checkpoint import RunDir, open_run
from .loop import ORLConfig
from .noise import make_batch, sft_loss


@dataclass
class SFTStage:
    """One stage of a staged recipe (the release trains QwenDLM in four such stages)."""

    name: str
    steps: int
    lr: float = 1e-3
    block_size: int | None = None     # None: the model's block size
    selfcond: float = 0.5             # probability of the two-pass self-conditioned forward
    warmup: int = 50
    min_lr_ratio: float = 0.1


@dataclass
class SFTConfig:
    family: str = "sdar"
    size: str = "tiny"
    model: dict = field(default_factory=dict)         # ModelConfig overrides
    init: str | None = None                           # checkpoint dir (HF Qwen3 or orl) to start from
    tokenizer: str = "char"
    task: str = "arith"
    task_kwargs: dict = field(default_factory=dict)
    chat: bool = False
    stages: list[SFTStage] = field(default_factory=lambda: [SFTStage("diffusion", 200)])
    batch_size: int = 64
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    weighting: str = "elbo"                           # "elbo" (SDAR: CE / p) or "flat" (mean CE)
    seed: int = 0
    device: str = "cpu"
    out: str = "runs/sft"
    save_every: int = 500
    log_every: int = 20
    threads: int | None = None
    precision: str = "fp32"                           # "bf16": forwards and backward under bf16 autocast (weights and
                                                      # AdamW state stay float32), as ORLConfig.precision; "fp32": all float32
    eval_n: int = 32                                  # held-out problems of the bar's task accuracy (0: none)
    eval_every: int = 0                               # ... also every this many steps (0: each stage's end only)

    @property
    def total_steps(self) -> int:
        return sum(s.steps for s in self.stages)


def stage_at(cfg: SFTConfig, step: int) -> tuple[SFTStage, int]:
    """The stage of global ``step`` and the step inside it."""
    for st in cfg.stages:
        if step < st.steps:
            return st, step
        step -= st.steps
    return cfg.stages[-1], cfg.stages[-1].steps


def lr_at(stage: SFTStage, i: int) -> float:
    if i < stage.warmup:
        return stage.lr * (i + 1) / stage.warmup
    frac = (i - stage.warmup) / max(stage.steps - stage.warmup, 1)
    return stage.lr * (stage.min_lr_ratio + (1 - stage.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


def more_sft_from(orl: ORLConfig, sft: SFTConfig, init: str, out: str) -> SFTConfig:
    """The "more SFT" baseline at the compute of the ORL run ``orl``: ``sft`` (the SFT that made the
    base: its batch, tokenizer, loss weighting, self-conditioning) continued from ``init``, the base,
    for ORL's number of optimizer steps, in one stage at the LR that SFT ended with (its last stage's
    lr x min_lr_ratio), constant after ORL's warm-up; on ORL's task and prompt format, on a fresh part
    of the train stream where the task takes a ``seed`` option (its seed + 1; held-out problems stay
    out of every seed's train stream), else on the stream the base saw. Checkpoints at ORL's cadence,
    on ORL's device; writes ``out``. The one derivation (`orl train --method more_sft`, the suite's
    ``more_sft_suite_*`` recipes, benchmarks/suite_runs.py)."""
    from ..tasks.registry import task_parameter  # noqa: PLC0415
    cfg, last = copy.deepcopy(sft), sft.stages[-1]
    cfg.init, cfg.out, cfg.device, cfg.save_every = init, out, orl.device, orl.save_every
    cfg.task, cfg.task_kwargs, cfg.chat = orl.task, copy.deepcopy(orl.task_kwargs), orl.chat
    seed = task_parameter(cfg.task, "seed")
    if seed is not None:
        start = cfg.task_kwargs.get("seed", seed.default if isinstance(seed.default, int) else 0)
        cfg.task_kwargs["seed"] = start + 1
    cfg.stages = [SFTStage("more", steps=orl.steps, lr=last.lr * last.min_lr_ratio, selfcond=last.selfcond,
                           warmup=orl.warmup, min_lr_ratio=1.0)]
    return cfg


def build_for(cfg: SFTConfig, tokenizer) -> torch.nn.Module:
    """The starting model: a named size sized to the tokenizer, or a checkpoint (+ pathway if asked)."""
    over = dict(cfg.model)
    if cfg.init:  # an AR Qwen3 checkpoint or an orl checkpoint
        model = load_pretrained(cfg.init)
        if over.get("pathway", "none") != "none":
            ensure_pathway(model, over.get("pathway_where"))
        model.config = dataclasses.replace(model.config, **over)
        return model
    over.setdefault("vocab_size", len(tokenizer))
    if tokenizer.mask_token_id is not None:
        over.setdefault("mask_token_id", tokenizer.mask_token_id)
    return build_model(get_config(cfg.family, cfg.size, **over), seed=cfg.seed)


def task_pairs(task, tokenizer, step: int, batch_size: int, K: int, chat: bool) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids + EOS padded to a multiple of K) for training step ``step``. The
    problems are ``task.sample("train", i)``, or for a task without ``sample`` its train problems in order, cycled."""
    from ..eval.heldout import encode_prompt  # noqa: PLC0415
    if not hasattr(task, "solution"):
        raise TypeError(f"task {task.name!r} has no solution(problem) method; SFT needs worked solutions")
    sample = getattr(task, "sample", None)
    if sample is None:
        pool = task.problems("train")
        sample = lambda split, i: pool[i % len(pool)]  # noqa: E731
    eos = tokenizer.eos_token_id
    pairs = []
    for i in range(batch_size):
        p = sample("train", step * batch_size + i)
        resp = tokenizer.encode(task.solution(p), add_special_tokens=False) + [eos]
        resp += [eos] * (-len(resp) % K)
        pairs.append((encode_prompt(tokenizer, p.prompt, chat), resp))
    return pairs


def sft_step(model, batch, noise: str, selfcond_rows: torch.Tensor, weighting: str = "elbo") -> tuple[torch.Tensor, dict]:
    """One forward (two when self-conditioning): returns (loss, metrics). The residual positions are
    the corrupted ones ("unresolved" pathways) or the whole noisy copy ("canvas" pathways, which also
    post-normalise there); rows not drawn for self-conditioning get z = 0 (= the first step)."""
    where = z = None
    if model.residual_pathway is not None:
        where = batch.noisy if model.config.pathway_where == "canvas" else batch.corrupted
        if bool(selfcond_rows.any()):
            with torch.no_grad():
                first = model(batch.tokens, batch.positions, batch.mask, residual_where=where)
                z = model.soft_embed(torch.softmax(first.float(), -1)) * selfcond_rows[:, None, None]
    logits = model(batch.tokens, batch.positions, batch.mask, residual=z, residual_where=where)
    return sft_loss(logits, batch, noise, weighting)


def train_sft(cfg: SFTConfig, resume: bool = True, stop_after: int | None = None, quiet: bool = False,
              resume_from: str | None = None, allow_config_change: bool = False,
              loggers: tuple[str, ...] = ("tensorboard",)) -> str:
    """Run (or resume) SFT; returns the directory of the final model (``out/final``). ``resume``:
    from the run directory's newest complete checkpoint; ``resume_from``: from that checkpoint
    folder; ``allow_config_change``: resume although the config differs (`orl.train.checkpoint`);
    ``loggers``: `orl.train.loggers.LOGGERS` names. Writes ``out/resolved_config.json``."""
    from .loggers import write_resolved_config  # noqa: PLC0415
    with open_run(cfg.out, "sft", cfg, cfg.total_steps, resume=resume, resume_from=resume_from,
                  allow_config_change=allow_config_change) as run:
        write_resolved_config(cfg.out, "sft", cfg)
        return _sft_loop(cfg, run, stop_after, quiet, loggers)


NEAR_CHANCE = 0.05  # held-out accuracy within this of the task's chance (``task.chance``, else 0) draws a warning


def heldout_check(model, tok, task, cfg: SFTConfig, K: int) -> dict | None:
    """The task's accuracy (and TPF) on its first ``cfg.eval_n`` held-out problems: greedy decode with
    the family's base protocol at block size ``K``, a budget of the longest reference solution plus a
    block, scored by the task's verifier (`orl.eval.heldout.evaluate`). Under a forked RNG, so it
    draws nothing from the training's; None when the task has no held-out problems."""
    from ..decode import protocol  # noqa: PLC0415
    from ..eval.heldout import evaluate  # noqa: PLC0415
    try:
        problems = task.problems("test")[:cfg.eval_n]
    except (ValueError, KeyError):
        return None
    if not problems:
        return None
    longest = max(len(tok.encode(task.solution(p), add_special_tokens=False)) for p in problems) + 1
    dcfg = protocol(model.config.family, "base", block_size=K, max_new_tokens=(-(-longest // K) + 1) * K)
    was_training = model.training
    model.eval()
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            r = evaluate(model, tok, task, problems, dcfg, chat=cfg.chat)
    finally:
        model.train(was_training)
    return {"accuracy": r["accuracy"], "tpf": r["tpf"], "n": r["n"]}


def _near_chance_warning(task, ev: dict, out: str, task_spec: str) -> str | None:
    chance = float(getattr(task, "chance", 0.0))
    if ev["accuracy"] > chance + NEAR_CHANCE:
        return None
    return (f"warning: held-out accuracy after SFT is {100 * ev['accuracy']:.1f} % ({round(ev['accuracy'] * ev['n'])} "
            f"of {ev['n']} held-out problems; chance {100 * chance:.0f} %): ORL learns only from verified rollouts, so "
            "most of its steps would have none. Train longer or larger (--set stages.0.steps=N, --set size=small), "
            f"or check the task's solutions and verifier: `orl eval heldout --model {os.path.join(out, 'final')} "
            f"--task {task_spec} --show 5` prints completions")


def _sft_loop(cfg: SFTConfig, run: RunDir, stop_after: int | None, quiet: bool,
              loggers: tuple[str, ...] = ("tensorboard",)) -> str:
    from tqdm import tqdm  # noqa: PLC0415
    from .loggers import open_loggers  # noqa: PLC0415
    from ..tasks.registry import get_task  # noqa: PLC0415
    from ..tokenizer import load_tokenizer  # noqa: PLC0415

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    tok = load_tokenizer(cfg.tokenizer)
    task = get_task(cfg.task, **cfg.task_kwargs)
    model = build_for(cfg, tok).to(cfg.device)
    model.train()
    mc = model.config
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.stages[0].lr, weight_decay=cfg.weight_decay,
                            betas=(0.9, 0.95))
    step = run.load(model, opt)["step"]
    log = open_loggers(loggers, cfg.out, "sft", cfg, step, metrics=("sft/loss", "sft/heldout_accuracy"))
    total = cfg.total_steps
    stage_ends = {sum(st.steps for st in cfg.stages[:i + 1]) for i in range(len(cfg.stages))}
    bar = tqdm(total=total, initial=step, desc="sft", disable=quiet, dynamic_ncols=True)
    t0, toks = time.time(), 0
    ev = None
    shown = {}
    while step < total:
        stage, i = stage_at(cfg, step)
        K = stage.block_size or mc.block_size
        for g in opt.param_groups:
            g["lr"] = lr_at(stage, i)
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        pairs = task_pairs(task, tok, step, cfg.batch_size, K, cfg.chat)
        batch = make_batch(pairs, K, noise=mc.noise, mask_id=mc.mask_token_id, vocab_size=mc.vocab_size,
                           pad_id=tok.pad_token_id or 0, clean_attention=mc.clean_attention, generator=gen)
        rows = torch.rand(len(pairs), generator=gen) < stage.selfcond
        if cfg.device != "cpu":
            batch = dataclasses.replace(batch, **{k: v.to(cfg.device) for k, v in vars(batch).items()
                                                  if isinstance(v, torch.Tensor)})
            rows = rows.to(cfg.device)
        with (torch.autocast(torch.device(cfg.device).type, torch.bfloat16) if cfg.precision == "bf16"
              else contextlib.nullcontext()):   # fp32: no autocast context at all (bit for bit the earlier numerics)
            loss, m = sft_step(model, batch, mc.noise, rows, cfg.weighting)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        step += 1
        toks += int(batch.tokens.numel())
        bar.update(1)
        checked = cfg.eval_n > 0 and (step in stage_ends or (cfg.eval_every and step % cfg.eval_every == 0))
        if checked:
            ev = heldout_check(model, tok, task, cfg, K)
            if ev is not None:
                shown["heldout_acc"] = f"{100 * ev['accuracy']:.0f}% (n={ev['n']})"
                log.log("sft", {"heldout_accuracy": ev["accuracy"], "heldout_tpf": ev["tpf"]}, step)
        if step % cfg.log_every == 0 or step == total:
            m.update(lr=opt.param_groups[0]["lr"], grad_norm=float(gnorm), tokens_per_s=toks / (time.time() - t0))
            m["masked_token_acc"] = m.pop("token_acc")  # accuracy on the masked tokens the loss sees, not the task's
            bar.set_postfix(loss=f"{m['loss']:.3f}", masked_acc=f"{m['masked_token_acc']:.3f}", **shown,
                            stage=stage.name)
            log.log("sft", m, step)
        if step % cfg.save_every == 0 or step == total:
            run.save(step, model, opt, {}, tokenizer=tok)
        if stop_after is not None and step >= stop_after:
            break
    bar.close()
    log.close()
    final = os.path.join(cfg.out, "final")
    if step >= total:
        model.config.block_size = cfg.stages[-1].block_size or mc.block_size
        save_pretrained(model, final, tokenizer=tok)
        if ev is not None:
            if not quiet:
                print(f"held-out accuracy after SFT: {100 * ev['accuracy']:.1f} % of {ev['n']} problems, "
                      f"TPF {ev['tpf']:.2f}", flush=True)
            warning = _near_chance_warning(task, ev, cfg.out, cfg.task)
            if warning:
                print(warning, file=sys.stderr, flush=True)
    return final
