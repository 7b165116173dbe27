"""On-policy rollouts with exact residual capture, and their verification (docs/method.md 3.1-3.4).

Owns: decoding G rollouts per prompt with the CURRENT weights and the family's decoder, keeping
for every denoising step the state it consumed -- canvas tokens, unresolved set, the exact
residual input z (bit for bit, the pre-adapter soft embedding), where it applied, its weight --
plus the rollout statistics the losses need (the rollout policy's log-probabilities at the
state, top-k sparse); and scoring each response with the task's single verifier, through the
reward path evaluation uses (`orl.eval.pool.rewards`: worker processes, a timeout, the value
checked to lie in [0, 1]; a group's G responses in one call).
Replaying a captured state through the unchanged model reproduces the rollout's logits (tested).
Does not own: which states train (`orl.train.pack`), the losses (`orl.train.losses`), the
verifier processes (`orl.eval.pool`).
Shapes: G rows per prompt, K block length, D hidden, V vocab, k top-k kept.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..decode import DecodeConfig, decode
from ..decode.tpf import forwards as count_forwards
from ..eval.heldout import completion_text, encode_prompt, eos_ids
from ..eval.pool import check_reward_errors, rewards


@dataclass
class State:
    """One captured denoising state of one block of one rollout."""

    block: int
    step: int
    canvas: torch.Tensor            # (K,) tokens consumed
    unresolved: torch.Tensor        # (K,) bool before the step
    residual: torch.Tensor | None   # (K, D) z consumed, or None (first step)
    residual_where: torch.Tensor | None  # (K,) bool
    residual_weight: torch.Tensor | None  # (K,)
    entropy: torch.Tensor           # (K,) normalised entropy of the rollout policy at this state
    ref_ids: torch.Tensor | None = None    # (K, k) top-k token ids of the rollout policy
    ref_logp: torch.Tensor | None = None   # (K, k) their log-probabilities
    committed: torch.Tensor | None = None  # (K,) bool positions the rollout committed at this step


@dataclass
class Rollout:
    problem_id: str
    prompt: list[int]
    response: list[int]             # every committed token of every decoded block (K * n_blocks)
    n_generated: int                # tokens up to and including EOS
    text: str
    reward: float
    steps_per_block: list[int]
    states: list[State] = field(default_factory=list)
    index: int = 0                  # row within its group
    reward_error: str = ""          # why the verifier failed (reward_errors="zero" scored it 0); "" if it did not

    @property
    def forwards(self) -> int:
        return count_forwards(self.steps_per_block)


@torch.no_grad()
def rollout_group(model, tokenizer, task, problem, G: int, dcfg: DecodeConfig, *, generator=None,
                  topk: int = 16, chat: bool = False, runtime=None, seed: int = 0, rng=None,
                  verifier=None, reward_errors: str = "raise") -> list[Rollout]:
    """G rollouts of one problem with capture; verified with ``task.verify`` in one
    `orl.eval.pool.rewards` call: in ``verifier`` (an `orl.eval.pool.VerifierPool` of ``task``,
    kept by the caller across groups) or in a pool started for this group. A verifier error
    (raise, timeout, a value outside [0, 1]) raises `orl.eval.pool.RewardError` naming the task,
    problem and value; with ``reward_errors="zero"`` it scores 0 and sets ``Rollout.reward_error``.

    One interface, two decoders: ``runtime`` None -- the reference decoder (`orl.decode.decode`
    with ``trace=True``, drawing from ``generator``; what CPU runs use, so their numbers do not
    move); ``runtime`` an `orl.engine.runtime.Runtime` of batch G over the policy's weights -- the
    G rows in one launch per block with the states captured by its graphs (`orl.engine.capture`),
    drawing from the counter stream of ``seed`` (row r: seed + r). ``rng`` (reference decoder
    only): an `orl.decode.rng` object instead of ``generator`` -- ``CounterRNG(seed)`` draws the
    runtime's numbers, so both decoders give the same rollouts."""
    check_reward_errors(reward_errors)
    dev = next(model.parameters()).device
    prompt = encode_prompt(tokenizer, problem.prompt, chat)
    eos = eos_ids(tokenizer)
    if runtime is not None:
        if runtime.B != G:
            raise ValueError(f"the runtime decodes {runtime.B} rows per launch; this group has G = {G}")
        out = runtime.decode(torch.tensor([prompt]), dcfg, eos_ids=eos, mask_id=tokenizer.mask_token_id, seed=seed,
                             capture_topk=topk)
    else:
        p = torch.tensor([prompt] * G, device=dev)
        out = decode(model, p, dcfg, eos_ids=eos, mask_id=tokenizer.mask_token_id, trace=True,
                     trace_logits=topk > 0, generator=generator, rng=rng)
    texts = [completion_text(tokenizer, out.tokens[r]) for r in range(G)]
    got = rewards(task, [(problem, t) for t in texts], reward_errors=reward_errors, pool=verifier)
    rolls = []
    for r in range(G):
        n_blocks = len(out.steps_per_block[r])
        states = []
        for rec in out.trace:
            if rec.block >= n_blocks or not bool(rec.active[r]):
                continue
            ids = logp = None
            if rec.topk_logp is not None:
                ids, logp = rec.topk_ids[r].clone(), rec.topk_logp[r].clone()
            elif rec.logits is not None and topk > 0:
                lp = torch.log_softmax(rec.logits[r].float(), -1)
                logp, ids = lp.topk(min(topk, lp.shape[-1]), -1)
            states.append(State(
                rec.block, rec.step, rec.canvas[r].clone(), rec.unresolved[r].clone(),
                None if rec.residual is None else rec.residual[r].clone(),
                None if rec.residual_where is None else rec.residual_where[r].clone(),
                None if rec.residual_weight is None else rec.residual_weight[r].clone(),
                rec.entropy[r].clone(), ids, logp, rec.committed[r].clone()))
        resp = list(out.block_tokens[r])
        rolls.append(Rollout(problem.id, prompt, resp, len(out.tokens[r]), texts[r], got.scores[r],
                             list(out.steps_per_block[r]), states, r, got.errors[r]))
    return rolls
