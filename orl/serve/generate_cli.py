"""`orl generate`: decode one prompt with an `LLM` and report text, TPF, forwards and tokens/s.

Owns argument parsing and the printed report (the completion on stdout, the report on stderr so
``orl generate ... > out.txt`` keeps only the text). Does not own decoding (`orl.serve.llm`).
"""
from __future__ import annotations

import argparse
import sys

from ..recipes.overrides import parse_sets


def add_llm_args(ap: argparse.ArgumentParser) -> None:
    """The `LLM` options `orl generate` and `orl serve` share (device, dtype, tokenizer, engine, --set)."""
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: per device)")
    ap.add_argument("--tokenizer", default=None, help="qwen3 | char | directory (default: from the model)")
    ap.add_argument("--engine", default="auto", choices=["auto", "reference", "runtime"],
                    help="decoder: auto = the fast runtime on CUDA for the families' rules, else the reference")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="override a decoding protocol field, e.g. --set threshold=0.8")


def report(gen) -> str:
    return (f"[{gen.finish_reason}] {gen.prompt_tokens} prompt + {gen.completion_tokens} completion tokens | "
            f"TPF {gen.tpf:.2f} (without commit {gen.tpf_no_commit:.2f}) | {gen.forwards} forwards | "
            f"{gen.request_tps:.1f} tokens/s | latency {gen.latency_s:.3f} s")


def cli(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="orl generate", description="Decode one prompt; print the completion "
                                 "(stdout) and TPF, forwards, tokens/s and latency (stderr).")
    ap.add_argument("prompt", help="the prompt text ('-' reads stdin)")
    ap.add_argument("--model", required=True, help="checkpoint directory or named size (sdar/tiny, qwen3-4b)")
    ap.add_argument("--role", default="base", choices=("base", "orl"), help="decoding protocol role")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=None, help="default: the protocol's (0 = greedy)")
    ap.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--chat", action="store_true", help="send the prompt as one user message (chat template)")
    ap.add_argument("--stream", action="store_true", help="print text as each block commits")
    ap.add_argument("--ignore-eos", action="store_true", help="decode the full budget (benchmarking)")
    ap.add_argument("--no-warmup", action="store_true",
                    help="skip the one-block warm-up decode (its one-time setup otherwise lands in the latency)")
    add_llm_args(ap)
    args = ap.parse_args(argv)
    from ..decode import DecodeConfig  # noqa: PLC0415
    from ..recipes.validate import validate  # noqa: PLC0415
    from .llm import LLM  # noqa: PLC0415 (torch only once the arguments are valid)

    text = sys.stdin.read() if args.prompt == "-" else args.prompt
    prompt = [{"role": "user", "content": text}] if args.chat else text
    llm = LLM(args.model, role=args.role, device=args.device, dtype=args.dtype, tokenizer=args.tokenizer,
              engine=args.engine, **parse_sets(args.set, DecodeConfig))  # typed, as orl serve's
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
