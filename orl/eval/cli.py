"""`orl eval`: prepare -> generate -> score -> main-table, each a separate, resumable step.

  orl eval prepare   --task gsm8k --out DIR [--limit N] [--tokenizer TOK]
  orl eval generate  --model M --prepared DIR --out FILE [--role R] [--max-new-tokens N] [--set k=v]
  orl eval score     --generations FILE --prepared DIR --out FILE
  orl eval main-table --model M --family F --role R [--limit N] [--out DIR] [--mbpp PATH]

Generation runs the model in this process; scoring runs every verifier in worker processes and
every program in the sandbox, so a hostile completion cannot touch the generator. The decoding
protocol (family, role, block size, thresholds, steps, max new tokens, temperature, chat template)
is printed into every output file's header.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

MAIN = ("gsm8k", "math500", "humaneval", "mbpp")


def _llm(model: str, role: str, device: str, sets: list[str]):
    from ..recipes.overrides import parse_sets  # noqa: PLC0415
    from ..serve.llm import LLM  # noqa: PLC0415
    return LLM(model, role=role, device=device, **parse_sets(sets))


def _generate_fn(llm, max_new_tokens: int):
    def fn(prompt: str) -> dict:
        g = llm.generate(prompt, max_new_tokens=max_new_tokens, temperature=0.0)
        return {"completion": g.text, "n_tokens": g.completion_tokens, "forwards": g.forwards,
                "forwards_no_commit": g.forwards_no_commit, "latency_s": g.latency_s}
    return fn


def _protocol(llm, max_new_tokens: int) -> dict:
    d = llm.decode_config.to_dict()
    d.update(max_new_tokens=max_new_tokens, family=llm.model.config.family, role=llm.role, model=llm.name,
             chat_template=getattr(llm.tokenizer, "chat_template", None) is not None)
    return d


def run_task(llm, task: str, out: Path, limit: int | None, max_new_tokens: int, task_kwargs=None) -> dict:
    from .generate import generate_jsonl  # noqa: PLC0415
    from .prepare import load_prepared, prepare  # noqa: PLC0415
    from .score import score_jsonl  # noqa: PLC0415
    inputs = out / "inputs" / task
    try:
        load_prepared(inputs)
    except (FileNotFoundError, ValueError):
        chat = llm.tokenizer if getattr(llm.tokenizer, "chat_template", None) else None
        prepare(task, inputs, limit=limit, chat_template_tokenizer=chat, task_kwargs=task_kwargs or {})
    gen = out / f"{task}.generations.jsonl"
    generate_jsonl(inputs, gen, _generate_fn(llm, max_new_tokens), _protocol(llm, max_new_tokens), limit=limit)
    return score_jsonl(gen, inputs, out / f"{task}.scored.jsonl")


def cli(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="orl eval", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="op", required=True)
    p = sub.add_parser("prepare", help="write frozen prompts + SHA256 manifest")
    p.add_argument("--task", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--limit", type=int)
    p.add_argument("--tokenizer", help="render prompts with this tokenizer's chat template (qwen3, char, DIR)")
    g = sub.add_parser("generate", help="append-only, resumable generation over prepared prompts")
    s = sub.add_parser("score", help="score a generations file in isolation")
    t = sub.add_parser("main-table", help="all four main-table tasks beside the published numbers")
    for q in (g, t):
        q.add_argument("--model", required=True)
        q.add_argument("--role", default="base", choices=["base", "orl"])
        q.add_argument("--device", default="cpu")
        q.add_argument("--max-new-tokens", type=int, default=512)
        q.add_argument("--limit", type=int)
        q.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="decoding protocol override, e.g. --set threshold=0.8")
    g.add_argument("--prepared", required=True)
    g.add_argument("--out", required=True)
    s.add_argument("--generations", required=True)
    s.add_argument("--prepared", required=True)
    s.add_argument("--out", required=True)
    t.add_argument("--family", required=True, choices=["sdar", "llada", "dgemma"])
    t.add_argument("--out", default="runs/main-table")
    t.add_argument("--tasks", default=",".join(MAIN))
    t.add_argument("--mbpp", help="local MBPP file (MBPP ships in no package; see orl/tasks/mbpp.py)")
    t.add_argument("--mbpp-sha256", help="expected sha256 of --mbpp when it is not the public file")
    a = ap.parse_args(argv)

    if a.op == "prepare":
        from ..tokenizer import load_tokenizer  # noqa: PLC0415
        from .prepare import prepare  # noqa: PLC0415
        tok = load_tokenizer(a.tokenizer) if a.tokenizer else None
        print(prepare(a.task, a.out, limit=a.limit, chat_template_tokenizer=tok))
        return 0
    if a.op == "score":
        from .score import score_jsonl  # noqa: PLC0415
        print(json.dumps(score_jsonl(a.generations, a.prepared, a.out), indent=2))
        return 0
    llm = _llm(a.model, a.role, a.device, a.set)
    if a.op == "generate":
        from .generate import generate_jsonl  # noqa: PLC0415
        print(json.dumps(generate_jsonl(a.prepared, a.out, _generate_fn(llm, a.max_new_tokens),
                                        _protocol(llm, a.max_new_tokens), limit=a.limit), indent=2))
        return 0
    from .table import main_table  # noqa: PLC0415
    if llm.model.config.family != a.family:
        raise ValueError(f"--family {a.family} but the model is a {llm.model.config.family!r} model")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    results, skipped = {}, {}
    for task in a.tasks.split(","):
        kw = {}
        if task.startswith("mbpp") and a.mbpp:
            kw = {"path": a.mbpp, **({"sha256": a.mbpp_sha256} if a.mbpp_sha256 else {})}
        try:
            results[task] = run_task(llm, task, out, a.limit, a.max_new_tokens, kw)
        except FileNotFoundError as e:  # e.g. MBPP not supplied: say where to put it, run the rest
            skipped[task] = str(e)
            print(f"skipped {task}: {e}")
    md, js = main_table(results, a.family, a.role)
    js["skipped"] = skipped
    js["protocol"] = _protocol(llm, a.max_new_tokens)
    (out / "main_table.md").write_text(md + "\n")
    (out / "main_table.json").write_text(json.dumps(js, indent=2) + "\n")
    print(md)
    print(f"\nwrote {out / 'main_table.md'} and {out / 'main_table.json'}")
    return 0 if results else 1


if __name__ == "__main__":  # pragma: no cover
    import sys
    sys.exit(cli(sys.argv[1:]))
