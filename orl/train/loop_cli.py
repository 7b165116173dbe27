"""`orl train [--method orl|rft|more_sft] --recipe NAME [--init DIR] [--task T] [--set key=value ...]`: ORL
from a recipe (under torchrun too), or one of the two baselines ORL is measured against at its compute.

``--method rft`` (`orl.train.rft`) and ``--method more_sft`` (SFT continued, `orl.train.sft`) take an
ORL recipe and derive their config from it (`orl.train.rft.rft_from_orl`, `orl.train.sft.more_sft_from`:
the same task, rollouts, optimizer steps, decoder and LR schedule), starting from ``--init``, the SFT
base the ORL start model was converted from; ``--method rft`` also takes an RFT recipe as it is
(``rft_suite_chain``), ``--method more_sft`` an SFT recipe (``more_sft_suite_chain``). ``--set`` then
changes the config that runs. Options and their checks are `orl.train.sft_cli`'s (one `configure`
for every command); the loops are `orl.train.loop.train_orl`, `orl.train.rft.train_rft` and
`orl.train.sft.train_sft`.
"""
from __future__ import annotations

import argparse
import os
import sys

from ..cli import HelpFormatter
from .sft_cli import add_logger_arg, add_resume_args, add_task_args, configure, resume_kwargs

METHODS = ("orl", "rft", "more_sft")
# the SFT recipe more SFT continues when derived from an ORL recipe: the one `orl sft` runs by default
MORE_SFT_BASE_RECIPE = "arith_sft"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="orl train", description="On-policy residual learning from a recipe: fresh "
                                 "rollouts -> verify -> replay of the verified ones -> one update, per step. The bar "
                                 "shows the rollouts' reward and TPF, the loss (- for a step with no verified rollout: "
                                 "no update) and no_verified, the share of steps so far without one. With --method rft "
                                 "or more_sft, a baseline at the ORL recipe's compute instead. Writes OUT/final, "
                                 "OUT/checkpoints, OUT/metrics.jsonl (orl, rft), OUT/tb and OUT/resolved_config.json.",
                                 formatter_class=HelpFormatter)
    ap.add_argument("--method", choices=METHODS, default="orl",
                    help="orl: on-policy residual learning; rft: rejection-sampling fine-tuning (one plain SFT step "
                         "per iteration on the verified rollouts: no residual replay, AEC or anchor); more_sft: the "
                         f"base's SFT continued ({MORE_SFT_BASE_RECIPE}'s batch and weighting, at the LR its last "
                         "stage ends at, for the ORL recipe's optimizer steps, on a fresh part of the task's train "
                         "stream where the task takes a seed). From an ORL recipe rft takes its task, optimizer "
                         "steps, prompts x rollouts, decoders, LR schedule and seeds, more_sft its task, optimizer "
                         "steps and LR warm-up")
    ap.add_argument("--recipe", default="orl_arith",
                    help="ORL recipe: a function in orl/recipes/ returning an ORLConfig; with --method rft also an "
                         "RFT recipe (rft_suite_chain), with --method more_sft an SFT recipe (more_sft_suite_chain), "
                         "run as they are")
    ap.add_argument("--init", help="start model directory: for orl the `orl convert scrp` output; for rft and more_sft "
                                   "the SFT base it was converted from (an `orl sft` run's OUT/final) (default: the "
                                   "recipe's; a baseline derived from an ORL recipe needs it)")
    add_task_args(ap)
    ap.add_argument("--out", help="run directory (default: the recipe's; a baseline derived from an ORL recipe: the "
                                  "recipe's + '-rft' / '-more_sft')")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a field of the config that runs (repeatable; checked before the run starts), e.g. "
                         "--set loss.rho=0.4 --set steps=200 --set decode.max_new_tokens=32; more_sft's are "
                         "SFTConfig's (--set stages.0.steps=50 --set stages.0.lr=1e-4 --set batch_size=32)")
    add_resume_args(ap)
    ap.add_argument("--stop-after", type=int, default=None, metavar="STEP",
                    help="stop after this step; a later call resumes from the last checkpoint "
                         "(default: run to the end)")
    add_logger_arg(ap)
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    return ap


def cli(argv: list[str]) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    from .loggers import parse_loggers  # noqa: PLC0415 (torch only once the options parsed: --help stays fast)
    resume = resume_kwargs(ap, a)
    loggers = parse_loggers(a.logger)
    if a.method != "orl":
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise ValueError(f"--method {a.method} runs in one process: start it with `orl train`, not torchrun")
        cfg, train = configure_baseline(a)
        _say_derived(cfg, a)
        final = train(cfg, quiet=a.quiet, stop_after=a.stop_after, loggers=loggers, **resume)
        print(f"final model: {final}", flush=True)
        return 0
    from .loop import ORLConfig, train_orl  # noqa: PLC0415
    cfg = configure(ORLConfig, a, fields=("init", "out"))
    joined = _maybe_init_distributed(cfg.device)
    final = train_orl(cfg, quiet=a.quiet, stop_after=a.stop_after, loggers=loggers, **resume)
    print(f"final model: {final}", flush=True)
    if joined:  # leave the group before exit: gloo's teardown at interpreter exit can abort the process
        import torch.distributed as dist  # noqa: PLC0415
        dist.barrier()
        dist.destroy_process_group()
    return 0


def configure_baseline(a: argparse.Namespace):
    """(config, its train function) of ``--method rft`` / ``more_sft``: from an ORL recipe by the one
    derivation (`rft_from_orl`, `more_sft_from`: --task and --task-kw applied to the ORL recipe first),
    or an RFT / SFT recipe as it is; then --init, --out and every --set, checked (`configure`)."""
    from .loop import ORLConfig  # noqa: PLC0415
    if a.method == "rft":
        from .rft import RFTConfig, rft_from_orl, train_rft  # noqa: PLC0415

        def derive(orl: ORLConfig) -> RFTConfig:
            return rft_from_orl(orl, _sft_base(a), a.out or f"{orl.out}-rft")
        return configure(RFTConfig, a, fields=("init", "out"), derive={ORLConfig: derive}), train_rft
    from ..recipes import get_recipe  # noqa: PLC0415
    from .sft import SFTConfig, more_sft_from, train_sft  # noqa: PLC0415

    def derive_sft(orl: ORLConfig) -> SFTConfig:
        init = _sft_base(a)
        base = get_recipe(MORE_SFT_BASE_RECIPE, kind=SFTConfig)
        if os.path.exists(os.path.join(init, "tokenizer_config.json")):
            base.tokenizer = init   # the base's own tokenizer, saved with it (RFT reads it there too)
        return more_sft_from(orl, base, init, a.out or f"{orl.out}-more_sft")
    cfg = configure(SFTConfig, a, fields=("init", "out"), derive={ORLConfig: derive_sft})
    if not cfg.init:
        raise ValueError(f"recipe {a.recipe!r} starts from no model: more SFT continues a base; give --init DIR "
                         "(an `orl sft` run's OUT/final)")
    return cfg, train_sft


def _sft_base(a: argparse.Namespace) -> str:
    """``--init``, checked to hold a model: the SFT base a baseline derived from an ORL recipe starts from
    (the recipe's own ``init`` is the ORL start model, not that base). A model whose pathway was
    rescaled (``orl convert scrp``: an ORL start) gets a note: the baselines start from the base."""
    if not a.init:
        raise ValueError(f"--method {a.method} from ORL recipe {a.recipe!r} needs --init: the SFT base the ORL "
                         "start model was converted from (an `orl sft` run's OUT/final), not the start model")
    path = os.path.join(a.init, "config.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"--init {a.init}: no model there (no config.json); give the SFT base, an `orl sft` "
                                "run's OUT/final")
    from ..model.checkpoint import load_config  # noqa: PLC0415
    gamma = load_config(a.init).pathway_gamma
    if gamma != 1.0:
        print(f"note: --init {a.init} has its residual pathway rescaled (gamma {gamma:g}): an ORL start model "
              "(`orl convert scrp`)? The baselines start from the SFT base it was converted from (its --in)",
              file=sys.stderr, flush=True)
    return a.init


def _say_derived(cfg, a: argparse.Namespace) -> None:
    """One line: what a baseline derived from an ORL recipe will run (after --set)."""
    from ..recipes import list_recipes, recipe_kind  # noqa: PLC0415
    if a.quiet or recipe_kind(list_recipes()[a.recipe]) != "ORLConfig":
        return
    if a.method == "rft":
        what = (f"{cfg.steps} steps x {cfg.prompts_per_step} prompts x {cfg.group_size} rollouts, lr {cfg.lr:g} "
                f"({cfg.lr_schedule})")
    else:
        what = f"{cfg.total_steps} steps of batch {cfg.batch_size}, lr {cfg.stages[0].lr:g}"
    print(f"{a.method} at the compute of ORL recipe {a.recipe}: {what}, from {cfg.init}, task {cfg.task}"
          f"{f' {cfg.task_kwargs}' if cfg.task_kwargs else ''}; resolved config: "
          f"{os.path.join(cfg.out, 'resolved_config.json')}", flush=True)


def _maybe_init_distributed(device: str) -> bool:
    """Under torchrun (WORLD_SIZE > 1) join the process group: NCCL when the run's device is a GPU,
    gloo when it is the CPU (also on a machine that has GPUs: NCCL cannot reduce CPU tensors)."""
    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if str(device).startswith("cuda") and torch.cuda.is_available() else "gloo")
        return True
    return False
