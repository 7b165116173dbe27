"""`orl eval`: prepare -> generate -> score -> main-table, each a separate, resumable step.

  orl eval prepare   --task gsm8k --out DIR [--limit N] [--tokenizer TOK]
  orl eval generate  --model M --prepared DIR --out FILE [--role R] [--max-new-tokens N] [--set k=v]
  orl eval score     --generations FILE --prepared DIR --out FILE
  orl eval main-table --model M --family F --role R [--limit N] [--out DIR] [--mbpp PATH]
  orl eval frontier  --base DIR --model DIR --out DIR [--task T | --recipe R] [--sweep V,...] [--limit N]
  orl eval heldout   --model DIR --task T [--verifier V] [--task-kw k=v] [--limit N] [--show N] [--out FILE]

Generation runs the model in this process; scoring runs every verifier in worker processes and
every program in the sandbox, so a hostile completion cannot touch the generator. ``main-table``
prepares a task again when ``--limit`` (or any other prepare option) differs from the folder's
manifest, leaves out and counts the prompts that do not fit the model's context with
``--max-new-tokens``, and prints the table of every task that ran even when another failed. The decoding
protocol (family, role, block size, thresholds, steps, max new tokens, temperature, chat template)
is printed into every output file's header.
``frontier`` sweeps a base and a trained model over the decoder's knob on a task's held-out
problems (in process, `orl.eval.heldout`) and writes ``frontier.json`` and ``frontier.png``: both
accuracy-vs-TPF curves and the frontier gain with its bootstrap interval (`orl.eval.frontier`).
``heldout`` scores one model on a task's held-out problems in process (`orl.eval.heldout.evaluate`):
accuracy, TPF and, with ``--show N``, N completions with their verdicts -- the quick check of a
model on your own task. ``--task`` takes what ``orl train --task`` takes (a built-in name,
``module:function``, ``path/to/file.py:function`` or ``data.jsonl`` with ``--verifier``).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

MAIN = ("gsm8k", "math500", "humaneval", "mbpp")


def _llm(model: str, role: str, device: str, sets: list[str]):
    from ..cli import check_device  # noqa: PLC0415
    from ..decode import DecodeConfig  # noqa: PLC0415
    from ..recipes.overrides import parse_sets  # noqa: PLC0415
    from ..recipes.validate import validate  # noqa: PLC0415
    from ..serve.generate_cli import check_role  # noqa: PLC0415
    from ..serve.llm import LLM  # noqa: PLC0415
    check_device(device)
    llm = LLM(model, role=role, device=device, **parse_sets(sets, DecodeConfig))
    check_role(role, llm.model.config, model)
    validate(llm.decode_config)  # e.g. --set threshold=2: refused before any prompt is decoded
    return llm


def _task_args(a, default: str | None = None) -> tuple[str, dict]:
    """(task name, options) from ``--task`` / ``--verifier`` / ``--task-kw`` (as `orl train` takes them)."""
    from ..recipes.overrides import parse_typed, parse_value, split_set, task_options  # noqa: PLC0415
    from ..train.sft_cli import check_verifier  # noqa: PLC0415
    name = a.task or default
    if name is None:
        raise ValueError("--task is required (a built-in name, module:function or data.jsonl)")
    check_verifier(name, a)
    options = task_options(name) or {}
    kw = {}
    for key, raw in map(split_set, a.task_kw):
        if options and key not in options:
            raise ValueError(f"--task-kw {key}: task {name!r} takes no option {key!r}; it takes: "
                             f"{', '.join(sorted(options))}")
        kw[key] = parse_typed(raw, options[key], key) if key in options else parse_value(raw)
    if a.verifier:
        kw["verifier"] = a.verifier
    return name, kw


def run_heldout(a) -> int:
    """`orl eval heldout`: one model on a task's held-out problems, in process."""
    import dataclasses  # noqa: PLC0415

    from ..cli import check_device  # noqa: PLC0415
    from ..decode import DecodeConfig, protocol  # noqa: PLC0415
    from ..model import load_pretrained  # noqa: PLC0415
    from ..recipes import get_recipe  # noqa: PLC0415
    from ..recipes.overrides import parse_sets  # noqa: PLC0415
    from ..recipes.validate import validate  # noqa: PLC0415
    from ..serve.generate_cli import check_role  # noqa: PLC0415
    from ..tokenizer import load_tokenizer  # noqa: PLC0415
    from ..train.loop import ORLConfig  # noqa: PLC0415
    from ..train.sft_cli import build_task  # noqa: PLC0415
    from .heldout import evaluate  # noqa: PLC0415
    check_device(a.device)
    recipe = get_recipe(a.recipe, kind=ORLConfig) if a.recipe else None
    name, kw = _task_args(a, recipe.task if recipe else None)
    if recipe is not None and name == recipe.task:  # the recipe's options only with the recipe's task
        kw = {**recipe.task_kwargs, **kw}
    task = build_task(name, kw)
    model = load_pretrained(a.model, device=a.device).eval()
    check_role(a.role, model.config, a.model)
    sets = parse_sets(a.set, DecodeConfig)
    if a.max_new_tokens is not None:
        sets["max_new_tokens"] = a.max_new_tokens
    if recipe is not None:
        dcfg = dataclasses.replace(recipe.eval_decode or dataclasses.replace(recipe.decode, temperature=0.0), **sets)
    else:
        dcfg = protocol(model.config.family, a.role, **{"block_size": model.config.block_size, **sets})
    validate(dcfg)
    problems = task.problems(a.split)[:a.limit]
    r = evaluate(model, load_tokenizer(a.model), task, problems, dcfg, chat=a.chat)
    records = r.pop("records")
    by_id = {p.id: p for p in problems}
    for x in records[:a.show]:
        verdict = ("correct" if x["correct"] >= 1.0 else "wrong") + (f"; {x['error']}" if x["error"] else "")
        print(f"--- {x['id']} ({verdict})"
              f"\nprompt:     {by_id[x['id']].prompt!r}\nanswer:     {by_id[x['id']].answer!r}\n"
              f"completion: {x['completion']!r}")
    n_right = sum(1 for x in records if x["correct"] >= 1.0)
    print(f"{task.name} ({a.split}): accuracy {100 * r['accuracy']:.1f} % ({n_right} of {r['n']}), TPF {r['tpf']:.2f} "
          f"(no commit {r['tpf_no_commit']:.2f}), {r['steps_per_block']:.2f} steps/block | {dcfg.rule}, block "
          f"{dcfg.block_size}, max_new_tokens {dcfg.max_new_tokens}")
    if a.out:
        out = Path(a.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        keep = ("id", "completion", "correct", "error", "n_tokens", "forwards", "forwards_no_commit")
        summary = {**r, "task": name, "task_kwargs": kw, "model": a.model, "role": a.role, "decode": dcfg.to_dict(),
                   "records": [{k: x[k] for k in keep} for x in records]}
        out.write_text(json.dumps(summary, indent=1) + "\n")
        print(f"wrote {out}")
    return 0


def _generate_fn(llm, max_new_tokens: int):
    from ..decode.tpf import generated_tokens  # noqa: PLC0415

    def fn(prompt: str) -> dict:
        g = llm.generate(prompt, max_new_tokens=max_new_tokens, temperature=0.0)
        # no stop strings here, so "stop" means the EOS; counted as the in-process evaluator counts
        n = generated_tokens(g.completion_tokens, g.finish_reason == "stop")
        return {"completion": g.text, "n_tokens": n, "completion_tokens": g.completion_tokens,
                "forwards": g.forwards, "forwards_no_commit": g.forwards_no_commit, "latency_s": g.latency_s}
    return fn


def _protocol(llm, max_new_tokens: int) -> dict:
    d = llm.decode_config.to_dict()
    d.update(max_new_tokens=max_new_tokens, family=llm.model.config.family, role=llm.role, model=llm.name,
             chat_template=getattr(llm.tokenizer, "chat_template", None) is not None)
    return d


def run_task(llm, task: str, out: Path, limit: int | None, max_new_tokens: int, task_kwargs=None) -> dict:
    """Prepare (again when the options changed: `prepare_if_needed`), generate and score one task.
    Prompts that do not fit the model's context with ``max_new_tokens`` are left out and counted
    (``n_skipped``; ``skipped`` maps their ids to why): the rest run in a subset folder beside the
    prepared one. Generations or scores made from other prompts are set aside, never mixed in."""
    from .generate import generate_jsonl  # noqa: PLC0415
    from .prepare import prepare_if_needed, subset  # noqa: PLC0415
    from .score import score_jsonl  # noqa: PLC0415
    inputs = out / "inputs" / task
    chat = llm.tokenizer if getattr(llm.tokenizer, "chat_template", None) else None
    prepared, why = prepare_if_needed(task, inputs, limit, chat, task_kwargs=task_kwargs or {})
    if why is not None and why != "not prepared yet":
        print(f"prepared {task} again ({why})")
    excluded = _not_fitting(llm, prepared.rows, max_new_tokens)
    if excluded:
        note = {"context_length": llm.context_length, "max_new_tokens": max_new_tokens, "model": llm.name}
        prepared = subset(prepared, out / "inputs" / f"{task}.fits", [r["id"] for r in prepared.rows
                                                                     if r["id"] not in excluded], excluded, note)
        print(f"skipped {len(excluded)} of {len(excluded) + len(prepared.rows)} {task} prompts: they do not fit "
              f"the context of {llm.context_length} tokens with max_new_tokens {max_new_tokens}")
    gen, scored = out / f"{task}.generations.jsonl", out / f"{task}.scored.jsonl"
    for path in (gen, scored):
        _set_aside_if_stale(path, prepared.manifest_sha256)
    result = {"n_skipped": 0, "skipped": {}}
    if prepared.rows:
        generate_jsonl(prepared.dir, gen, _generate_fn(llm, max_new_tokens), _protocol(llm, max_new_tokens))
        result = score_jsonl(gen, prepared.dir, scored)
    else:
        result.update(n=0, n_expected=0, accuracy=None, tpf=None)
    result.update(n_skipped=len(excluded), skipped=excluded)
    return result


def _not_fitting(llm, rows: list[dict], max_new_tokens: int) -> dict[str, str]:
    """id -> why, for each prepared prompt that does not fit ``llm``'s context with ``max_new_tokens``
    (a budget that fits no prompt at all is the caller's error and raises)."""
    from ..serve.llm import ContextLengthError  # noqa: PLC0415
    llm.check_lengths(0, max_new_tokens)
    out = {}
    for r in rows:
        n = llm.count_tokens(r["prompt"])
        try:
            llm.check_lengths(n, max_new_tokens)
        except ContextLengthError:
            out[r["id"]] = f"{n} prompt tokens + max_new_tokens {max_new_tokens} > context {llm.context_length}"
    return out


def _set_aside_if_stale(path: Path, manifest_sha256: str) -> None:
    """Rename a generations / scores log written from other prompts (an earlier --limit, another
    subset) to ``<name>.<its manifest hash>.jsonl`` so the new run starts clean and nothing is lost."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    with open(path, encoding="utf-8") as f:
        try:
            old = json.loads(f.readline()).get("manifest_sha256")
        except (json.JSONDecodeError, AttributeError):
            return  # not ours to judge: the resumable log reports it
    if old != manifest_sha256:
        aside = path.with_name(f"{path.name.removesuffix('.jsonl')}.{str(old)[:12]}.jsonl")
        path.rename(aside)
        print(f"{path} was made from other prompts; moved to {aside}")


def run_frontier(a) -> int:
    """`orl eval frontier`: both models swept with one decoding protocol, the frontier block written."""
    import dataclasses  # noqa: PLC0415

    from ..decode import DecodeConfig, protocol  # noqa: PLC0415
    from ..model import load_pretrained  # noqa: PLC0415
    from ..recipes import get_recipe  # noqa: PLC0415
    from ..recipes.overrides import parse_sets  # noqa: PLC0415
    from ..recipes.validate import validate  # noqa: PLC0415
    from ..tasks.registry import get_task  # noqa: PLC0415
    from ..tokenizer import load_tokenizer  # noqa: PLC0415
    from . import frontier as F  # noqa: PLC0415
    models = {name: (load_pretrained(d, device=a.device).eval(), load_tokenizer(d))
              for name, d in (("base", a.base), ("model", a.model))}
    mcfg = models["base"][0].config
    if a.recipe:  # the recipe's held-out protocol and task (e.g. orl_arith for the demo's models)
        from ..train.loop import ORLConfig  # noqa: PLC0415
        r = get_recipe(a.recipe, kind=ORLConfig)
        if getattr(r, "eval_decode", None) is None:
            raise ValueError(f"recipe {a.recipe!r} has no eval_decode (an ORL recipe has); use --set instead")
        task_name, task_kw = _task_args(a, r.task)
        if task_name == r.task:  # the recipe's task options only with the recipe's task
            task_kw = {**r.task_kwargs, **task_kw}
        dcfg = dataclasses.replace(r.eval_decode, **parse_sets(a.set, DecodeConfig))
    else:
        task_name, task_kw = _task_args(a, "arith")
        dcfg = protocol(mcfg.family, "base", **{"block_size": mcfg.block_size, **parse_sets(a.set, DecodeConfig)})
    validate(dcfg)
    task = get_task(task_name, **task_kw)
    problems = task.problems("test")[:a.limit]
    values = None if a.sweep is None else [float(v) for v in a.sweep.split(",") if v]
    rows = {}
    for name, (model, tok) in models.items():
        rows[name] = F.sweep(model, tok, task, problems, dcfg, values, chat=a.chat)
    block = F.frontier_block(rows["base"], rows["model"], drop=a.drop, n_boot=a.n_boot, names=("base", "model"))
    block.update(n=len(problems), task=task.name, base=a.base, model=a.model, decode=dcfg.to_dict())
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "frontier.json").write_text(json.dumps(block, indent=2) + "\n")
    F.plot(block["curves"], str(out / "frontier.png"), block)
    print(F.table(block))
    print(f"\n{F.headline(block)}\nwrote {out / 'frontier.json'} and {out / 'frontier.png'}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from ..cli import HelpFormatter  # noqa: PLC0415
    from ..serve.generate_cli import ROLE_HELP  # noqa: PLC0415
    from ..train.sft_cli import TASK_HELP, add_task_args  # noqa: PLC0415
    ap = argparse.ArgumentParser(prog="orl eval", description=__doc__, formatter_class=HelpFormatter)
    sub = ap.add_subparsers(dest="op", required=True, metavar="{prepare,generate,score,main-table,frontier,heldout}")

    def parser(name: str, help_: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help_, description=help_, formatter_class=HelpFormatter)

    p = parser("prepare", "write a task's frozen prompts + SHA256 manifest to a folder")
    p.add_argument("--task", required=True, help=TASK_HELP.split(". Replaces")[0])
    p.add_argument("--verifier", choices=("exact", "math", "code"), help="a data-file task's verifier (default: exact)")
    p.add_argument("--task-kw", action="append", default=[], metavar="KEY=VALUE", help="a task option (repeatable)")
    p.add_argument("--out", required=True, help="the prepared folder")
    p.add_argument("--limit", type=int, help="first N problems (default: all)")
    p.add_argument("--tokenizer", help="render prompts with this tokenizer's chat template: qwen3, char or a "
                                       "directory (default: the raw prompts)")
    g = parser("generate", "append-only, resumable generation over a prepared folder")
    s = parser("score", "score a generations file in isolation (worker processes, the sandbox)")
    t = parser("main-table", "all four main-table tasks beside the published numbers")
    for q in (g, t):
        q.add_argument("--model", required=True, help="checkpoint directory or named size")
        q.add_argument("--role", default="base", choices=["base", "orl"],
                       help=ROLE_HELP + ("; main-table compares with the published row of this role" if q is t else ""))
        q.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or mps")
        q.add_argument("--max-new-tokens", type=int, default=512, help="token budget per completion")
        q.add_argument("--limit", type=int, help="first N prompts of each task (default: all)")
        q.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="decoding protocol override (repeatable), e.g. --set threshold=0.8")
    g.add_argument("--prepared", required=True, help="folder written by `orl eval prepare`")
    g.add_argument("--out", required=True, help="generations JSONL (appended to: a rerun resumes)")
    s.add_argument("--generations", required=True, help="generations JSONL of `orl eval generate`")
    s.add_argument("--prepared", required=True, help="the prepared folder the generations came from")
    s.add_argument("--out", required=True, help="scored JSONL (appended to: a rerun resumes)")
    t.add_argument("--family", required=True, choices=["sdar", "llada", "dgemma"],
                   help="the model's family: picks the published row (with --role)")
    t.add_argument("--out", default="runs/main-table", help="folder of prepared inputs, logs and the table")
    t.add_argument("--tasks", default=",".join(MAIN), help="comma-separated task names")
    t.add_argument("--mbpp", help="local MBPP file (MBPP ships in no package; see orl/tasks/mbpp.py; default: "
                                  "$ORL_DATA/mbpp/)")
    t.add_argument("--mbpp-sha256", help="expected sha256 of --mbpp when it is not the public file (default: the "
                                         "public file's)")
    fr = parser("frontier", "accuracy-vs-TPF frontiers of a base and a trained model on held-out problems")
    fr.add_argument("--base", required=True, help="the base model's checkpoint directory")
    fr.add_argument("--model", required=True, help="the trained (e.g. ORL) model's checkpoint directory")
    fr.add_argument("--out", required=True, help="folder for frontier.json and frontier.png")
    add_task_args(fr, TASK_HELP.split(". Replaces")[0] + " (default: the recipe's, else arith)")
    fr.add_argument("--recipe", help="take the held-out decoding protocol and task from this ORL recipe "
                                     "(default: the family's base protocol)")
    fr.add_argument("--sweep", metavar="V1,V2,...", help="knob values (default: the rule's grid, "
                                                          "orl.eval.frontier.GRIDS); the protocol's own is added")
    fr.add_argument("--limit", type=int, help="first N held-out problems (default: all)")
    fr.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="decoding protocol override")
    fr.add_argument("--drop", type=float, default=0.01, help="the level: base's best accuracy minus this")
    fr.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples of the gain's interval")
    fr.add_argument("--chat", action="store_true", help="render prompts with the tokenizer's chat template")
    fr.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or mps")
    h = parser("heldout", "one model's accuracy and TPF on a task's held-out problems (in process)")
    h.add_argument("--model", required=True, help="checkpoint directory")
    add_task_args(h, TASK_HELP.split(". Replaces")[0] + " (default: the recipe's)")
    h.add_argument("--recipe", help="take the decoding protocol (eval_decode) and the task from this ORL recipe "
                                    "(default: the family's protocol for --role)")
    h.add_argument("--role", default="base", choices=["base", "orl"], help=ROLE_HELP)
    h.add_argument("--split", default="test", help="the task's split to score")
    h.add_argument("--limit", type=int, help="first N problems (default: all)")
    h.add_argument("--max-new-tokens", type=int, help="token budget per completion (default: the protocol's)")
    h.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="decoding protocol override (repeatable), e.g. --set threshold=0.8")
    h.add_argument("--show", type=int, default=0, metavar="N", help="print the first N completions with their verdicts")
    h.add_argument("--out", help="also write the summary and every completion to this JSON file (default: none)")
    h.add_argument("--chat", action="store_true", help="render prompts with the tokenizer's chat template")
    h.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or mps")
    return ap


def cli(argv: list[str]) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    if a.op == "frontier":
        return run_frontier(a)
    if a.op == "heldout":
        return run_heldout(a)

    if a.op == "prepare":
        from .prepare import prepare  # noqa: PLC0415
        tok = None
        if a.tokenizer:  # (transformers only when a chat template is asked for)
            from ..tokenizer import load_tokenizer  # noqa: PLC0415
            tok = load_tokenizer(a.tokenizer)
        name, kw = _task_args(a)
        print(prepare(name, a.out, limit=a.limit, chat_template_tokenizer=tok, task_kwargs=kw))
        return 0
    if a.op == "score":
        from .score import score_jsonl  # noqa: PLC0415
        print(json.dumps(score_jsonl(a.generations, a.prepared, a.out), indent=2))
        return 0
    if a.op == "generate" and a.limit is not None:  # before the model loads: a limit the folder cannot meet
        from .prepare import load_prepared  # noqa: PLC0415
        held = load_prepared(a.prepared)
        if a.limit > len(held.rows) and held.manifest.get("limit") is not None:
            raise ValueError(f"--limit {a.limit} asks for more prompts than {a.prepared} holds ({len(held.rows)}, "
                             f"prepared with --limit {held.manifest['limit']}); prepare it again with --limit {a.limit}")
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
    results, skipped, failed = {}, {}, False
    for task in a.tasks.split(","):
        kw = {}
        if task.startswith("mbpp") and a.mbpp:
            kw = {"path": a.mbpp, **({"sha256": a.mbpp_sha256} if a.mbpp_sha256 else {})}
        try:
            results[task] = run_task(llm, task, out, a.limit, a.max_new_tokens, kw)
        except FileNotFoundError as e:  # e.g. MBPP not supplied: say where to put it, run the rest
            skipped[task] = str(e)
            print(f"skipped {task}: {e}")
        except ValueError as e:  # e.g. a log of another protocol: report it, still print the others' table
            skipped[task], failed = str(e), True
            print(f"failed {task}: {e}")
    md, js = main_table(results, a.family, a.role)
    js["skipped"] = skipped
    js["protocol"] = _protocol(llm, a.max_new_tokens)
    (out / "main_table.md").write_text(md + "\n")
    (out / "main_table.json").write_text(json.dumps(js, indent=2) + "\n")
    print(md)
    print(f"\nwrote {out / 'main_table.md'} and {out / 'main_table.json'}")
    return 0 if results and not failed else 1


if __name__ == "__main__":  # pragma: no cover
    import sys
    sys.exit(cli(sys.argv[1:]))
