"""Where an embedded-task model goes wrong: error classes and the step at which each character committed.

    python benchmarks/arith_failures.py MODEL_DIR [--n 200] [--shuffle 0.25] [--show 12]

Decodes held-out problems one at a time with the demo's greedy decoder and a trace, then sorts the
wrong answers: "malformed" (a line is not ``a+b=c``), "operands" (the terms used are not the
prompt's), "arith" (a line's sum is wrong), "chain" (a line does not start from the previous sum),
"final!=last" (the ``#`` answer differs from the last running sum). For the first wrong ones it
prints the completion and, under each character, the denoising step of its block that committed it
(0-9, then a-z), which shows what the model commits early. Used for docs/LOG.md's diagnosis.
"""
from __future__ import annotations

import argparse
import collections
import re

import torch
from transformers import AutoTokenizer

from orl.decode import DecodeConfig, decode
from orl.eval.heldout import completion_text, encode_prompt, eos_ids
from orl.model import load_pretrained
from orl.tasks.arith import ArithTask

LINE = re.compile(r"(\d+)\+(\d+)=(\d+)")
DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"


def classify(problem, text: str) -> str:
    lines = text.split(";")
    m = [LINE.fullmatch(x) for x in lines[:-1]]
    if not m or any(x is None for x in m):
        return "malformed"
    g = [tuple(map(int, x.groups())) for x in m]
    used = [g[0][0]] + [b for _, b, _ in g]
    fin = re.search(r"#(\d+)", lines[-1])
    bad = {"operands": sorted(used) != sorted(problem.meta["operands"]),
           "arith": any(a + b != c for a, b, c in g),
           "chain": any(g[i][2] != g[i + 1][0] for i in range(len(g) - 1)),
           "final!=last": fin is None or int(fin.group(1)) != g[-1][2]}
    return "+".join(k for k, v in bad.items() if v) or "other"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--shuffle", type=float, default=ArithTask.shuffle)
    ap.add_argument("--show", type=int, default=12)
    ap.add_argument("--block-size", type=int, default=16)
    a = ap.parse_args()
    model = load_pretrained(a.model).eval()
    tok = AutoTokenizer.from_pretrained(a.model)
    task = ArithTask(shuffle=a.shuffle)
    K = a.block_size
    dcfg = DecodeConfig(rule="threshold", block_size=K, max_new_tokens=48, threshold=0.9)
    classes, shown = collections.Counter(), 0
    for p in task.problems("test")[:a.n]:
        out = decode(model, torch.tensor([encode_prompt(tok, p.prompt)]), dcfg, eos_ids=eos_ids(tok),
                     mask_id=tok.mask_token_id, trace=True)
        step = {rec.block * K + k: rec.step for rec in out.trace for k in range(K) if rec.committed[0, k]}
        text = completion_text(tok, out.tokens[0])
        kind = "ok" if task.verify(p, text) else classify(p, text)
        classes[kind] += 1
        if kind != "ok" and shown < a.show:
            shown += 1
            print(f"{p.prompt:12s} {text:32s} " + "".join(DIGITS[min(step.get(i, 35), 35)] for i in range(len(text))))
    print(dict(classes.most_common()))


if __name__ == "__main__":
    with torch.no_grad():
        main()
