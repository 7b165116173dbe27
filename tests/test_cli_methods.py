"""`orl train --method rft | more_sft`: the two baselines from the command line, on a user's own task.

Each derives its config from an ORL recipe by the one derivation the suite's recipes use
(`orl.train.rft.rft_from_orl`, `orl.train.sft.more_sft_from`), then takes --set on the config that
runs; both run end to end on a tiny model (resume, resolved config, final model), a --set key the
method's config lacks is one line, Ctrl-C says how to resume, and benchmarks/suite_runs.py puts a
user's task into every stage.
"""
import argparse
import dataclasses
import json
import os
import shutil
import sys

import pytest

from orl.cli import main

TASK_FILE = '''
import random
from orl.tasks import Problem


class Echo:
    name = "echo"

    def __init__(self, n: int = 3, seed: int = 0):
        self.n, self.seed = n, seed

    def sample(self, split, index):
        rng = random.Random(f"{self.seed}:{split}:{index}")
        s = "".join(rng.choice("abc") for _ in range(self.n))
        return Problem(id=f"{split}-{index}", prompt=f"echo {s}=", answer=s)

    def problems(self, split):
        return [self.sample(split, i) for i in range(8)]

    def solution(self, problem):
        return problem.answer

    def verify(self, problem, completion):
        return float(completion.strip() == problem.answer)


def make_task(n: int = 3, seed: int = 0):
    return Echo(n, seed)


def make_fixed(n: int = 3):          # no seed option: more SFT has no fresh stream to draw from
    return Echo(n)
'''

RFT_SETS = ["steps=2", "prompts_per_step=2", "group_size=2", "decode.max_new_tokens=16", "eval_every=0",
            "save_every=1"]


@pytest.fixture(scope="module")
def task_file(tmp_path_factory):
    folder = tmp_path_factory.mktemp("methods_task")
    (folder / "usertask_methods.py").write_text(TASK_FILE)
    yield str(folder / "usertask_methods.py")
    sys.modules.pop("usertask_methods", None)
    while str(folder) in sys.path:
        sys.path.remove(str(folder))


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A tiny "SFT base" (random weights, a pathway, the character tokenizer saved beside it)."""
    from test_rft import _start
    return _start(tmp_path_factory.mktemp("base"))


def _sets(sets):
    return [x for s in sets for x in ("--set", s)]


def _one_line_error(capsys, argv) -> str:
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_rft_from_an_orl_recipe_runs_resumes_and_keeps_orls_budget(base, task_file, tmp_path, capsys):
    from orl.recipes import apply_overrides
    from orl.recipes.orl_arith import orl_arith
    out = str(tmp_path / "rft")
    argv = ["train", "--method", "rft", "--task", f"{task_file}:make_task", "--task-kw", "n=2", "--init", base,
            "--out", out, *_sets(RFT_SETS), "--logger", "none", "--quiet"]
    assert main([*argv, "--stop-after", "1"]) == 0
    assert os.path.isdir(os.path.join(out, "checkpoints", "step_00000001"))
    assert not os.path.exists(os.path.join(out, "final"))
    assert main(argv) == 0                                                    # resumes at step 1
    assert capsys.readouterr().out.strip().endswith(f"final model: {out}/final")
    assert os.path.exists(os.path.join(out, "final", "config.json"))
    assert [json.loads(x)["step"] for x in open(os.path.join(out, "metrics.jsonl"))] == [1, 2]
    resolved = json.load(open(os.path.join(out, "resolved_config.json")))
    cfg, orl = resolved["config"], apply_overrides(orl_arith(), RFT_SETS)    # the ORL recipe after the same --set
    assert resolved["kind"] == "rft"
    for k in ("steps", "prompts_per_step", "group_size", "lr", "warmup", "lr_schedule", "lr_final", "seed",
              "prompt_seed", "weight_decay", "grad_clip", "eval_n", "save_every"):
        assert cfg[k] == getattr(orl, k), k
    assert cfg["decode"] == dataclasses.asdict(orl.decode) and cfg["eval_decode"] == dataclasses.asdict(orl.eval_decode)
    assert cfg["decode"]["max_new_tokens"] == 16 and cfg["decode"]["temperature"] == 0.3
    assert (cfg["init"], cfg["task"], cfg["task_kwargs"]) == (base, f"{task_file}:make_task", {"n": 2})

    err = _one_line_error(capsys, [*argv, "--out", str(tmp_path / "bad"), "--set", "loss.rho=0.3"])
    assert "RFTConfig has no field 'loss'" in err                            # ORL's loss is not RFT's
    assert not os.path.exists(tmp_path / "bad")


def test_more_sft_from_an_orl_recipe_continues_the_base(base, task_file, tmp_path, capsys):
    out = str(tmp_path / "more")
    argv = ["train", "--method", "more_sft", "--task", f"{task_file}:make_task", "--init", base, "--out", out,
            *_sets(["stages.0.steps=2", "batch_size=4", "eval_n=0"]), "--logger", "none", "--quiet"]
    assert main(argv) == 0
    assert os.path.exists(os.path.join(out, "final", "config.json"))
    resolved = json.load(open(os.path.join(out, "resolved_config.json")))
    cfg = resolved["config"]
    assert resolved["kind"] == "sft"
    # arith_sft's last stage ends at 1e-3 x 0.1; orl_arith's warm-up and checkpoint cadence
    assert cfg["stages"] == [{"name": "more", "steps": 2, "lr": pytest.approx(1e-4), "block_size": None,
                              "selfcond": 0.5, "warmup": 5, "min_lr_ratio": 1.0}]
    assert (cfg["init"], cfg["tokenizer"], cfg["save_every"], cfg["batch_size"]) == (base, base, 50, 4)
    assert cfg["task"] == f"{task_file}:make_task" and cfg["task_kwargs"] == {"seed": 1}   # a fresh stream

    err = _one_line_error(capsys, [*argv, "--out", str(tmp_path / "bad"), "--set", "steps=2"])
    assert "SFTConfig has no field 'steps'" in err
    err = _one_line_error(capsys, [a for a in argv if a not in ("--init", base)])
    assert "--method more_sft from ORL recipe 'orl_arith' needs --init: the SFT base" in err


def test_the_derivations_are_the_suite_recipes_and_keep_orls_steps(task_file, base):
    from orl.recipes import get_recipe
    from orl.recipes.arith import arith_sft
    from orl.recipes.orl_arith import orl_arith
    from orl.recipes.suite import FAMILIES
    from orl.train.rft import rft_from_orl
    from orl.train.sft import more_sft_from
    b, o = "runs/x/sft/final", "runs/x/baseline"
    for fam in FAMILIES:
        orl, rft = get_recipe(f"orl_suite_{fam}", init=b, out=o), get_recipe(f"rft_suite_{fam}", init=b, out=o)
        assert rft.eval_every in (0, orl.eval_every)                         # the suite sweeps its models later
        assert dataclasses.replace(rft_from_orl(orl, b, o), eval_every=rft.eval_every) == rft, fam
        sft = get_recipe(f"suite_sft_{fam}", out=o)
        assert more_sft_from(orl, sft, b, o) == get_recipe(f"more_sft_suite_{fam}", init=b, out=o), fam
    orl = orl_arith()
    more = more_sft_from(orl, arith_sft(), b, o)
    assert more.total_steps == orl.steps == 350 and more.task_kwargs == {"terms": 4, "digits": 1, "seed": 1}
    orl.task, orl.task_kwargs = f"{task_file}:make_fixed", {"n": 2}
    assert more_sft_from(orl, arith_sft(), b, o).task_kwargs == {"n": 2}     # no seed option: none given
    orl.task, orl.task_kwargs = f"{task_file}:make_task", {"seed": 4}
    assert more_sft_from(orl, arith_sft(), b, o).task_kwargs == {"seed": 5}


def test_recipes_of_each_kind_notes_and_ctrl_c(base, task_file, tmp_path, capsys, monkeypatch):
    from orl.model.convert import make_orl_start
    from orl.train.loop_cli import build_parser, configure_baseline
    out = str(tmp_path / "never")
    err = _one_line_error(capsys, ["train", "--recipe", "rft_suite_chain", "--out", out])
    assert "run it with `orl train --method rft --recipe rft_suite_chain`" in err
    err = _one_line_error(capsys, ["train", "--method", "rft", "--recipe", "arith_sft", "--out", out])
    assert "is an SFT recipe" in err and "`orl sft --recipe arith_sft`" in err
    a = build_parser().parse_args(["--method", "rft", "--recipe", "rft_suite_chain", "--init", base, "--out", out,
                                   "--task", f"{task_file}:make_task", "--set", "steps=3"])
    cfg, _ = configure_baseline(a)                                            # an RFT recipe, as it is
    assert (cfg.init, cfg.steps, cfg.task, cfg.decode.block_size) == (base, 3, f"{task_file}:make_task", 32)
    start = str(tmp_path / "start")
    make_orl_start(base, start, 8.0)
    a = build_parser().parse_args(["--method", "more_sft", "--init", start, "--out", out, "--task",
                                   f"{task_file}:make_fixed"])
    cfg, _ = configure_baseline(a)
    assert cfg.task_kwargs == {} and "note: --init" in capsys.readouterr().err  # a rescaled pathway: a start?
    assert not os.path.exists(out)

    import orl.train.rft
    import orl.train.sft

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(orl.train.rft, "train_rft", interrupted)
    monkeypatch.setattr(orl.train.sft, "train_sft", interrupted)
    for method in ("rft", "more_sft"):
        assert main(["train", "--method", method, "--init", base, "--out", out, "--task", f"{task_file}:make_task",
                     "--quiet"]) == 130
        assert capsys.readouterr().err.strip() == ("orl train: interrupted; resume with the same command (from the "
                                                   "last checkpoint)")


def _suite_runs():
    import importlib
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    try:
        return importlib.import_module("suite_runs")
    finally:
        sys.path.pop(0)


def test_suite_runs_trains_and_sweeps_every_stage_on_the_users_task(base, task_file, tmp_path, monkeypatch):
    """Every stage's config carries the user's task (the trainers recorded, not run), and the sweep
    draws its problems from it (a task without verify_final: its final-only score is its verify)."""
    import orl.eval.frontier
    import orl.model.convert
    import orl.train.loop
    import orl.train.rft
    import orl.train.sft
    runs = _suite_runs()
    seen = {}

    def trainer(cfg, **kwargs):
        seen[os.path.basename(cfg.out)] = cfg
        shutil.copytree(base, os.path.join(cfg.out, "final"))
        return os.path.join(cfg.out, "final")
    for mod, name in ((orl.train.sft, "train_sft"), (orl.train.loop, "train_orl"), (orl.train.rft, "train_rft")):
        monkeypatch.setattr(mod, name, trainer)
    monkeypatch.setattr(orl.model.convert, "make_orl_start", lambda src, dst, gamma: shutil.copytree(src, dst))
    spec, kw = f"{task_file}:make_task", {"n": 2}
    dirs = runs.train_all("chain", str(tmp_path / "echo"), None, [0], [0], [], steps=2, ablations=["no_aec"],
                          sets_sft=["batch_size=16"], size="tiny", task=(spec, kw))
    assert sorted(dirs) == ["base", "more_sft", "no_aec_s0", "orl_s0", "rft"]
    assert sorted(seen) == ["more_sft", "no_aec_s0", "orl_s0", "rft", "sft_s0"]
    for name, cfg in seen.items():
        assert cfg.task == spec and cfg.task_kwargs == ({**kw, "seed": 1} if name == "more_sft" else kw), name
    ours, rft, more = seen["orl_s0"], seen["rft"], seen["more_sft"]
    assert (rft.steps, rft.prompts_per_step, rft.group_size, rft.decode) == (2, ours.prompts_per_step,
                                                                             ours.group_size, ours.decode)
    assert ours.decode.block_size == 32 and ours.decode.max_new_tokens == 64  # the chain recipes'
    assert (more.total_steps, more.batch_size, more.init, rft.init) == (2, 16, dirs["base"], dirs["base"])

    def fake_sweep(model, tok, task, problems, dcfg, values):
        assert task.name == "echo" and len(problems) == 3 and dcfg.block_size == 32
        records = [{"id": p.id, "completion": p.answer} for p in problems]
        return [{"value": v, "accuracy": 1.0, "tpf": 1.0, "records": records} for v in values]
    monkeypatch.setattr(orl.eval.frontier, "sweep", fake_sweep)
    rows = runs.sweep_all("chain", str(tmp_path / "echo"), {"base": dirs["base"]}, 3, [0.9], task=(spec, kw))
    assert rows["base"][0]["final"] == 1.0
