"""`orl train --recipe NAME [--init DIR] [--task T] [--set key=value ...]`: ORL from a recipe (under torchrun too).

Options and their checks are `orl.train.sft_cli`'s (one `configure` for both commands); the loop
is `orl.train.loop.train_orl`.
"""
from __future__ import annotations

import argparse

from ..cli import HelpFormatter
from .sft_cli import add_logger_arg, add_resume_args, add_task_args, configure, resume_kwargs


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="orl train", description="On-policy residual learning from a recipe: fresh "
                                 "rollouts -> verify -> replay of the verified ones -> one update, per step. The bar "
                                 "shows the rollouts' reward and TPF, the loss (- for a step with no verified rollout: "
                                 "no update) and no_verified, the share of steps so far without one. Writes OUT/final, "
                                 "OUT/checkpoints, OUT/metrics.jsonl, OUT/tb and OUT/resolved_config.json.",
                                 formatter_class=HelpFormatter)
    ap.add_argument("--recipe", default="orl_arith",
                    help="ORL recipe: a function in orl/recipes/ returning an ORLConfig")
    ap.add_argument("--init", help="start model directory, e.g. `orl convert scrp` output (default: the recipe's)")
    add_task_args(ap)
    ap.add_argument("--out", help="run directory (default: the recipe's)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config field (repeatable; checked before the run starts), e.g. --set loss.rho=0.4 "
                         "--set steps=200 --set decode.max_new_tokens=32")
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
    from .loop import ORLConfig, train_orl  # noqa: PLC0415
    resume = resume_kwargs(ap, a)
    loggers = parse_loggers(a.logger)
    cfg = configure(ORLConfig, a, fields=("init", "out"))
    joined = _maybe_init_distributed(cfg.device)
    final = train_orl(cfg, quiet=a.quiet, stop_after=a.stop_after, loggers=loggers, **resume)
    print(f"final model: {final}", flush=True)
    if joined:  # leave the group before exit: gloo's teardown at interpreter exit can abort the process
        import torch.distributed as dist  # noqa: PLC0415
        dist.barrier()
        dist.destroy_process_group()
    return 0


def _maybe_init_distributed(device: str) -> bool:
    """Under torchrun (WORLD_SIZE > 1) join the process group: NCCL when the run's device is a GPU,
    gloo when it is the CPU (also on a machine that has GPUs: NCCL cannot reduce CPU tensors)."""
    import os  # noqa: PLC0415

    import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if str(device).startswith("cuda") and torch.cuda.is_available() else "gloo")
        return True
    return False
