"""The `orl` command. Process-wide settings (threads, default device checks) are applied here only.

Each subcommand lives next to the code it drives and exposes ``cli(argv) -> int``; this file
only dispatches, so ``orl <cmd> --help`` imports nothing but that command's module.
"""
from __future__ import annotations

import importlib
import os
import sys

COMMANDS = {
    "demo": ("orl.demo", "SFT -> held-out eval -> ORL -> eval on the embedded task, with a before/after table"),
    "sft": ("orl.train.sft_cli", "offline block-diffusion SFT from a recipe"),
    "train": ("orl.train.loop_cli", "on-policy residual learning (ORL) from a recipe"),
    "eval": ("orl.eval.cli", "benchmark evaluation: prepare, generate, score, main-table"),
    "generate": ("orl.serve.generate_cli", "decode one prompt and report text, TPF and tokens/s"),
    "serve": ("orl.serve.server", "OpenAI-compatible HTTP server (single-request decoding)"),
    "convert": ("orl.model.convert", "checkpoint tools: add a residual pathway, rescale it (gamma)"),
}


def _usage() -> str:
    lines = ["usage: orl <command> [options]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "Run `orl <command> --help` for the options of one command."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        print(f"orl: unknown command {cmd!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    if not os.environ.get("ORL_DEBUG"):  # our config.json has model_type "orl", which transformers warns about
        from transformers.utils import logging as hf_logging  # noqa: PLC0415
        hf_logging.set_verbosity_error()
    threads = os.environ.get("ORL_THREADS")
    if threads:
        import torch  # noqa: PLC0415
        torch.set_num_threads(int(threads))
    module = importlib.import_module(COMMANDS[cmd][0])
    try:
        return int(module.cli(rest) or 0)
    except (ValueError, TypeError, FileNotFoundError) as e:  # user errors: one clear line, no traceback
        if os.environ.get("ORL_DEBUG"):
            raise
        print(f"orl {cmd}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
