"""`orl sft --recipe NAME [--task T] [--set key=value ...] [--out DIR] [--no-resume | --resume-from DIR]`.

Owns the options the training commands share (`add_resume_args`, `add_task_args`, `add_logger_arg`)
and how they become a config before any work starts (`configure`): the recipe (of the command's
kind: an ORL recipe given to ``orl sft`` is an error naming ``orl train``; or derived from a recipe of
another kind: ``orl train --method rft`` from an ORL recipe), ``--task`` (the recipe's
task options are dropped with the recipe's task: options come only from the user), every ``--set``
checked (`orl.recipes.validate`), the device checked against this torch, the task built once (an
import error or a bad option surfaces here, not after a stage).
Does not own: the SFT loop (`orl.train.sft`), the --set parser (`orl.recipes.overrides`).
"""
from __future__ import annotations

import argparse

from ..cli import HelpFormatter

TASK_HELP = ("the task: a built-in name (arith, gsm8k, chain, ...), your own 'module:function' (importable from "
             "the working directory or PYTHONPATH) or 'path/to/file.py:function', or a data file 'data.jsonl' of "
             '{"prompt", "answer"} records (with --verifier). Replaces the recipe\'s task and drops its task options '
             "(default: the recipe's task)")


def add_resume_args(ap: argparse.ArgumentParser) -> None:
    """The run-directory options every training command takes (`orl.train.checkpoint.open_run`)."""
    ap.add_argument("--no-resume", action="store_true",
                    help="start over at step 0 (the run directory's older checkpoints are pruned as this run saves)")
    ap.add_argument("--resume-from", metavar="DIR", help="resume from this checkpoint folder (e.g. OUT/checkpoints/"
                    "step_00000100) instead of the newest complete one (default: the newest)")
    ap.add_argument("--allow-config-change", action="store_true",
                    help="resume although the config differs from the checkpoint's (the differences are listed)")


def resume_kwargs(ap: argparse.ArgumentParser, a: argparse.Namespace) -> dict:
    """``resume`` / ``resume_from`` / ``allow_config_change`` of a trainer, from `add_resume_args`'s options."""
    if a.no_resume and a.resume_from:
        ap.error("--no-resume and --resume-from exclude each other")
    return {"resume": not a.no_resume, "resume_from": a.resume_from, "allow_config_change": a.allow_config_change}


def add_task_args(ap: argparse.ArgumentParser, task_help: str = TASK_HELP) -> None:
    """``--task``, ``--verifier`` and ``--task-kw``: the same on every command that takes a task."""
    ap.add_argument("--task", metavar="TASK", help=task_help)
    ap.add_argument("--verifier", choices=("exact", "math", "code"),
                    help="how a data-file task checks a completion: exact = equals the answer (whitespace "
                         "stripped), math = math-verify (orl/tasks/mathcheck.py), code = the answer's asserts in "
                         "the sandbox (default: exact; only with --task FILE.jsonl)")
    ap.add_argument("--task-kw", action="append", default=[], metavar="KEY=VALUE",
                    help="an option of the task, passed to its constructor or function (repeatable), e.g. "
                         "--task-kw length=8; the same as --set task_kwargs.KEY=VALUE")


def add_logger_arg(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--logger", default="tensorboard", metavar="NAMES",
                    help="where metrics go besides the bar and metrics.jsonl, comma-separated: tensorboard (OUT/tb), "
                         "wandb (pip install 'orl[wandb]'; WANDB_MODE=offline for no network), none")


def is_data_file(task: str) -> bool:
    return task.endswith((".jsonl", ".json", ".jsonl.gz"))


def task_sets(a: argparse.Namespace) -> list[str]:
    """``--verifier`` and ``--task-kw`` as ``task_kwargs.KEY=VALUE`` sets; --verifier only with a data file."""
    out = [f"task_kwargs.{kv}" for kv in a.task_kw]
    if a.verifier:
        out.append(f"task_kwargs.verifier={a.verifier}")
    return out


def check_verifier(task: str, a: argparse.Namespace) -> None:
    if a.verifier and not is_data_file(task):
        raise ValueError(f"--verifier applies to a data-file task (--task FILE.jsonl); task {task!r} has its own "
                         "verifier")


def configure(kind: type, a: argparse.Namespace, fields: tuple[str, ...] = ("out",), derive: dict | None = None,
              **recipe_kwargs):
    """The config of recipe ``a.recipe`` (a ``kind`` recipe), with the command's options, its --task and
    every --set applied and validated, the device checked and the task built once: every error a
    user can make in the options surfaces here, before a step runs. ``fields``: options that set
    the config field of the same name when given (``--out``, ``--init``). ``derive``: {config type:
    function(config) -> a ``kind`` config}: recipes of those types are taken too and turned into a
    ``kind`` config (``orl train --method rft`` given an ORL recipe); --task and --task-kw go to the
    recipe's config before the derivation (which may depend on the task), --set to the derived one,
    so a --set key must be a field of the config that runs."""
    from ..cli import check_device  # noqa: PLC0415
    from ..recipes import apply_overrides, get_recipe  # noqa: PLC0415
    from ..recipes.overrides import split_set  # noqa: PLC0415
    derive = derive or {}
    cfg = get_recipe(a.recipe, kind=(kind, *derive), **recipe_kwargs)
    sets = list(a.set)
    task = a.task or next((raw.strip() for key, raw in map(split_set, reversed(sets)) if key == "task"), None)
    if task and task != cfg.task:  # the recipe's task options belong to the recipe's task, not this one
        cfg.task, cfg.task_kwargs = task, {}
    check_verifier(cfg.task, a)
    if type(cfg) in derive and not isinstance(cfg, kind):
        cfg = derive[type(cfg)](apply_overrides(cfg, task_sets(a)))
    else:
        for k in fields:
            if getattr(a, k, None):
                setattr(cfg, k, getattr(a, k))
        sets += task_sets(a)
    apply_overrides(cfg, sets)
    check_device(cfg.device, "--set device")
    build_task(cfg.task, cfg.task_kwargs)
    return cfg


def build_task(name: str, kwargs: dict):
    """The task, built as the run will build it; a user task's missing function is a ValueError (one line)."""
    from ..tasks.registry import get_task  # noqa: PLC0415
    try:
        return get_task(name, **kwargs)
    except AttributeError as e:  # load_custom_task: "module 'x' has no attribute 'y' (it has: ...)"
        raise ValueError(str(e)) from e


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="orl sft", description="Offline block-diffusion SFT from a recipe: the bar "
                                 "shows the loss, masked_acc (accuracy on the masked tokens the loss sees) and "
                                 "heldout_acc (the task's accuracy on eval_n held-out problems, greedy, after "
                                 "each stage). Writes OUT/final, OUT/checkpoints, OUT/tb and OUT/resolved_config.json.",
                                 formatter_class=HelpFormatter)
    ap.add_argument("--recipe", default="arith_sft",
                    help="SFT recipe: a function in orl/recipes/ returning an SFTConfig")
    add_task_args(ap)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config field (repeatable; checked before the run starts), e.g. "
                         "--set stages.0.steps=100 --set batch_size=32 --set size=small --set eval_n=64")
    ap.add_argument("--out", help="run directory (default: the recipe's)")
    add_resume_args(ap)
    add_logger_arg(ap)
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    return ap


def cli(argv: list[str]) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    from .loggers import parse_loggers  # noqa: PLC0415 (torch only once the options parsed: --help stays fast)
    from .sft import SFTConfig, train_sft  # noqa: PLC0415
    resume = resume_kwargs(ap, a)
    loggers = parse_loggers(a.logger)
    cfg = configure(SFTConfig, a)
    final = train_sft(cfg, quiet=a.quiet, loggers=loggers, **resume)
    print(f"final model: {final}")
    return 0
