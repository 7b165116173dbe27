"""Held-out accuracy and TPF of a model on a task: batched decode -> text -> the task's verifier.

Owns the quick in-process evaluation used by SFT, ORL and the demo (prompts grouped by token
length so rows of a batch share the prompt length the decoder needs). Decoding is in process;
scoring goes through the reward path training uses (`orl.eval.pool.rewards`: worker processes, a
timeout, the value checked to lie in [0, 1]), all completions in one call. The frozen-input,
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
from .pool import check_reward_errors, rewards


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
             progress=None, reward_errors: str = "raise", verifier=None) -> dict:
    """Accuracy, TPF (with and without commit), steps per block, ``n``, ``n_errors`` and
    per-problem records.

    A record: ``id``, ``completion`` (text), ``correct`` (the validated score), ``error`` (why the
    verifier failed, else ""), ``n_tokens`` (generated tokens, EOS included:
    `orl.decode.tpf.generated_tokens`), ``token_ids`` (those tokens), ``forwards`` and
    ``forwards_no_commit`` (`orl.decode.tpf.forwards`), ``steps_per_block``.
    ``reward_errors`` and ``verifier`` (an `orl.eval.pool.VerifierPool` of ``task``) as in
    `orl.eval.pool.rewards`: a verifier error raises `orl.eval.pool.RewardError` unless "zero"."""
    check_reward_errors(reward_errors)
    problems = list(problems)
    if not problems:
        raise ValueError(f"evaluate: no problems of task {task.name!r} to evaluate; an accuracy over none "
                         "would be a made-up number (check the split and eval_n)")
    groups = defaultdict(list)
    for p in problems:
        groups[len(encode_prompt(tokenizer, p.prompt, chat))].append(p)
    dev = next(model.parameters()).device
    records, pairs, t0 = [], [], time.time()
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
                pairs.append((p, text))
                records.append({"id": p.id, "completion": text, "correct": None, "error": "",
                                "n_tokens": generated_tokens(len(ids) - ended, ended), "token_ids": ids,
                                "forwards": out.forwards(r, True), "forwards_no_commit": out.forwards(r, False),
                                "steps_per_block": out.steps_per_block[r]})
            if progress is not None:
                progress(len(chunk))
    got = rewards(task, pairs, reward_errors=reward_errors, pool=verifier)
    for r, score, error in zip(records, got.scores, got.errors):
        r["correct"], r["error"] = score, error
    n = len(records)
    t = tpf_summary((r["n_tokens"], r["steps_per_block"]) for r in records)
    return {"accuracy": sum(got.scores) / n, "tpf": t["tpf"],
            "tpf_no_commit": t["tpf_no_commit"], "steps_per_block": t["steps_per_block"],
            "n": n, "n_errors": got.n_errors, "seconds": time.time() - t0, "records": records}
