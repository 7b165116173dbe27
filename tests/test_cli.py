"""The `orl` command explains itself: every option's help and default, --version, what --role selects,
one-line errors with the fix (Ctrl-C, a recipe of the other kind, CUDA on a CPU torch, a task that does
not import, --set typos before any stage), the working directory importable, the run's resolved config,
TensorBoard hparams and lr, and the W&B logger (a stand-in module that records the calls)."""
import argparse
import glob
import json
import os
import subprocess
import sys
import types

import pytest
import torch

from orl.cli import HelpFormatter, main

PARSERS = {  # the commands whose parsers this package's CLI files own
    "demo": "orl.demo", "sft": "orl.train.sft_cli", "train": "orl.train.loop_cli", "eval": "orl.eval.cli",
    "generate": "orl.serve.generate_cli", "convert": "orl.model.convert",
}


def _all_parsers(ap: argparse.ArgumentParser):
    yield ap
    for action in ap._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _all_parsers(sub)


def test_every_option_has_help_and_its_default():
    import importlib
    for cmd, module in PARSERS.items():
        for ap in _all_parsers(importlib.import_module(module).build_parser()):
            assert issubclass(ap.formatter_class, HelpFormatter), ap.prog
            shown = ap.format_help()
            for a in ap._actions:
                if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
                    continue
                where = f"{ap.prog} {'/'.join(a.option_strings) or a.dest}"
                assert a.help and a.help.strip(), f"{where} has no help"
                takes_value = not isinstance(a, (argparse._StoreTrueAction, argparse._StoreConstAction))
                if not a.option_strings or a.required or not takes_value:
                    continue
                if a.default in (None, []):   # no value by default: the help must say what happens then
                    assert "default" in a.help.lower() or a.default == [], f"{where}: what does None mean?"
                else:
                    assert "default" in a.help.lower() or f"(default: {a.default})" in " ".join(shown.split()), where


def test_version(capsys):
    from importlib.metadata import PackageNotFoundError, version
    try:
        want = version("orl")
    except PackageNotFoundError:   # a source tree on PYTHONPATH (e.g. a GPU machine's copy): said, not guessed
        want = "unknown (not installed: pip install -e .)"
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"orl {want}"


def test_role_help_is_what_the_protocols_select():
    from orl.decode import protocol
    from orl.model import get_config
    from orl.serve.generate_cli import ROLE_HELP, ROLE_PROTOCOLS, check_role, describe_protocol
    for family, text in ROLE_PROTOCOLS.items():
        assert protocol(family, "base") == protocol(family, "orl")   # the help says so
        assert describe_protocol(protocol(family, "base")) == text and f"{family}: {text}" in ROLE_HELP
    check_role("base", get_config("sdar", "tiny", pathway="none"))
    check_role("orl", get_config("sdar", "tiny", pathway="mlp"))
    with pytest.raises(ValueError, match="--role orl means nothing for the model: in the sdar family both roles"):
        check_role("orl", get_config("sdar", "tiny", pathway="none"))


def _err(capsys, argv) -> tuple[int, str]:
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    return rc, err


def test_one_line_errors_name_the_fix(tmp_path, capsys, monkeypatch):
    out = str(tmp_path / "run")
    rc, err = _err(capsys, ["sft", "--recipe", "orl_arith", "--out", out])
    assert rc == 1 and len(err.splitlines()) == 1 and "run it with `orl train --recipe orl_arith`" in err
    rc, err = _err(capsys, ["train", "--recipe", "arith_sft", "--out", out])
    assert rc == 1 and "is an SFT recipe" in err and "orl sft --recipe arith_sft" in err
    rc, err = _err(capsys, ["sft", "--set", "stages.0.stepz=3", "--out", out])
    assert rc == 1 and "SFTStage has no field 'stepz'" in err
    rc, err = _err(capsys, ["sft", "--task", "no_such_module_xyz:make", "--out", out])
    assert rc == 1 and len(err.splitlines()) == 1 and "cannot import module 'no_such_module_xyz'" in err
    assert "working directory is importable" in err
    rc, err = _err(capsys, ["sft", "--task", "orl.tasks.arith:nope", "--out", out])
    assert rc == 1 and "has no attribute 'nope'" in err
    rc, err = _err(capsys, ["demo", "--out", out, "--set-orl", "loss.rhoo=0.3", "--quiet"])
    assert rc == 1 and "LossConfig has no field 'rhoo'" in err   # before the SFT stage ran
    assert not os.path.exists(os.path.join(out, "sft"))
    if torch.version.cuda is None:
        rc, err = _err(capsys, ["sft", "--set", "device=cuda", "--out", out])
        assert rc == 1 and "--set device=cuda, but this torch" in err and "CPU-only build" in err
        rc, err = _err(capsys, ["generate", "x", "--model", "sdar/tiny", "--device", "cuda"])
        assert rc == 1 and "--device cuda, but this torch" in err and "use --device cpu" in err
    assert not os.path.exists(out)   # nothing ran

    import orl.train.sft_cli as sft_cli

    def interrupted(argv):
        raise KeyboardInterrupt
    monkeypatch.setattr(sft_cli, "cli", interrupted)
    rc, err = _err(capsys, ["sft"])
    assert rc == 130 and err == "orl sft: interrupted; resume with the same command (from the last checkpoint)"


def test_the_installed_command_imports_tasks_from_the_working_directory(tmp_path):
    """`orl` (the console script, whose own folder is sys.path[0]) finds ./cwd_task_mod.py as `python -m` would."""
    (tmp_path / "cwd_task_mod.py").write_text("def make():\n    return object()\n")
    exe = os.path.join(os.path.dirname(sys.executable), "orl")
    if not os.path.exists(exe):
        pytest.skip(f"no console script at {exe}: orl is not installed here (pip install -e .)")
    r = subprocess.run([exe, "eval", "prepare", "--task", "cwd_task_mod:make", "--out", str(tmp_path / "o")],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": ""})
    assert r.returncode == 1, r.stderr
    assert r.stderr.strip().splitlines() == [r.stderr.strip()]   # one line, no traceback
    assert r.stderr.startswith("orl eval: error: cwd_task_mod:make() returned an invalid task")   # it imported


def _fake_wandb():
    runs = []

    class Run:
        def __init__(self, **kw):
            self.init, self.logged, self.finished = kw, [], False

        def log(self, values, step=None):
            self.logged.append((step, dict(values)))

        def finish(self):
            self.finished = True

    mod = types.ModuleType("wandb")
    mod.init = lambda **kw: runs.append(Run(**kw)) or runs[-1]
    return mod, runs


def _events(run_dir):
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    tags = {}
    for f in sorted(glob.glob(os.path.join(run_dir, "tb", "events.*"))):
        for e in EventFileLoader(f).Load():
            for v in e.summary.value:
                tags.setdefault(v.tag, []).append((e.step, v))
    return tags


def test_resolved_config_tensorboard_hparams_and_the_wandb_logger(tmp_path, monkeypatch):
    from orl.recipes.arith import arith_sft_smoke
    from orl.train.loggers import parse_loggers
    from orl.train.sft import lr_at, stage_at, train_sft
    fake, runs = _fake_wandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    cfg = arith_sft_smoke(str(tmp_path / "sft"))
    cfg.eval_n = 0
    train_sft(cfg, resume=False, quiet=True, stop_after=3, loggers=parse_loggers("tensorboard,wandb"))
    train_sft(cfg, resume=True, quiet=True, loggers=("tensorboard", "wandb"))   # a resume: the same W&B run
    resolved = json.load(open(tmp_path / "sft" / "resolved_config.json"))
    assert resolved["kind"] == "sft" and resolved["config"]["stages"][0]["steps"] == cfg.stages[0].steps
    assert resolved["config"]["out"] == cfg.out and resolved["orl_version"]
    assert len(runs) == 2 and runs[0].init["id"] == runs[1].init["id"] and runs[1].init["resume"] == "allow"
    assert runs[0].init["config"]["stages"][1]["selfcond"] == cfg.stages[1].selfcond
    assert all(r.finished for r in runs)
    logged = {step: v for r in runs for step, v in r.logged}
    assert sorted(logged) == [2, 4, 6, 8]   # log_every 2; the resume (from step 3) logs 4, 6, 8
    for step, v in logged.items():
        st, i = stage_at(cfg, step - 1)
        assert v["sft/lr"] == lr_at(st, i) and "sft/masked_token_acc" in v and "sft/token_acc" not in v
    tags = _events(str(tmp_path / "sft"))
    assert "_hparams_/experiment" in tags and "_hparams_/session_start_info" in tags
    assert b"stages.0.lr" in tags["_hparams_/session_start_info"][0][1].metadata.plugin_data.content
    assert sorted({s for s, _ in tags["sft/lr"]}) == [2, 4, 6, 8]
    with pytest.raises(ValueError, match="unknown; choose from tensorboard, wandb, none"):
        parse_loggers("tensorbord")
    monkeypatch.delitem(sys.modules, "wandb")
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None if name == "wandb" else object())
    with pytest.raises(ValueError, match=r"pip install 'orl\[wandb\]'"):
        parse_loggers("wandb")
