"""The `orl` command. Process-wide settings (threads, the import path, device checks) are applied here only.

Each subcommand lives next to the code it drives and exposes ``cli(argv) -> int``; this file
only dispatches, so ``orl <cmd> --help`` imports nothing but that command's module.

Owns what every command shares: `HelpFormatter` (every option's default in its help), `check_device`
(a CUDA device asked of a CPU-only torch is a one-line error before any work), the working
directory on the import path (a user's ``--task module:function`` imports from it, as under
``python -m``), and errors a user can act on as one line instead of a traceback: ``ValueError``,
``TypeError``, ``FileNotFoundError``, ``ImportError`` and Ctrl-C (``ORL_DEBUG=1``: the traceback).
Does not own: any command's options (each command's module), what the errors say (where they are raised).
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

COMMANDS = {
    "demo": ("orl.demo", "SFT -> held-out eval -> ORL -> eval on the embedded task, with a before/after table"),
    "sft": ("orl.train.sft_cli", "offline block-diffusion SFT from a recipe"),
    "train": ("orl.train.loop_cli", "on-policy residual learning (ORL) from a recipe"),
    "eval": ("orl.eval.cli", "evaluation: prepare, generate, score, main-table, frontier, heldout (your task)"),
    "generate": ("orl.serve.generate_cli", "decode one prompt and report text, TPF and tokens/s"),
    "serve": ("orl.serve.server", "OpenAI-compatible HTTP server (single-request decoding)"),
    "convert": ("orl.model.convert", "checkpoint tools: add a residual pathway, rescale it (gamma)"),
    "explore": ("orl.explore.cli", "step through a decode, models side by side: one offline HTML page; plot: PNGs"),
}


# what Ctrl-C leaves behind, per command: its runs resume from their last checkpoint / log
RESUMES = {"demo": "resume with the same command (every stage resumes)",
           "sft": "resume with the same command (from the last checkpoint)",
           "train": "resume with the same command (from the last checkpoint)",
           "eval": "resume with the same command (generations and scores are append-only logs)"}


def version() -> str:
    """The installed package's version ("unknown ..." when orl runs from a source tree it was not installed from)."""
    from importlib.metadata import PackageNotFoundError  # noqa: PLC0415
    from importlib.metadata import version as _version  # noqa: PLC0415
    try:
        return _version("orl")
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


class HelpFormatter(argparse.HelpFormatter):
    """`orl`'s help layout: a description of several lines (a module docstring) as written, one line
    wrapped; every option's default appended as ``(default: X)`` unless its help already says what
    its default is (``default`` in the text: "default: the recipe's"), it has none (None, a flag that
    is off, an empty list) or it is required."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text.strip():
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        d = action.default
        if (not action.option_strings or action.required or "default" in text.lower() or d is None
                or d is False or d == [] or d is argparse.SUPPRESS):
            return text
        return f"{text} (default: %(default)s)"


def check_device(device: str, where: str = "--device") -> None:
    """Raise ValueError (one line with the fix) when ``device`` cannot run here: "cuda" asked of a
    CPU-only torch build, or of a CUDA build that sees no GPU, or a GPU index past the last one.
    ``where``: the option that set it, as the message names it ("--device", or "--set device")."""
    dev = str(device)
    if dev == "cpu":
        return
    said = f"{where}={dev}" if where.startswith("--set") else f"{where} {dev}"
    use_cpu = f"{where}=cpu" if where.startswith("--set") else f"{where} cpu"
    import torch  # noqa: PLC0415
    if dev.startswith("cuda"):
        if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
            raise ValueError(f"{said}, but this torch ({torch.__version__}) is a CPU-only build; install a CUDA "
                             "build of torch (pytorch.org/get-started; scripts/setup.sh pins the CPU wheel unless "
                             f"ORL_KEEP_TORCH=1), or use {use_cpu}")
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise ValueError(f"{said}, but torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU (no "
                             f"driver, or CUDA_VISIBLE_DEVICES hides them); use {use_cpu}")
        idx = dev.partition(":")[2]
        if idx and (not idx.isdigit() or int(idx) >= n):
            raise ValueError(f"{said}: this machine has {n} GPU(s), cuda:0 .. cuda:{n - 1}")
    elif dev == "mps":
        if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise ValueError(f"{said}, but this torch has no usable MPS backend; use {use_cpu}")
    else:
        raise ValueError(f"{said}: expected cpu, cuda, cuda:N or mps")


def _usage() -> str:
    lines = ["usage: orl <command> [options]", "       orl --version", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "Run `orl <command> --help` for the options of one command (each with its default).",
              "Errors print one line with the fix; ORL_DEBUG=1 prints the traceback instead.",
              "ORL_THREADS=N sets torch's intra-op threads."]
    return "\n".join(lines)


def _cwd_importable() -> None:
    """The working directory on the import path, as ``python -m`` has it (the installed `orl` script
    has its own folder there instead), so ``--task mytask:make_task`` finds ./mytask.py. Appended, so
    an installed module of the same name still wins."""
    cwd = os.getcwd()
    if "" not in sys.path and cwd not in sys.path:
        sys.path.append(cwd)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if argv[0] in ("-V", "--version"):
        print(f"orl {version()}")
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        import difflib  # noqa: PLC0415
        close = difflib.get_close_matches(cmd, COMMANDS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        print(f"orl: unknown command {cmd!r}{hint}\n\n{_usage()}", file=sys.stderr)
        return 2
    threads = os.environ.get("ORL_THREADS")
    if threads:
        import torch  # noqa: PLC0415
        torch.set_num_threads(int(threads))
    _cwd_importable()
    module = importlib.import_module(COMMANDS[cmd][0])
    try:
        return int(module.cli(rest) or 0)
    except KeyboardInterrupt:
        if os.environ.get("ORL_DEBUG"):
            raise
        after = f"; {RESUMES[cmd]}" if cmd in RESUMES else ""
        lead = "\n" if sys.stderr.isatty() else ""  # off the progress bar's line
        print(f"{lead}orl {cmd}: interrupted{after}", file=sys.stderr)
        return 130
    except (ValueError, TypeError, FileNotFoundError, ImportError) as e:  # user errors: one clear line
        if os.environ.get("ORL_DEBUG"):
            raise
        print(f"orl {cmd}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
