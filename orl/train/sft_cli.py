"""`orl sft --recipe NAME [--set key=value ...] [--out DIR] [--no-resume | --resume-from DIR]
[--allow-config-change]`."""
from __future__ import annotations

import argparse


def add_resume_args(ap: argparse.ArgumentParser) -> None:
    """The run-directory options every training command takes (`orl.train.checkpoint.open_run`)."""
    ap.add_argument("--no-resume", action="store_true",
                    help="start over at step 0 (the run directory's older checkpoints are pruned as this run saves)")
    ap.add_argument("--resume-from", metavar="DIR", help="resume from this checkpoint folder (e.g. OUT/checkpoints/"
                    "step_00000100) instead of the newest complete one")
    ap.add_argument("--allow-config-change", action="store_true",
                    help="resume although the config differs from the checkpoint's (the differences are listed)")


def resume_kwargs(ap: argparse.ArgumentParser, a: argparse.Namespace) -> dict:
    """``resume`` / ``resume_from`` / ``allow_config_change`` of a trainer, from `add_resume_args`'s options."""
    if a.no_resume and a.resume_from:
        ap.error("--no-resume and --resume-from exclude each other")
    return {"resume": not a.no_resume, "resume_from": a.resume_from, "allow_config_change": a.allow_config_change}


def cli(argv: list[str]) -> int:
    from ..recipes import apply_overrides, get_recipe  # noqa: PLC0415
    from .sft import train_sft  # noqa: PLC0415

    ap = argparse.ArgumentParser(prog="orl sft", description="Offline block-diffusion SFT from a recipe.")
    ap.add_argument("--recipe", default="arith_sft", help="recipe function in orl/recipes/ (default: arith_sft)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config field, e.g. --set stages.0.steps=100 --set batch_size=32")
    ap.add_argument("--out", help="run directory (default: the recipe's)")
    add_resume_args(ap)
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    resume = resume_kwargs(ap, a)
    cfg = get_recipe(a.recipe)
    if a.out:
        cfg.out = a.out
    apply_overrides(cfg, a.set)
    final = train_sft(cfg, quiet=a.quiet, **resume)
    print(f"final model: {final}")
    return 0
