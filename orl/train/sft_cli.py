"""`orl sft --recipe NAME [--set key=value ...] [--out DIR] [--no-resume]`."""
from __future__ import annotations

import argparse


def cli(argv: list[str]) -> int:
    from ..recipes import apply_overrides, get_recipe  # noqa: PLC0415
    from .sft import train_sft  # noqa: PLC0415

    ap = argparse.ArgumentParser(prog="orl sft", description="Offline block-diffusion SFT from a recipe.")
    ap.add_argument("--recipe", default="arith_sft", help="recipe function in orl/recipes/ (default: arith_sft)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config field, e.g. --set stages.0.steps=100 --set batch_size=32")
    ap.add_argument("--out", help="run directory (default: the recipe's)")
    ap.add_argument("--no-resume", action="store_true", help="ignore checkpoints in the run directory")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    cfg = get_recipe(a.recipe)
    if a.out:
        cfg.out = a.out
    apply_overrides(cfg, a.set)
    final = train_sft(cfg, resume=not a.no_resume, quiet=a.quiet)
    print(f"final model: {final}")
    return 0
