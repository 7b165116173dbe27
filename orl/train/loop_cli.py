"""`orl train --recipe NAME [--init DIR] [--set key=value ...] [--task module:function]`."""
from __future__ import annotations

import argparse

from .sft_cli import add_resume_args, resume_kwargs


def cli(argv: list[str]) -> int:
    from ..recipes import apply_overrides, get_recipe  # noqa: PLC0415
    from .loop import train_orl  # noqa: PLC0415

    ap = argparse.ArgumentParser(prog="orl train", description="On-policy residual learning from a recipe.")
    ap.add_argument("--recipe", default="orl_arith")
    ap.add_argument("--init", help="start model directory (default: the recipe's)")
    ap.add_argument("--task", help="task name or a user's module:function (overrides the recipe)")
    ap.add_argument("--out", help="run directory (default: the recipe's)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a field, e.g. --set loss.rho=0.4 --set steps=200")
    add_resume_args(ap)
    ap.add_argument("--stop-after", type=int, default=None, metavar="STEP",
                    help="stop after this step (a later call resumes from the last checkpoint)")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    resume = resume_kwargs(ap, a)
    cfg = get_recipe(a.recipe)
    for k in ("init", "task", "out"):
        if getattr(a, k):
            setattr(cfg, k, getattr(a, k))
    if a.task:
        cfg.task_kwargs = {}
    apply_overrides(cfg, a.set)
    joined = _maybe_init_distributed(cfg.device)
    final = train_orl(cfg, quiet=a.quiet, stop_after=a.stop_after, **resume)
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
