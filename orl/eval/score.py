"""Step 3 of evaluation: score a generations JSONL with the task's own verifier, in isolation.

``score_jsonl(generations, prepared_dir, out_path)`` scores each generation with
`orl.eval.pool.rewards` -- the function training rewards go through: ``task.verify`` in worker
processes with a per-item timeout, its value checked to lie in [0, 1]; math tasks use math-verify
there, code tasks run their programs in `orl.eval.sandbox` from inside ``verify``. Results go to
an append-only, resumable scored JSONL (header + one ``{"type": "score", "id", "score", "error",
...}`` line per problem), and the aggregate comes back. A verifier error raises
`orl.eval.pool.RewardError` after the batch (the good scores are kept; the failed ones are not
written, so a rerun after the fix scores them); ``reward_errors="zero"`` writes them with score 0
and their error instead.

* ``accuracy``: mean score over scored problems (a fraction; tables print percent); None when
  nothing is scored (never NaN, never above 1: `aggregate` refuses scores outside [0, 1] and
  repeated ids);
* ``tpf`` / ``tpf_no_commit``: total generated tokens (``n_tokens`` as generated: EOS included,
  `orl.decode.tpf.generated_tokens`, as `orl.eval.heldout` counts) / total forwards (with / without
  the per-block cache-commit forward), i.e. token-weighted, over the same problems;
* ``tpf_mean``: the unweighted mean of per-problem TPF, for comparison;
* ``n`` scored, ``n_expected`` prepared, ``n_errors`` verifier errors or timeouts.

Does not own: generation (`orl.eval.generate`), verifiers (the tasks), tables (`orl.eval.table`).
"""
from __future__ import annotations

import os
from typing import Any

from tqdm import tqdm

from orl.eval.jsonlog import append, open_log, read_log
from orl.decode.tpf import tpf
from orl.eval.pool import check_reward, check_reward_errors, rewards
from orl.eval.prepare import load_prepared
from orl.tasks.base import Task


def aggregate(scored: list[dict], n_expected: int | None = None) -> dict[str, Any]:
    """Accuracy and TPF over scored records (see the module docstring for definitions); a
    ``ValueError`` naming the record for a score outside [0, 1] or an id seen twice."""
    seen = set()
    for r in scored:
        why = check_reward(r.get("score"))[1]
        if why:
            raise ValueError(f"scored record {r.get('id')!r} has score {r.get('score')!r}, not a valid reward "
                             "(a float in [0, 1]); was it written by an older scorer or edited?")
        if r.get("id") in seen:
            raise ValueError(f"scored record {r.get('id')!r} appears twice; each problem counts once")
        seen.add(r.get("id"))
    n = len(scored)
    tokens = sum(r.get("n_tokens") or 0 for r in scored)
    forwards = sum(r.get("forwards") or 0 for r in scored)
    forwards_nc = sum(r.get("forwards_no_commit") or 0 for r in scored)
    per = [tpf(r["n_tokens"], r["forwards"]) for r in scored if r.get("forwards")]
    return {
        "n": n,
        "n_expected": n if n_expected is None else n_expected,
        "accuracy": sum(float(r["score"]) for r in scored) / n if n else None,
        "tpf": tpf(tokens, forwards),
        "tpf_no_commit": tpf(tokens, forwards_nc),
        "tpf_mean": sum(per) / len(per) if per else None,
        "n_errors": sum(1 for r in scored if r.get("error")),
    }


def score_jsonl(generations_path: str | os.PathLike, prepared_dir: str | os.PathLike,
                out_path: str | os.PathLike, task: Task | None = None, workers: int | None = None,
                timeout_s: float = 60.0, progress: bool = True, reward_errors: str = "raise") -> dict[str, Any]:
    """Score every generation not yet in ``out_path``; return the aggregate over all of them.

    ``task`` defaults to the one named in the prepared manifest; pass one to change options
    that do not alter the verdicts' meaning (e.g. sandbox limits). ``reward_errors``: see the
    module docstring.
    """
    check_reward_errors(reward_errors)
    prepared = load_prepared(prepared_dir)
    gen_header, generations, _, _ = read_log(generations_path)  # ignores a cut last line
    if gen_header is None:
        raise ValueError(f"{generations_path} has no header line; is it a generate_jsonl output?")
    if gen_header.get("manifest_sha256") != prepared.manifest_sha256:
        raise ValueError(
            f"{generations_path} was generated from other prompts (manifest "
            f"{gen_header.get('manifest_sha256')}) than {prepared_dir} ({prepared.manifest_sha256})"
        )
    if not generations:
        raise ValueError(f"{generations_path} holds no generations yet; run `orl eval generate` first")
    task = task or prepared.task()
    header = {"type": "header", "manifest_sha256": prepared.manifest_sha256,
              "protocol": gen_header.get("protocol"), "task": prepared.manifest["task"]}
    records, f = open_log(out_path, header)
    problems = {p.id: p for p in prepared.problems()}
    done = {r["id"] for r in records}
    todo = [g for g in generations if g["id"] not in done]
    unknown = [g["id"] for g in todo if g["id"] not in problems]
    if unknown:
        f.close()
        raise ValueError(f"{generations_path} holds ids not in {prepared_dir}: {unknown[:5]}")
    pairs = [(problems[g["id"]], g["completion"]) for g in todo]
    with f, tqdm(total=len(generations), initial=len(generations) - len(todo),
                 disable=not progress, desc=f"score {prepared.manifest['task']}", unit="problem") as bar:
        def write(verdict) -> None:
            bar.update(1)
            if verdict.error and reward_errors == "raise":
                return  # not written: RewardError follows, and a rerun scores it again
            g = todo[verdict.index]
            record = {"type": "score", "id": g["id"], "score": verdict.score, "error": verdict.error,
                      **{k: g.get(k) for k in ("n_tokens", "forwards", "forwards_no_commit")}}
            append(f, record)
            records.append(record)

        rewards(task, pairs, reward_errors=reward_errors, workers=workers, timeout_s=timeout_s, on_verdict=write)
    result = aggregate(records, n_expected=len(prepared.rows))
    result["task"] = prepared.manifest["task"]
    return result
