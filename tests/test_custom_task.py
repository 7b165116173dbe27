"""A user's own task end to end: a task file in its own folder, a JSONL of prompt/answer records with
each verifier, options only from the user, SFT's held-out check (and its warning), ORL's share of
steps without a verified rollout (bar, metrics, warning, across a resume), and `orl eval heldout`."""
import argparse
import json

import pytest
import torch

from orl.tasks.registry import get_task
from test_rft import _start  # the tiny ORL start model

TASK_FILE = '''
import random
from orl.tasks import Problem
from helper import PREFIX          # a sibling module: the task's folder is importable


class Copy:
    name = "copy"

    def __init__(self, n: int = 4, verified: bool = True):
        self.n, self.verified = n, verified

    def sample(self, split, index):
        s = "".join(random.Random(f"{split}:{index}").choice("abc") for _ in range(self.n))
        return Problem(id=f"{split}-{index}", prompt=f"{PREFIX}{s}=", answer=s)

    def problems(self, split):
        return [self.sample(split, i) for i in range(16)]

    def solution(self, problem):
        return problem.answer

    def verify(self, problem, completion):
        return float(self.verified and completion.strip() == problem.answer)


def make_task(n: int = 4, verified: bool = True):
    return Copy(n, verified)
'''


@pytest.fixture(scope="module")
def task_file(tmp_path_factory):
    """One file for the module (a module name is imported once per process); its folder and modules
    are taken off the import path afterwards."""
    import sys
    folder = tmp_path_factory.mktemp("mytask")
    (folder / "helper.py").write_text('PREFIX = "copy "\n')
    (folder / "usertask_copy.py").write_text(TASK_FILE)
    yield str(folder / "usertask_copy.py")
    for name in ("usertask_copy", "helper"):
        sys.modules.pop(name, None)
    while str(folder) in sys.path:
        sys.path.remove(str(folder))


def test_task_file_in_its_own_folder_and_options_only_from_the_user(task_file):
    from orl.recipes import get_recipe
    from orl.train.sft import SFTConfig
    from orl.train.sft_cli import configure
    task = get_task(f"{task_file}:make_task", n=3)
    assert task.sample("train", 0).prompt.startswith("copy ") and len(task.sample("train", 0).answer) == 3
    with pytest.raises(TypeError, match="task options come only from you"):
        get_task(f"{task_file}:make_task", terms=4)        # the arith recipe's option, given to this task
    assert get_recipe("arith_sft").task_kwargs == {"terms": 4, "digits": 1}
    ns = dict(recipe="arith_sft", out=None, set=[], verifier=None, task_kw=[])
    cfg = configure(SFTConfig, argparse.Namespace(**ns, task=f"{task_file}:make_task"))
    assert cfg.task == f"{task_file}:make_task" and cfg.task_kwargs == {}   # the recipe's options dropped
    cfg = configure(SFTConfig, argparse.Namespace(**{**ns, "task_kw": ["n=5"]}, task=f"{task_file}:make_task"))
    assert cfg.task_kwargs == {"n": 5}
    cfg = configure(SFTConfig, argparse.Namespace(**{**ns, "set": [f"task={task_file}:make_task"]}, task=None))
    assert cfg.task_kwargs == {}                                          # --set task=... drops them too
    cfg = configure(SFTConfig, argparse.Namespace(**{**ns, "task_kw": ["digits=2"]}, task=None))
    assert cfg.task_kwargs == {"terms": 4, "digits": 2}                   # the recipe's own task keeps them
    with pytest.raises(ValueError, match="--verifier applies to a data-file task"):
        configure(SFTConfig, argparse.Namespace(**{**ns, "verifier": "math"}, task=f"{task_file}:make_task"))


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_jsonl_task_splits_samples_and_verifiers(tmp_path):
    rows = [{"prompt": f"q{i}", "answer": str(i)} for i in range(40)] + [{"prompt": "pin", "answer": "7",
                                                                         "split": "test", "id": "pinned"}]
    data = _write(tmp_path / "qa.jsonl", rows)
    t = get_task(data)
    assert t.name == "qa" and t.verifier == "exact"
    test, train = t.problems("test"), t.problems("train")
    assert {p.id for p in test} | {p.id for p in train} == {f"line-{i}" for i in range(1, 41)} | {"pinned"}
    assert "pinned" in {p.id for p in test} and not {p.id for p in test} & {p.id for p in train}
    assert [p.id for p in get_task(data, held_out=0.1).problems("test")] == [p.id for p in test]  # deterministic
    assert len(test) == 1 + sum(1 for i in range(1, 41) if _unit(f"line-{i}") < 0.1)
    n = len(train)
    first, second = [t.sample("train", i).id for i in range(n)], [t.sample("train", n + i).id for i in range(n)]
    assert sorted(first) == sorted(second) == sorted(p.id for p in train) and first != second  # reshuffled passes
    pin = next(p for p in test if p.id == "pinned")
    assert t.verify(pin, " 7\n") == 1.0 and t.verify(pin, "7.0") == 0.0 and t.solution(pin) == "7"
    m = get_task(data, verifier="math")
    assert m.verify(pin, "so the answer is 7.0") == 1.0 and m.verify(pin, "8") == 0.0
    code = get_task(_write(tmp_path / "code.jsonl", [
        {"id": "add", "prompt": "write add(a, b)", "answer": "assert add(1, 2) == 3\nassert add(-1, 1) == 0",
         "solution": "def add(a, b):\n    return a + b", "split": "test"},
        {"id": "nosol", "prompt": "write neg(a)", "answer": "assert neg(1) == -1"}]), verifier="code")
    add = code.problems("test")[0]
    assert code.verify(add, "```python\ndef add(a, b):\n    return a + b\n```") == 1.0
    assert code.verify(add, "def add(a, b):\n    return a - b") == 0.0
    with pytest.raises(TypeError, match="no 'solution'"):
        code.solution(code.problems("train")[0])
    with pytest.raises(ValueError, match="record 1 lacks answer"):
        get_task(_write(tmp_path / "bad.jsonl", [{"prompt": "a", "answer": "b"}, {"prompt": "c"}])).problems("train")
    with pytest.raises(ValueError, match="share the id"):
        get_task(_write(tmp_path / "dup.jsonl", [{"id": "x", "prompt": "a", "answer": "b"}] * 2)).problems("train")
    with pytest.raises(ValueError, match="no 'test' records"):
        get_task(_write(tmp_path / "tr.jsonl", [{"prompt": "a", "answer": "b", "split": "train"}])).problems("test")
    with pytest.raises(ValueError, match="verifier must be one of"):
        get_task(data, verifier="fuzzy")


def _unit(text):
    import hashlib
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") / 2.0 ** 64


def test_sft_heldout_check_is_invisible_and_warns_near_chance(tmp_path, capfd):
    from orl.recipes.arith import arith_sft_smoke
    from orl.train.sft import train_sft
    from orl.model.checkpoint import read_state_dict
    data = _write(tmp_path / "echo.jsonl", [{"prompt": f"say {i}=", "answer": f"{i}{i}"} for i in range(30)])
    finals = {}
    for n in (0, 8):
        cfg = arith_sft_smoke(str(tmp_path / f"sft{n}"))
        cfg.task, cfg.task_kwargs, cfg.eval_n = data, {}, n
        finals[n] = train_sft(cfg, resume=False, quiet=True, loggers=())
    a, b = read_state_dict(finals[0]), read_state_dict(finals[8])
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)   # the check draws no training randomness
    n_test = min(8, len(get_task(data).problems("test")))
    err = capfd.readouterr().err
    assert err.count("warning: held-out accuracy after SFT is 0.0 %") == 1 and f"of {n_test} held-out problems" in err
    resolved = json.load(open(tmp_path / "sft8" / "resolved_config.json"))
    assert resolved["kind"] == "sft" and resolved["config"]["task"] == data and resolved["config"]["eval_n"] == 8

    from orl.cli import main
    assert main(["eval", "heldout", "--model", finals[8], "--task", data, "--show", "1", "--max-new-tokens", "8",
                 "--out", str(tmp_path / "h.json")]) == 0
    out = capfd.readouterr().out
    h = json.load(open(tmp_path / "h.json"))
    n_all = len(get_task(data).problems("test"))
    assert h["n"] == n_all and len(h["records"]) == n_all and out.count("--- line-") == 1 and "completion:" in out
    assert f"echo (test): accuracy {100 * h['accuracy']:.1f} %" in out


def test_orl_steps_without_a_verified_rollout_are_counted_and_warned(tmp_path, task_file, capfd):
    from orl.recipes.orl_arith import orl_arith_smoke
    from orl.train.loop import lr_factor, train_orl
    cfg = orl_arith_smoke(_start(tmp_path), str(tmp_path / "orl"))
    cfg.task, cfg.task_kwargs = f"{task_file}:make_task", {"verified": False}   # nothing ever verifies
    cfg.decode.max_new_tokens = cfg.eval_decode.max_new_tokens = 16
    train_orl(cfg, resume=False, quiet=True, stop_after=2, loggers=())
    train_orl(cfg, resume=True, quiet=True, loggers=())                        # steps 3 (after the resume at 2)
    rows = [json.loads(line) for line in open(tmp_path / "orl" / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [1, 2, 3] and not any("loss" in r for r in rows)
    assert [r["run"]["steps_without_update"] for r in rows] == [1, 2, 3]       # counted across the resume
    assert [r["run"]["no_verified_share"] for r in rows] == [1.0, 1.0, 1.0]
    assert [r["run"]["lr"] for r in rows] == [cfg.lr * lr_factor(s, cfg) for s in range(3)]
    err = capfd.readouterr().err
    assert "warning: 3 of 3 ORL steps (100 %) had no verified rollout" in err
    assert "warning: 2 of 2 ORL steps" in err                                  # the first call's end
