"""Held-out accuracy and TPF of a model on a task: batched decode -> text -> the task's verifier.

Owns the quick in-process evaluation used by SFT, ORL and the demo (prompts grouped by token
length so rows of a batch share the prompt length the decoder needs). The frozen-input,
append-only, isolated-scoring pipeline for published benchmarks is `orl.eval.generate`/`score`;
both count generated tokens as `orl.decode.tpf.generated_tokens` does (EOS included), so the same
generations give the same TPF in either (tests/test_frontier.py).
"""
from __future__ import annotations

import time
from collections import defaultdict

import torch

from ..decode import DecodeConfig, decode
from ..decode.tpf import generated_tokens
from ..decode.tpf import summary as tpf_summary


def encode_prompt(tokenizer, text: str, chat: bool = False) -> list[int]:
    if chat:
        return tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                             tokenize=True)
    return tokenizer.encode(text, add_special_tokens=False)


def eos_ids(tokenizer) -> list[int]:
    ids = {tokenizer.eos_token_id}
    if tokenizer.pad_token_id is not None and tokenizer.pad_token_id != tokenizer.eos_token_id:
        ids.add(tokenizer.pad_token_id)
    return sorted(i for i in ids if i is not None)


def completion_text(tokenizer, ids: list[int]) -> str:
    eos = set(eos_ids(tokenizer))
    return tokenizer.decode([i for i in ids if i not in eos], skip_special_tokens=True)


@torch.no_grad()
def evaluate(model, tokenizer, task, problems, dcfg: DecodeConfig, batch_size: int = 64, chat: bool = False,
             progress=None) -> dict:
    """Accuracy, TPF (with and without commit), steps per block and per-problem records.

    A record: ``id``, ``completion`` (text), ``correct``, ``n_tokens`` (generated tokens, EOS
    included: `orl.decode.tpf.generated_tokens`), ``token_ids`` (those tokens), ``forwards`` and
    ``forwards_no_commit`` (`orl.decode.tpf.forwards`), ``steps_per_block``."""
    groups = defaultdict(list)
    for p in problems:
        groups[len(encode_prompt(tokenizer, p.prompt, chat))].append(p)
    dev = next(model.parameters()).device
    records, t0 = [], time.time()
    eos = set(eos_ids(tokenizer))
    for plen, ps in sorted(groups.items()):
        for i in range(0, len(ps), batch_size):
            chunk = ps[i:i + batch_size]
            prompt = torch.tensor([encode_prompt(tokenizer, p.prompt, chat) for p in chunk], device=dev)
            out = decode(model, prompt, dcfg, eos_ids=eos_ids(tokenizer), mask_id=tokenizer.mask_token_id)
            for r, p in enumerate(chunk):
                ids = out.tokens[r]  # up to and including the first EOS
                text = completion_text(tokenizer, ids)
                ended = bool(ids) and ids[-1] in eos
                records.append({"id": p.id, "completion": text, "correct": task.verify(p, text),
                                "n_tokens": generated_tokens(len(ids) - ended, ended), "token_ids": ids,
                                "forwards": out.forwards(r, True), "forwards_no_commit": out.forwards(r, False),
                                "steps_per_block": out.steps_per_block[r]})
            if progress is not None:
                progress(len(chunk))
    n = len(records)
    t = tpf_summary((r["n_tokens"], r["steps_per_block"]) for r in records)
    return {"accuracy": sum(r["correct"] for r in records) / max(n, 1), "tpf": t["tpf"],
            "tpf_no_commit": t["tpf_no_commit"], "steps_per_block": t["steps_per_block"],
            "n": n, "seconds": time.time() - t0, "records": records}
