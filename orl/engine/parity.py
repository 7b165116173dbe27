"""Runtime-vs-reference parity checks, shared by tests/test_engine_*.py and benchmarks/engine.py.

Two checks (docs/STYLE.md convention 7):
  ``compare_decode``   end to end: `Runtime.decode` and `orl.decode.decode` (cached) give the same
                       tokens and rounds per block. Exact in float32; in bf16 two implementations
                       of one forward round differently, and a random model over a large vocabulary
                       has near-ties in almost every block, so one flipped argmax changes the rest.
  ``teacher_forced``   round by round: the runtime is put in each state the reference visited
                       (committed blocks, canvas, unresolved set, residual z) and runs one round;
                       its logits are compared with the reference's and its decision (which
                       positions commit, to which tokens) must equal the reference's except where
                       the reference itself was within rounding of a tie (top-2 logits, the
                       confidence ranking, or the threshold). This holds in any dtype.
Does not own: the runtime or the reference; it only drives both.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..decode import DecodeConfig, decode


@dataclass
class Parity:
    rounds: int = 0
    max_rel_logit_err: float = 0.0
    same_decision: int = 0
    tie_explained: int = 0
    unexplained: list = field(default_factory=list)  # (block, step) of decisions no tie explains

    def ok(self) -> bool:
        return not self.unexplained and self.rounds > 0


def compare_decode(rt, model, prompt, cfg: DecodeConfig, eos_ids=()) -> dict:
    """Run both decoders; returns {"equal": bool, "first_diff": index or None, "ref": out, "ours": out}."""
    ref = decode(model, prompt, cfg, eos_ids=eos_ids)
    ours = rt.decode(prompt, cfg, eos_ids=eos_ids)
    a, b = ref.tokens[0], ours.tokens[0]
    diff = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if diff is None and len(a) != len(b):
        diff = min(len(a), len(b))
    equal = diff is None and ref.steps_per_block == ours.steps_per_block
    return {"equal": equal, "first_diff": diff, "ref": ref, "ours": ours}


def _explained(ref_logits, err, unresolved, take_ref, tok_ref, take_our, tok_our, threshold) -> bool:
    """Whether every differing position is within rounding of a tie in the reference's own numbers."""
    lf = ref_logits.float()
    top2 = lf.topk(2, -1).values
    gap = top2[:, 0] - top2[:, 1]
    logconf = torch.log_softmax(lf, -1).max(-1).values  # log confidence of the argmax
    tol = 4 * err + 1e-6  # logits move by <= err, so log confidences by <= 2 err
    differ = (take_ref != take_our) | (take_ref & take_our & (tok_ref != tok_our))
    others = logconf[unresolved]
    for p in differ.nonzero().flatten().tolist():
        if gap[p] <= tol:
            continue  # the argmax itself is a tie
        near_rank = ((others - logconf[p]).abs() <= 2 * tol).sum() > 1  # another position ties on confidence
        near_thr = abs(float(logconf[p]) - float(torch.log(torch.tensor(threshold)))) <= tol
        if not (near_rank or near_thr):
            return False
    return True


@torch.no_grad()
def teacher_forced(rt, model, prompt, cfg: DecodeConfig) -> Parity:
    """Drive ``rt`` (an `orl.engine.runtime.Runtime`) through the reference decoder's trace."""
    ref = decode(model, prompt, cfg, trace=True, trace_logits=True)
    K, res = rt.K, Parity()
    rt.set_request(cfg)
    rt.prefill(prompt)
    use_res = cfg.residual and model.config.pathway != "none"
    blocks = ref.block_tokens[0]
    for b in range(len(ref.steps_per_block[0])):
        recs = [r for r in ref.trace if r.block == b]
        final = torch.tensor(blocks[b * K:(b + 1) * K])
        S = rt._slots(rt.length + K)
        for i, r in enumerate(recs):
            rt.canvas.copy_(r.canvas)
            rt.rule.unresolved.copy_(r.unresolved)
            rt.step.fill_(r.step)
            rt.rnd.fill_(r.step)
            rt.flag.fill_(True)
            rt.rule.active.fill_(True)
            z = where = weight = None
            if use_res:
                where = r.residual_where.to(rt.device)
                z = None if r.residual is None else r.residual.to(rt.device)
                weight = None if r.residual_weight is None else r.residual_weight.to(rt.device)
                if z is not None:
                    rt.z.copy_(z)
                    rt.where.copy_(where)
                    if weight is not None:
                        rt.weight.copy_(weight)
            logits = rt._embed_forward(rt.canvas, rt.lim_canvas, S, z, where, weight)
            rt.rule.decide(rt, logits)
            ref_l = r.logits.to(logits.device).float()
            err = float((logits.float() - ref_l).abs().max())
            res.max_rel_logit_err = max(res.max_rel_logit_err, err / float(ref_l.abs().max()))
            nxt = recs[i + 1].canvas[0] if i + 1 < len(recs) else final
            take_ref = r.committed[0].to(logits.device)
            take_our = (r.unresolved[0].to(logits.device) & ~rt.rule.unresolved[0])
            tok_ref, tok_our = nxt.to(logits.device), rt.canvas[0]
            res.rounds += 1
            if torch.equal(take_ref, take_our) and torch.equal(tok_ref[take_ref], tok_our[take_our]):
                res.same_decision += 1
            elif _explained(ref_l[0], err, r.unresolved[0].to(logits.device), take_ref, tok_ref, take_our,
                            tok_our, cfg.threshold):
                res.tie_explained += 1
            else:
                res.unexplained.append((b, r.step))
        rt.append_block(final)
    return res
