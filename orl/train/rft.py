"""Rejection-sampling fine-tuning (RFT): the baseline ORL is measured against at equal compute.

Each iteration draws the same rollouts an ORL run draws at that step (same prompts, G rollouts per
prompt, same decoder and sampling, the same per-prompt generators: from the same model the two take
identical rollouts), keeps the verified ones, and takes ONE optimizer step of the plain
block-diffusion SFT loss (`orl.train.sft.sft_step`: random masking as in SFT, `orl.train.noise`)
on the (prompt, verified response) pairs. What it leaves out of ORL, on purpose: the captured
states and the residual they consumed (no residual replay: the SFT forward gets no residual input,
no self-conditioning), the AEC term, the reverse-KL anchor and the pathway rescaling (it starts
from the base itself). An iteration with no verified rollout makes no update.
Batch corruption and rollouts are functions of (seed, step), so a resumed run ends where an
uninterrupted one does (tested). Writes ``metrics.jsonl``, ``resolved_config.json``, the loggers'
scalars and ``out/final`` as `train_orl` does. `rft_from_orl` derives the config from an ORL run's
(the one derivation: `orl train --method rft`, the suite's ``rft_suite_*`` recipes, benchmarks/suite_runs.py).
Does not own: decoding and capture (`orl.train.rollout`), the SFT loss (`orl.train.noise`).
"""
from __future__ import annotations

import copy
import dataclasses
import os
from dataclasses import dataclass, field

import torch

from ..decode import DecodeConfig
from ..decode.tpf import summary as tpf_summary
from ..model import load_pretrained, save_pretrained
from .checkpoint import RunDir, open_run
from .loop import PROMPT_STRIDE, ORLConfig, _rollout_runtime, lr_factor
from .noise import make_batch
from .rollout import rollout_group
from .sft import sft_step


@dataclass
class RFTConfig:
    init: str = ""                    # start model directory (the SFT base)
    task: str = "arith"
    task_kwargs: dict = field(default_factory=dict)
    chat: bool = False
    steps: int = 100                  # iterations = optimizer steps (at most one each)
    prompts_per_step: int = 8
    group_size: int = 8               # G rollouts per prompt
    lr: float = 1e-4
    warmup: int = 5
    lr_schedule: str = "constant"     # as ORLConfig (`orl.train.loop.lr_factor`)
    lr_final: float = 0.1
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    weighting: str = "flat"           # the SFT loss weighting (`orl.train.noise.sft_loss`)
    decode: DecodeConfig = field(default_factory=lambda: DecodeConfig(rule="threshold", block_size=16,
                                                                      max_new_tokens=64, temperature=1.0))
    eval_every: int = 0
    eval_n: int = 200
    eval_decode: DecodeConfig | None = None
    seed: int = 0
    prompt_seed: int = 0              # as ORLConfig.prompt_seed
    device: str = "cpu"
    out: str = "runs/rft"
    save_every: int = 25
    reward_errors: str = "raise"      # as ORLConfig.reward_errors
    rollout_engine: str = "auto"      # as ORLConfig: "auto" = the runtime's batched rollouts on CUDA, as ORL's
    rollout_dtype: str | None = None  # as ORLConfig
    rollout_sampler: str = "auto"     # as ORLConfig
    max_prompt_tokens: int = 1024     # as ORLConfig


def rft_from_orl(orl: ORLConfig, init: str, out: str) -> RFTConfig:
    """RFT at the compute of the ORL run ``orl``: its task and options, prompts (the same stream, steps x
    prompts_per_step, the same seeds), G rollouts per prompt with its decoder and sampling, its optimizer
    steps and LR schedule (lr, warm-up, decay, weight decay, clipping), evaluation, checkpoint cadence,
    device and reward-error policy; from ``init``, the SFT base the ORL start model was converted from
    (RFT trains no pathway, so it needs no rescaled start), writing ``out``. What only ORL has (its loss,
    replay, selection and rollout-engine fields) is left behind."""
    return RFTConfig(init=init, task=orl.task, task_kwargs=copy.deepcopy(orl.task_kwargs), chat=orl.chat,
                     steps=orl.steps, prompts_per_step=orl.prompts_per_step, group_size=orl.group_size, lr=orl.lr,
                     warmup=orl.warmup, lr_schedule=orl.lr_schedule, lr_final=orl.lr_final,
                     weight_decay=orl.weight_decay, grad_clip=orl.grad_clip, weighting="flat",
                     decode=copy.deepcopy(orl.decode), eval_every=orl.eval_every, eval_n=orl.eval_n,
                     eval_decode=copy.deepcopy(orl.eval_decode), seed=orl.seed, prompt_seed=orl.prompt_seed,
                     rollout_engine=orl.rollout_engine, rollout_dtype=orl.rollout_dtype,
                     rollout_sampler=orl.rollout_sampler, max_prompt_tokens=orl.max_prompt_tokens,
                     device=orl.device, out=out, save_every=orl.save_every, reward_errors=orl.reward_errors)


def verified_pairs(rolls, eos: int, K: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids up to its EOS, EOS-padded to a multiple of K) of each verified rollout."""
    pairs = []
    for r in rolls:
        if r.reward < 1.0:
            continue
        resp = list(r.response[:r.n_generated])
        if not resp or resp[-1] != eos:
            resp.append(eos)
        resp += [eos] * (-len(resp) % K)
        pairs.append((list(r.prompt), resp))
    return pairs


def train_rft(cfg: RFTConfig, resume: bool = True, stop_after: int | None = None, quiet: bool = False,
              task=None, resume_from: str | None = None, allow_config_change: bool = False,
              loggers: tuple[str, ...] = ("tensorboard",)) -> str:
    """Run (or resume) RFT; returns the final model directory (``out/final``). ``resume_from``,
    ``allow_config_change``, ``loggers``: as `orl.train.sft.train_sft`."""
    if not cfg.init or not os.path.exists(os.path.join(cfg.init, "config.json")):
        raise FileNotFoundError(f"RFT start model {cfg.init!r} not found; train a base with `orl sft` first")
    from .loggers import write_resolved_config  # noqa: PLC0415
    with open_run(cfg.out, "rft", cfg, cfg.steps, resume=resume, resume_from=resume_from,
                  allow_config_change=allow_config_change) as run:
        write_resolved_config(cfg.out, "rft", cfg)
        return _rft_loop(cfg, run, stop_after, quiet, task, loggers)


def _rft_loop(cfg: RFTConfig, run: RunDir, stop_after: int | None, quiet: bool, task, loggers) -> str:
    from ..tokenizer import load_tokenizer  # noqa: PLC0415

    from ..eval.pool import VerifierPool, check_reward_errors  # noqa: PLC0415
    from ..tasks.base import check_task  # noqa: PLC0415
    from ..tasks.registry import get_task  # noqa: PLC0415

    check_reward_errors(cfg.reward_errors)
    task = check_task(task if task is not None else get_task(cfg.task, **cfg.task_kwargs))
    pool = None if hasattr(task, "sample") else task.problems("train")
    tok = load_tokenizer(cfg.init)
    # forked before the model loads (orl.eval.pool.VerifierPool.start); ORL's verification path
    with VerifierPool(task, workers=min(cfg.group_size, os.cpu_count() or 1)).start() as verifier:
        return _rft_steps(cfg, run, stop_after, quiet, task, pool, tok, verifier, loggers)


def _rft_steps(cfg: RFTConfig, run: RunDir, stop_after: int | None, quiet: bool, task, pool, tok, verifier,
               loggers) -> str:
    from tqdm import tqdm  # noqa: PLC0415

    from ..eval.heldout import evaluate  # noqa: PLC0415
    from .loggers import open_loggers  # noqa: PLC0415

    model = load_pretrained(cfg.init, device=cfg.device)
    mc = model.config
    # the pathway never sees an input here (no residual replay, no self-conditioning): frozen, not optimised
    for name, p in model.named_parameters():
        p.requires_grad_(not name.startswith("residual_pathway."))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr,
                            weight_decay=cfg.weight_decay, betas=(0.9, 0.99))
    step = run.load(model, opt)["step"]
    K = cfg.decode.block_size
    log = open_loggers(loggers, cfg.out, "rft", cfg, step, metrics=("rft/reward", "rft/tpf", "rft/eval_accuracy"))
    try:
        step = _rft_iterations(cfg, run, stop_after, quiet, task, pool, tok, verifier, model, opt, step, K, log)
    finally:
        log.close()
    final = os.path.join(cfg.out, "final")
    if step >= cfg.steps:
        save_pretrained(model, final, tokenizer=tok)
    return final


def _rft_iterations(cfg: RFTConfig, run: RunDir, stop_after: int | None, quiet: bool, task, pool, tok, verifier,
                    model, opt, step: int, K: int, log) -> int:
    """The iterations from ``step`` to the end (or ``stop_after``); returns the step reached."""
    from tqdm import tqdm  # noqa: PLC0415

    from ..eval.heldout import evaluate  # noqa: PLC0415
    mc = model.config
    runtime = _rollout_runtime(cfg, model, cfg.device)   # ORL's rollout engine (None: the reference decoder)
    bar = tqdm(total=cfg.steps, initial=step, desc="rft", disable=quiet, dynamic_ncols=True)
    while step < cfg.steps:
        for g_ in opt.param_groups:
            g_["lr"] = cfg.lr * lr_factor(step, cfg)
        # ---- 1. rollouts with the current weights: the prompts, generators and seeds of ORL's step
        model.eval()
        if runtime is not None:
            runtime.load_weights(model)
        rolls = []
        for i in range(step * cfg.prompts_per_step, (step + 1) * cfg.prompts_per_step):
            j = i + PROMPT_STRIDE * cfg.prompt_seed   # as ORL's `_rollouts`
            prob = task.sample("train", j) if pool is None else pool[j % len(pool)]
            g = torch.Generator().manual_seed(cfg.seed * 7_919 + i)
            rolls += rollout_group(model, tok, task, prob, cfg.group_size, cfg.decode, generator=g, topk=0,
                                   runtime=runtime,
                                   chat=cfg.chat, seed=(cfg.seed * 7_919 + i) * cfg.group_size,
                                   verifier=verifier, reward_errors=cfg.reward_errors)
        # ---- 2. verify, 3. one SFT step on the verified (prompt, response) pairs
        pairs = verified_pairs(rolls, tok.eos_token_id, K)
        m: dict = {}
        if pairs:
            model.train()
            gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
            batch = make_batch(pairs, K, noise=mc.noise, mask_id=mc.mask_token_id, vocab_size=mc.vocab_size,
                               pad_id=tok.pad_token_id or 0, clean_attention=mc.clean_attention, generator=gen)
            if cfg.device != "cpu":
                batch = dataclasses.replace(batch, **{k: v.to(cfg.device) for k, v in vars(batch).items()
                                                      if isinstance(v, torch.Tensor)})
            no_selfcond = torch.zeros(len(pairs), dtype=torch.bool, device=cfg.device)
            loss, m = sft_step(model, batch, mc.noise, no_selfcond, cfg.weighting)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            m["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(opt.param_groups[0]["params"], cfg.grad_clip))
            opt.step()
        step += 1
        t = tpf_summary((r.n_generated, r.steps_per_block) for r in rolls)
        m.update(reward=sum(r.reward for r in rolls) / max(len(rolls), 1), tpf=t["tpf"],
                 tpf_no_commit=t["tpf_no_commit"], steps_per_block=t["steps_per_block"], verified=len(pairs),
                 updated=bool(pairs), lr=opt.param_groups[0]["lr"])
        m["accuracy"] = m["reward"]
        m["reward_errors"] = sum(1 for r in rolls if r.reward_error)  # counted with reward_errors="zero"
        if cfg.eval_every and (step % cfg.eval_every == 0 or step == cfg.steps):
            model.eval()
            ev = evaluate(model, tok, task, task.problems("test")[:cfg.eval_n], cfg.eval_decode or
                          dataclasses.replace(cfg.decode, temperature=0.0), chat=cfg.chat,
                          reward_errors=cfg.reward_errors, verifier=verifier)
            m.update({f"eval_{k}": v for k, v in ev.items() if k in ("accuracy", "tpf", "tpf_no_commit",
                                                                      "steps_per_block", "n_errors")})
        run.log({"step": step, **m})  # one record per step: the log was cut back to the resumed step
        log.log("rft", m, step)
        bar.update(1)
        bar.set_postfix(reward=f"{m['reward']:.2f}", tpf=f"{m['tpf']:.2f}", loss=f"{m.get('loss', 0):.3f}",
                        verify_err=m["reward_errors"])
        if step % cfg.save_every == 0 or step == cfg.steps:
            run.save(step, model, opt, {}, tokenizer=tok)
        if stop_after is not None and step >= stop_after:
            break
    bar.close()
    return step
