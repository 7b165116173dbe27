"""One reward path for training and evaluation (orl.eval.pool.rewards): a verifier that raises,
hangs, or returns NaN / inf / 2.0 / -5 / None / a string is an error naming the task, problem and
value -- on the training path (rollout_group) and the evaluation paths (heldout.evaluate,
score_jsonl) alike -- or, when asked, a counted 0; tables never show NaN or more than 100 %;
``\\$18`` is 18; verifier workers die with their parent (kill -9) and hold none of its pipe ends."""
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from orl.decode import DecodeConfig
from orl.eval import pool as P
from orl.eval.generate import generate_jsonl
from orl.eval.heldout import evaluate
from orl.eval.jsonlog import read_log
from orl.eval.prepare import load_prepared, prepare
from orl.eval.score import aggregate, score_jsonl
from orl.eval.table import main_table
from orl.model import build_model, get_config
from orl.tasks.arith import ArithTask
from orl.tasks.base import Problem
from orl.tasks.gsm8k import GSM8K
from orl.tasks.math500 import MATH500
from orl.tokenizer import build_char_tokenizer
from orl.train.rollout import rollout_group

# mode -> what the message must show (the value, or the failure)
MODES = {"raise": "RuntimeError: verifier bug", "hang": "timeout", "nan": "returned nan", "two": "returned 2.0",
         "inf": "returned inf", "neg": "returned -5", "none": "returned None", "str": "returned '1' (a str)",
         "memory": "MemoryError"}
VALUES = {"nan": math.nan, "two": 2.0, "inf": math.inf, "neg": -5, "none": None, "str": "1"}
DCFG = DecodeConfig(rule="threshold", block_size=8, max_new_tokens=8, temperature=1.0, threshold=0.5)


class BadTask:
    """A task whose verifier fails in one way (``mode``), or scores like arith's when mode is "ok"."""

    name = "bad"

    def __init__(self, mode: str):
        self.mode = mode

    def sample(self, split, index):
        return Problem(f"{split}-{index}", f"{index}+1=", answer=index + 1)

    def problems(self, split):
        return [self.sample(split, i) for i in range(4)]

    def verify(self, problem, completion):
        if self.mode == "raise":
            raise RuntimeError("verifier bug")
        if self.mode == "hang":
            time.sleep(10)
        if self.mode == "slow":
            time.sleep(0.05)
        if self.mode == "memory":
            return float(len(bytearray(1 << 30)) > 0)  # 1 GiB: over the pool's limit in these tests
        return VALUES.get(self.mode, 1.0)


@pytest.fixture(scope="module")
def tiny():
    tok = build_char_tokenizer()
    cfg = get_config("sdar", "tiny", vocab_size=len(tok), mask_token_id=tok.mask_token_id, block_size=8)
    return build_model(cfg, seed=0).eval(), tok


def _verifier(task):
    """Where the mode needs one, a pool with a short timeout and a small memory limit; else None:
    the callers' default path (a pool per call, default limits)."""
    if task.mode not in ("hang", "memory"):
        return contextlib.nullcontext(None)
    return P.VerifierPool(task, workers=2, timeout_s=0.5, memory_mb=256)


@pytest.mark.parametrize("mode", list(MODES))
def test_training_rewards_name_the_task_problem_and_value(tiny, mode):
    model, tok = tiny
    task = BadTask(mode)
    prob = task.sample("train", 7)
    with _verifier(task) as pool:
        kw = {} if pool is None else {"verifier": pool}
        with pytest.raises(ValueError) as e:  # orl.eval.pool.RewardError
            rollout_group(model, tok, task, prob, 2, DCFG, generator=torch.Generator().manual_seed(0), topk=0, **kw)
        msg = str(e.value)
        assert "task 'bad'" in msg and "problem 'train-7'" in msg and MODES[mode] in msg, msg
        assert "2 of 2" in msg and "reward_errors='zero'" in msg
        rolls = rollout_group(model, tok, task, prob, 2, DCFG, generator=torch.Generator().manual_seed(0), topk=0,
                              reward_errors="zero", **kw)
    assert [r.reward for r in rolls] == [0.0, 0.0]
    assert sum(bool(r.reward_error) for r in rolls) == 2 and all(MODES[mode] in r.reward_error for r in rolls)


@pytest.mark.parametrize("mode", list(MODES))
def test_heldout_evaluation_names_the_task_problem_and_value(tiny, mode):
    model, tok = tiny
    task = BadTask(mode)
    greedy = DecodeConfig(rule="threshold", block_size=8, max_new_tokens=8, threshold=0.5)
    with _verifier(task) as pool:
        kw = {} if pool is None else {"verifier": pool}
        with pytest.raises(ValueError) as e:
            evaluate(model, tok, task, task.problems("test")[:2], greedy, **kw)
        msg = str(e.value)
        assert "task 'bad'" in msg and "problem 'test-0'" in msg and MODES[mode] in msg, msg
        r = evaluate(model, tok, task, task.problems("test")[:2], greedy, reward_errors="zero", **kw)
    assert r["accuracy"] == 0.0 and r["n"] == 2 and r["n_errors"] == 2
    assert all(MODES[mode] in x["error"] and x["correct"] == 0.0 for x in r["records"])


@pytest.fixture(scope="module")
def gsm8k8(tmp_path_factory):
    """Eight prepared GSM8K problems and generations answering each correctly, the first three boxed."""
    d = tmp_path_factory.mktemp("gsm8k8")
    prepared = prepare("gsm8k", d / "prepared", limit=8)
    answers = {r["prompt"]: r["answer"] for r in load_prepared(prepared).rows}
    calls = []

    def model(prompt):
        calls.append(prompt)
        a = answers[prompt]
        text = f"The answer is $\\boxed{{{a}}}$." if len(calls) <= 3 else f"#### {a}"
        return {"completion": text, "n_tokens": 8, "forwards": 4, "forwards_no_commit": 3, "latency_s": 0.0}

    gen = d / "gen.jsonl"
    generate_jsonl(prepared, gen, model, {"model": "fake"}, progress=False)
    return prepared, gen


class BonusGSM8K(GSM8K):
    """A user's GSM8K reward with a format bonus: 1 for the right number, +1 more for a box (2.0)."""

    def verify(self, problem, completion):
        return super().verify(problem, completion) + float("\\boxed" in completion)


class NaNGSM8K(GSM8K):
    def verify(self, problem, completion):
        return math.nan if "\\boxed" in completion else super().verify(problem, completion)


def test_scores_above_one_are_refused_not_published_as_137_5_percent(gsm8k8, tmp_path):
    """How a 137.5 % GSM8K row arises: a verifier with a format bonus scores the 3 boxed right
    answers 2.0 and the 5 others 1.0, and the mean (3 * 2 + 5) / 8 = 1.375 was published. Those
    scores are now refused, naming the task, problem and value, or counted as errors."""
    prepared, gen = gsm8k8
    with pytest.raises(ValueError) as e:
        score_jsonl(gen, prepared, tmp_path / "s.jsonl", task=BonusGSM8K(), workers=2, progress=False)
    msg = str(e.value)
    assert "task 'gsm8k'" in msg and "returned 2.0" in msg and "3 of 8" in msg and "problem 'gsm8k/test/0'" in msg
    zero = score_jsonl(gen, prepared, tmp_path / "z.jsonl", task=BonusGSM8K(), workers=2, progress=False,
                       reward_errors="zero")
    assert zero["n"] == 8 and zero["n_errors"] == 3 and zero["accuracy"] == 5 / 8
    # the raised run kept its 5 valid scores; the 3 failed ones are scored by a rerun with a fixed verifier
    assert sorted(r["id"] for r in read_log(tmp_path / "s.jsonl")[1]) == [f"gsm8k/test/{i}" for i in range(3, 8)]
    again = score_jsonl(gen, prepared, tmp_path / "s.jsonl", workers=2, progress=False)
    assert again["n"] == 8 and again["accuracy"] == 1.0 and again["n_errors"] == 0
    # a table is never fed a fraction above 1 (an old scored log, a hand-made result)
    rows = [{"id": f"p{i}", "score": 2.0 if i < 3 else float(i < 7)} for i in range(8)]
    with pytest.raises(ValueError, match="'p0' has score 2.0"):
        aggregate(rows)
    with pytest.raises(ValueError, match=r"'gsm8k'.*1.375.*not a fraction"):
        main_table({"gsm8k": {"accuracy": 1.375, "tpf": 2.0, "n": 8}}, "sdar", "base")
    with pytest.raises(ValueError, match="'p1' appears twice"):
        aggregate([{"id": "p1", "score": 1.0}, {"id": "p1", "score": 1.0}])


def test_nan_scores_and_empty_sets_are_refused_not_published(gsm8k8, tmp_path, tiny):
    prepared, gen = gsm8k8
    with pytest.raises(ValueError, match=r"(?s)task 'gsm8k'.*returned nan"):
        score_jsonl(gen, prepared, tmp_path / "s.jsonl", task=NaNGSM8K(), workers=2, progress=False)
    with pytest.raises(ValueError, match="has score nan"):
        aggregate([{"id": "p0", "score": math.nan}])
    with pytest.raises(ValueError, match=r"'math500'.*nan"):
        main_table({"math500": {"accuracy": math.nan, "n": 5}}, "sdar", "base")
    # nothing scored: no number at all ("–"), never 0 % or NaN
    assert aggregate([])["accuracy"] is None
    md, data = main_table({"gsm8k": {"accuracy": 0.0, "n": 0}}, "sdar", "base")
    assert data["tasks"]["gsm8k"]["ours"]["accuracy"] is None and "| GSM8K | – |" in md
    empty = tmp_path / "empty.jsonl"  # a generations file with its header and no record yet
    empty.write_text(json.dumps({"type": "header", "protocol": {"model": "fake"},
                                 "manifest_sha256": load_prepared(prepared).manifest_sha256}) + "\n")
    with pytest.raises(ValueError, match="no generations"):
        score_jsonl(empty, prepared, tmp_path / "e.jsonl", progress=False)
    model, tok = tiny
    with pytest.raises(ValueError, match="no problems of task 'bad'"):
        evaluate(model, tok, BadTask("ok"), [], DCFG)


@pytest.mark.parametrize("task", [GSM8K(), MATH500()], ids=["gsm8k", "math500"])
def test_escaped_dollar_is_a_currency_sign(task):
    p = Problem("x", "q", "18")
    right = ["The answer is \\$18.", "\\$18", "#### \\$18", "She paid \\$18 in total.", "costs \\$4 + \\$14 = \\$18",
             "The total is $\\$18$."]
    wrong = ["The answer is \\$19.", "\\$17"]
    assert [task.verify(p, c) for c in right + wrong] == [1.0] * len(right) + [0.0] * len(wrong)
    assert P.verify_all(task, [(p, c) for c in right], workers=2) == [1.0] * len(right)  # the reward path
    assert task.verify(Problem("y", "q", "1234"), "\\$1,234") == 1.0
    assert task.verify(Problem("z", "q", "-5"), "It is -\\$5.") == 1.0
    assert task.verify(Problem("w", "q", "3"), "a \\\\$x$ so \\$3") == 1.0  # "\\$" is a line break, then math


def test_training_and_evaluation_share_the_validated_rewards(tiny):
    """A good task: the rewards of rollout_group are task.verify's own values, unchanged, and
    evaluation's records agree with them on the same completions."""
    model, tok = tiny
    task = ArithTask(terms=2, digits=1)
    prob = task.sample("train", 3)
    with P.VerifierPool(task, workers=2) as pool:
        rolls = rollout_group(model, tok, task, prob, 4, DCFG, generator=torch.Generator().manual_seed(1), topk=0,
                              verifier=pool)
        pids = pool.pids()
        texts = [r.text for r in rolls]
        again = P.rewards(task, [(prob, t) for t in texts + [prob.meta.get("solution") or f"#{prob.answer}"]],
                          pool=pool)
        assert pool.pids() == pids  # the same persistent workers
    assert [r.reward for r in rolls] == [float(task.verify(prob, t)) for t in texts] == again.scores[:4]
    assert again.scores[-1] == 1.0 and again.n_errors == 0 and all(r.reward_error == "" for r in rolls)
    with pytest.raises(ValueError, match="verifies task 'arith'"):
        P.rewards(BadTask("ok"), [], pool=P.VerifierPool(task))
    with pytest.raises(ValueError, match="reward_errors must be one of"):
        rollout_group(model, tok, task, prob, 2, DCFG, topk=0, reward_errors="ignore")


def test_check_reward_accepts_floats_bools_and_0_1():
    import numpy as np
    for ok in (0.0, 1.0, 0.25, True, False, 0, 1, np.float32(0.5), np.bool_(True), np.int64(1), torch.tensor(1.0)):
        score, why = P.check_reward(ok)
        assert why == "" and score == float(ok) and type(score) is float, ok
    for bad in (2, -5, 1.5, -0.0001, math.nan, math.inf, -math.inf, None, "1", [1.0], torch.tensor([1.0]), 2.0):
        score, why = P.check_reward(bad)
        assert score == 0.0 and why.startswith("verify returned"), bad


def _socket_inodes(pid: int) -> set[str]:
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:"):
            out.add(link)
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_workers_hold_none_of_the_parents_pipe_ends():
    task = BadTask("slow")
    with P.VerifierPool(task, workers=3) as pool:  # 50 ms an item: all three start, each forked after the last
        assert P.rewards(task, [(task.sample("test", 0), "x")] * 6, pool=pool).scores == [1.0] * 6
        assert len(pool.pids()) == 3
        parent_ends = {f"socket:[{os.fstat(s.conn.fileno()).st_ino}]" for s in pool._slots}
        assert len(parent_ends) == 3
        for pid in pool.pids():
            assert not parent_ends & _socket_inodes(pid), pid


CHILD = r"""
import os, sys, time
from orl.eval.pool import verify_all
from orl.tasks.base import Problem

class Slow:
    name = "slow"
    def problems(self, split):
        return []
    def verify(self, problem, completion):
        open(os.path.join(sys.argv[1], f"busy.{os.getpid()}"), "w").close()
        time.sleep(30)
        return 1.0

verify_all(Slow(), [(Problem("p", "q", None), "x")] * 4, workers=2)
"""


def _group(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid``."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in "ZX":
            out.append(int(d))
    return out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc, PR_SET_PDEATHSIG")
def test_kill_9_during_scoring_leaves_no_worker(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    import orl  # the child imports the orl under test, not whatever its script directory finds first
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(orl.__file__))}
    child = subprocess.Popen([sys.executable, str(script), str(tmp_path)], start_new_session=True, env=env)
    try:
        deadline = time.monotonic() + 30
        while len(list(tmp_path.glob("busy.*"))) < 2:  # both workers are inside verify
            assert child.poll() is None and time.monotonic() < deadline, "the child never started scoring"
            time.sleep(0.02)
        workers = {int(p.name.split(".")[1]) for p in tmp_path.glob("busy.*")}
        assert workers <= set(_group(child.pid))
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        t = time.monotonic()
        while _group(child.pid) and time.monotonic() - t < 3:
            time.sleep(0.05)
        left = _group(child.pid)
        assert not left, f"{len(left)} verifier processes outlived their killed parent: {left}"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        for pid in _group(child.pid):  # what the old pool left behind
            os.kill(pid, signal.SIGKILL)
