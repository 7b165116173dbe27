"""`orl generate`: decode one prompt with an `LLM` and report text, TPF, forwards and tokens/s.

Owns argument parsing and the printed report (the completion on stdout, the report on stderr so
``orl generate ... > out.txt`` keeps only the text), and what ``--role`` means, for every command
that takes one (`ROLE_HELP`, `check_role`): a role names a family's decoding protocol
(`orl.decode.config.protocol`); for all three families the ``base`` and ``orl`` protocols are the
same (ORL keeps the family's sampler, docs/method.md 3.7), so the role changes no decoding, and
``orl`` on a model without a residual pathway -- where nothing at all distinguishes it -- is an error.
Does not own decoding (`orl.serve.llm`).
"""
from __future__ import annotations

import argparse
import sys

from ..cli import HelpFormatter, check_device
from ..recipes.overrides import parse_sets

# family -> its protocol as `describe_protocol` writes it (tests/test_cli.py checks it against
# orl.decode.config.protocol for both roles; written out so `--help` imports no torch)
ROLE_PROTOCOLS = {
    "sdar": "threshold 0.9, block 32",
    "llada": "threshold 0.95 + editing 0.9, block 32",
    "dgemma": "entropy bound 0.1, temperature 0.8, canvas 256",
}
ROLE_HELP = ("decoding protocol role: base or orl select the same protocol in every family (ORL keeps the family's "
             "sampler, docs/method.md 3.7): " + "; ".join(f"{f}: {p}" for f, p in ROLE_PROTOCOLS.items())
             + " (the model's own block size wins). The role is recorded with the output; orl needs a model "
               "with a residual pathway")


def describe_protocol(dcfg) -> str:
    """A protocol's knobs in a few words (the form of `ROLE_PROTOCOLS`; the rule is the family's own:
    "threshold", "llada" with editing, "dgemma" with its entropy bound)."""
    if dcfg.rule == "threshold":
        return f"threshold {dcfg.threshold:g}, block {dcfg.block_size}"
    if dcfg.rule == "llada":
        return f"threshold {dcfg.threshold:g} + editing {dcfg.edit_threshold:g}, block {dcfg.block_size}"
    if dcfg.rule == "dgemma":
        return f"entropy bound {dcfg.entropy_bound:g}, temperature {dcfg.temperature:g}, canvas {dcfg.block_size}"
    return f"rule {dcfg.rule}, block {dcfg.block_size}"


def check_role(role: str, model_config, name: str = "the model") -> None:
    """ValueError where ``role`` means nothing: ``orl`` for a model without a residual pathway in a
    family whose two roles select the same protocol (every family today)."""
    from ..decode import protocol  # noqa: PLC0415
    family = model_config.family
    if role == "orl" and model_config.pathway == "none" and protocol(family, "orl") == protocol(family, "base"):
        raise ValueError(f"--role orl means nothing for {name}: in the {family} family both roles decode with "
                         f"{describe_protocol(protocol(family, 'base'))}, and the orl role's one difference, the "
                         "residual pathway feeding, needs a pathway this model does not have. Use --role base, or "
                         "make an ORL start model first (orl convert scrp --in BASE --out START)")


def add_llm_args(ap: argparse.ArgumentParser) -> None:
    """The `LLM` options `orl generate` and `orl serve` share (device, dtype, tokenizer, engine, --set)."""
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or mps")
    ap.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: bfloat16 on CUDA, "
                                                  "else float32)")
    ap.add_argument("--tokenizer", default=None, help="qwen3 | char | directory (default: the model's own, else by "
                                                      "its vocabulary size)")
    ap.add_argument("--engine", default="auto", choices=["auto", "reference", "runtime"],
                    help="decoder: auto = the fast runtime on CUDA for the families' rules, else the reference")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="override a decoding protocol field (repeatable), e.g. --set threshold=0.8 "
                         "--set block_size=16 (fields: orl/decode/config.py DecodeConfig)")


def report(gen) -> str:
    return (f"[{gen.finish_reason}] {gen.prompt_tokens} prompt + {gen.completion_tokens} completion tokens | "
            f"TPF {gen.tpf:.2f} (without commit {gen.tpf_no_commit:.2f}) | {gen.forwards} forwards | "
            f"{gen.request_tps:.1f} tokens/s | latency {gen.latency_s:.3f} s")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="orl generate", description="Decode one prompt; print the completion "
                                 "(stdout) and TPF, forwards, tokens/s and latency (stderr).",
                                 formatter_class=HelpFormatter)
    ap.add_argument("prompt", help="the prompt text ('-' reads stdin)")
    ap.add_argument("--model", required=True, help="checkpoint directory or named size (sdar/tiny, qwen3-4b)")
    ap.add_argument("--role", default="base", choices=("base", "orl"), help=ROLE_HELP)
    ap.add_argument("--max-new-tokens", type=int, default=256, help="token budget of the completion")
    ap.add_argument("--temperature", type=float, default=None, help="sampling temperature, 0 = greedy (default: "
                                                                    "the protocol's)")
    ap.add_argument("--stop", action="append", default=None, help="stop string (repeatable; default: none)")
    ap.add_argument("--seed", type=int, default=None, help="sampling seed (default: unseeded)")
    ap.add_argument("--chat", action="store_true", help="send the prompt as one user message (chat template)")
    ap.add_argument("--stream", action="store_true", help="print text as each block commits")
    ap.add_argument("--ignore-eos", action="store_true", help="decode the full budget (benchmarking)")
    ap.add_argument("--no-warmup", action="store_true",
                    help="skip the one-block warm-up decode (its one-time setup otherwise lands in the latency)")
    add_llm_args(ap)
    return ap


def cli(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from ..decode import DecodeConfig  # noqa: PLC0415
    from ..recipes.validate import validate  # noqa: PLC0415
    from .llm import LLM  # noqa: PLC0415 (torch only once the arguments are valid)

    check_device(args.device)
    text = sys.stdin.read() if args.prompt == "-" else args.prompt
    prompt = [{"role": "user", "content": text}] if args.chat else text
    llm = LLM(args.model, role=args.role, device=args.device, dtype=args.dtype, tokenizer=args.tokenizer,
              engine=args.engine, **parse_sets(args.set, DecodeConfig))  # typed, as orl serve's
    check_role(args.role, llm.model.config, args.model)
    validate(llm.decode_config)  # the protocol's ranges, before the warm-up decode would trip on one
    if not args.no_warmup:
        llm.warmup()
    opts = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, stop=args.stop, seed=args.seed,
                ignore_eos=args.ignore_eos)
    if args.stream:
        with llm.stream(prompt, **opts) as s:
            for delta in s:
                print(delta, end="", flush=True)
        gen = s.result
        print()
    else:
        gen = llm.generate(prompt, **opts)
        print(gen.text)
    cfg = llm.decode_config
    print(f"{args.model} ({llm.model.config.family}, {args.role}: rule {cfg.rule}, block {cfg.block_size}) "
          f"{report(gen)}", file=sys.stderr)
    return 0
