"""ORL from a weak base (issue 30, docs/method.md 3.10): the collapse in miniature and the safeguards.

A `tiny` model trained for seconds on a reverse-the-digits family (tests/fixtures/weak_family.py) solves
about two thirds of its held-out problems; ORL from it with few rollouts a step and a step too large for
that batch leaves it solving none -- the failure the outside check saw, where more SFT kept the base.
With the held-out accuracy guard and the verified-batch floor (the recipes' defaults), the run ends
where it started. Also: a guard that trips resumes exactly, and a guard and floor that never act
change nothing, bit for bit.
"""
import json
import os

import pytest
import torch

from orl.decode import DecodeConfig
from orl.train.loop import EXTRA_ROUNDS, ORLConfig, _round_ids, train_orl
from orl.train.losses import LossConfig

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
TASK, KW = "weak_family:make_reverse", {"n_test": 64}
EVAL = DecodeConfig(rule="threshold", block_size=8, max_new_tokens=8, threshold=0.9, temperature=0.0)


@pytest.fixture(scope="module")
def start(tmp_path_factory):
    """A tiny base after 200 SFT steps (about 65 % held-out) and its gamma-8 ORL start model."""
    from orl.model.convert import make_orl_start
    from orl.train.sft import SFTConfig, SFTStage, train_sft
    d = tmp_path_factory.mktemp("weak")
    mp = pytest.MonkeyPatch()
    mp.syspath_prepend(FIXTURES)
    cfg = SFTConfig(size="tiny", task=TASK, task_kwargs=KW, batch_size=32, weighting="flat", out=str(d / "sft"),
                    stages=[SFTStage("diffusion", 160, lr=3e-3, selfcond=0.0, warmup=10),
                            SFTStage("selfcond", 40, lr=1e-3, selfcond=0.5, warmup=5)],
                    save_every=10_000, log_every=10_000, eval_n=0)
    make_orl_start(train_sft(cfg, resume=False, quiet=True, loggers=()), str(d / "start"), 8.0)
    yield str(d / "start")
    mp.undo()


def _accuracy(model_dir: str) -> float:
    from orl.eval.heldout import evaluate
    from orl.model import load_pretrained
    from orl.tasks.registry import get_task
    from orl.tokenizer import load_tokenizer
    task = get_task(TASK, **KW)
    with torch.no_grad():
        return evaluate(load_pretrained(model_dir).eval(), load_tokenizer(model_dir), task, task.problems("test"),
                        EVAL)["accuracy"]


def _cfg(start: str, out: str, **kw) -> ORLConfig:
    """ORL with 4 prompts x 4 rollouts a step and a peak LR of the base's SFT (1e-3): a step as large as
    SFT's from a batch of a few verified responses."""
    return ORLConfig(init=start, task=TASK, task_kwargs=KW, steps=10, prompts_per_step=4, group_size=4, lr=1e-3,
                     warmup=1, states_per_response=4, max_row_tokens=256,
                     loss=LossConfig(lambda_kl=0.3, kl_gate_tau=0.3),
                     decode=DecodeConfig(rule="threshold", block_size=8, max_new_tokens=8, threshold=0.9,
                                         temperature=0.3),
                     eval_decode=EVAL, out=out, save_every=100, **kw)


def _rows(out: str) -> list[dict]:
    return [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]


def test_a_weak_base_collapses_without_the_safeguards_and_not_with_them(start, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(FIXTURES)
    before = _accuracy(start)
    assert 0.4 <= before <= 0.9                                                     # a middling base
    plain = train_orl(_cfg(start, str(tmp_path / "plain")), resume=False, quiet=True, loggers=())
    assert _accuracy(plain) < before - 0.3                                          # the failure exists
    fixed = train_orl(_cfg(start, str(tmp_path / "fixed"), min_verified=8, guard_every=5, guard_n=64,
                           guard_drop=0.05), resume=False, quiet=True, loggers=())
    assert _accuracy(fixed) >= before - 0.05                                        # and the safeguards hold it
    rows = _rows(str(tmp_path / "fixed"))
    checks = [r for r in rows if "guard_accuracy" in r]
    assert [r["step"] for r in checks] == [5, 10] and not all(r["guard_ok"] for r in checks)   # the guard acted
    assert all(r["verified"] >= 8 or r["rollout_rounds"] == 4 for r in rows)       # the floor filled the batches


def test_a_tripping_guard_resumes_exactly(start, tmp_path, monkeypatch):
    from orl.model.checkpoint import read_state_dict
    monkeypatch.syspath_prepend(FIXTURES)
    kw = dict(guard_every=3, guard_n=32, guard_drop=0.05, min_verified=6, max_rollout_rounds=2)
    full = _cfg(start, str(tmp_path / "full"), **kw)
    full.steps, full.save_every = 7, 2
    train_orl(full, resume=False, quiet=True, loggers=())
    cut = _cfg(start, str(tmp_path / "cut"), **kw)
    cut.steps, cut.save_every = 7, 2
    train_orl(cut, resume=False, quiet=True, stop_after=5, loggers=())   # last checkpoint: step 4, after a trip at 3
    train_orl(cut, resume=True, quiet=True, loggers=())
    a, b = read_state_dict(str(tmp_path / "full" / "final")), read_state_dict(str(tmp_path / "cut" / "final"))
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    strip = lambda rows: [{k: v for k, v in r.items() if not k.endswith("_per_s")} for r in rows]  # noqa: E731
    ra, rb = strip(_rows(str(tmp_path / "full"))), strip(_rows(str(tmp_path / "cut")))
    assert ra == rb
    assert ra[2]["guard_ok"] == 0.0 and ra[2]["guard_lr_scale"] == 0.5                   # it tripped before the cut


def test_a_guard_and_floor_that_never_act_change_nothing(tmp_path, monkeypatch):
    from test_train import _coin, _start, _weights
    from orl.recipes.orl_arith import orl_arith_smoke
    monkeypatch.syspath_prepend(FIXTURES)
    s = _start(tmp_path)                  # every step of the 4-step run has verified rollouts (test_train)
    runs = {}
    for name, kw in (("plain", {}), ("safe", dict(guard_every=2, guard_n=8, guard_drop=1.0, min_verified=1))):
        cfg = _coin(orl_arith_smoke(s, str(tmp_path / name)))
        cfg.steps = 4
        for k, v in kw.items():
            setattr(cfg, k, v)
        train_orl(cfg, resume=False, quiet=True, loggers=())
        runs[name] = _rows(str(tmp_path / name))
    assert all(r["verified"] >= 1 for r in runs["plain"])
    for p, q in zip(runs["plain"], runs["safe"], strict=True):
        assert {k: v for k, v in q.items() if k in p and not k.endswith("_per_s")} == \
            {k: v for k, v in p.items() if not k.endswith("_per_s")}
        assert q["rollout_rounds"] == 1 and q["verified_lr_scale"] == 1.0
    assert [r["guard_ok"] for r in runs["safe"] if "guard_ok" in r] == [1.0, 1.0]
    a, b = _weights(tmp_path / "plain" / "final"), _weights(tmp_path / "safe" / "final")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_extra_rounds_draw_fresh_prompts_and_a_short_batch_takes_a_smaller_step(tmp_path, monkeypatch):
    from test_train import _coin, _start
    from orl.recipes.orl_arith import orl_arith_smoke
    cfg = ORLConfig(prompts_per_step=8, max_rollout_rounds=4)
    seen = [set(_round_ids(s, r, cfg)) for s in range(3) for r in range(4)]
    assert sum(map(len, seen)) == len(set().union(*seen)) == 96                  # disjoint across steps and rounds
    assert min(_round_ids(0, 1, cfg)) >= EXTRA_ROUNDS and _round_ids(2, 0, cfg) == range(16, 24)
    monkeypatch.syspath_prepend(FIXTURES)
    run = _coin(orl_arith_smoke(_start(tmp_path), str(tmp_path / "short")))
    run.steps, run.min_verified, run.max_rollout_rounds = 2, 100, 2                # a floor no step reaches
    train_orl(run, resume=False, quiet=True, loggers=())
    for r in _rows(str(tmp_path / "short")):
        assert r["rollout_rounds"] == 2 and 0 < r["verified_lr_scale"] == r["verified"] / 100 < 1
