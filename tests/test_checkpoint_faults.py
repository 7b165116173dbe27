"""Checkpoints one can trust (orl.train.checkpoint), on the tiny recipes: a writer SIGKILLed at any
point of a checkpoint write resumes to the uninterrupted run's weights and optimizer state (SFT,
ORL, the off-policy ablation between two refreshes); an empty or dangling ``latest``, older
higher-numbered steps, a truncated trainer state, leftovers of dead writers, a second run on one
directory, a changed config, an unwritable or full disk: each a warning line or a clear error,
never a silent restart from step 0; ``metrics.jsonl`` holds each step once after a resume."""
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import traceback

import pytest
import torch

from orl.model.checkpoint import read_state_dict
from orl.recipes.arith import arith_sft_smoke
from orl.recipes.orl_arith import orl_arith_smoke
from orl.train import checkpoint as C
from orl.train import sft as S
from orl.train.loop import train_orl
from orl.train.rft import RFTConfig, train_rft
from orl.train.sft import train_sft

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
sys.path.insert(0, FIXTURES)
from coin_task import CoinTask  # noqa: E402
from test_train import _start  # noqa: E402 (the ORL start model: every step of a 4-step run has verified rollouts)

# ---- helpers


def _orl(start, out, stale=1):
    cfg = orl_arith_smoke(start, str(out))   # save_every 2
    cfg.task, cfg.task_kwargs = "coin_task:make_task", {}
    cfg.decode.max_new_tokens = cfg.eval_decode.max_new_tokens = 32
    cfg.steps, cfg.stale_every = 4, stale    # stale 3: the checkpoint of step 2 is between two refreshes
    return cfg


def _rft(start, out):
    from orl.decode import DecodeConfig  # noqa: PLC0415
    return RFTConfig(init=start, steps=4, prompts_per_step=2, group_size=3, lr=1e-3, warmup=1, out=str(out),
                     save_every=2, decode=DecodeConfig(rule="threshold", block_size=16, max_new_tokens=32,
                                                       threshold=0.9, temperature=1.0))


def _train(kind, cfg, **kw):
    if kind == "sft":
        return train_sft(cfg, quiet=True, **kw)
    if kind == "rft":
        return train_rft(cfg, quiet=True, task=CoinTask(), **kw)
    return train_orl(cfg, quiet=True, **kw)


def _state(ck):
    """A checkpoint's weights (HF files) and its DCP model + optimizer state, flattened."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save  # noqa: PLC0415
    out = {f"hf.{k}": v for k, v in read_state_dict(str(ck)).items()}
    with tempfile.TemporaryDirectory() as d:
        dcp_to_torch_save(os.path.join(str(ck), "dcp"), os.path.join(d, "s.pt"))
        flat = _flat(torch.load(os.path.join(d, "s.pt"), weights_only=False))
    out.update({f"dcp.{k}": v for k, v in flat.items()})
    return out


def _flat(x, key=""):
    if isinstance(x, dict | list | tuple):
        items = x.items() if isinstance(x, dict) else enumerate(x)
        return {k: v for n, sub in items for k, v in _flat(sub, f"{key}.{n}" if key else str(n)).items()}
    return {key: x}


def _same_state(a, b):
    assert set(a) == set(b)
    bad = [k for k in a if not (torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k])]
    assert not bad, f"differ: {bad[:8]}"
    assert any(k.startswith("dcp.optim.state") for k in a)   # the optimizer's moments are part of it


def _final_ck(out, step):
    return os.path.join(str(out), "checkpoints", f"step_{step:08d}")


def _leftovers(out):
    return sorted(os.path.relpath(os.path.join(d, n), str(out)) for d, ds, fs in os.walk(str(out)) for n in ds + fs
                  if n.startswith(".tmp-") or n.endswith(".tmp") or ".old-" in n)


def _kill_at(point, step, fn):
    """``fn()`` in a forked child whose checkpoint writer SIGKILLs itself at ``point`` of the save of ``step``."""
    pid = os.fork()
    if pid == 0:
        try:
            os.environ[C.FAULT_ENV] = f"{point}@{step}"
            fn()
        except BaseException:  # noqa: BLE001 - the child's failure shows in the parent's assertion
            traceback.print_exc()
        finally:
            os._exit(3)
    status = os.waitpid(pid, 0)[1]
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, \
        f"the writer was not killed at {point}@{step} (wait status {status})"


@pytest.fixture
def sft_steps(monkeypatch):
    """The SFT steps this test's runs take (each call of `sft_step`)."""
    calls, real = [], S.sft_step
    monkeypatch.setattr(S, "sft_step", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    """Uninterrupted runs: SFT (8 steps, checkpoints 3, 6, 8), ORL and off-policy ORL (4 steps,
    checkpoints 2, 4), RFT (4 steps); the state of each one's last checkpoint and its metrics."""
    d = tmp_path_factory.mktemp("ref")
    start = _start(d)
    cfgs = {"sft": arith_sft_smoke(str(d / "sft")), "orl": _orl(start, d / "orl"),
            "offpolicy": _orl(start, d / "offpolicy", stale=3), "rft": _rft(start, d / "rft")}
    out = {"start": start}
    for name, cfg in cfgs.items():
        _train("sft" if name == "sft" else "rft" if name == "rft" else "orl", cfg, resume=False)
        last = 8 if name == "sft" else 4
        rows = [json.loads(x) for x in open(d / name / "metrics.jsonl")] if name != "sft" else []
        out[name] = {"state": _state(_final_ck(d / name, last)), "metrics": rows}
    return out


# ---- a writer killed at each point of the checkpoint write


@pytest.mark.parametrize("point", C.FAULT_POINTS)
def test_sft_killed_while_checkpointing_resumes_exactly(tmp_path, ref, sft_steps, point, capfd):
    cfg = arith_sft_smoke(str(tmp_path / "run"))
    _kill_at(point, 6, lambda: train_sft(cfg, resume=False, quiet=True))
    ck = tmp_path / "run" / "checkpoints"
    assert (ck / "step_00000003" / C.MARKER).exists()
    assert (ck / "step_00000006" / C.MARKER).exists() == (point == "latest")   # complete only once renamed
    assert (open(ck / "latest").read() == "step_00000003")
    sft_steps.clear()
    capfd.readouterr()
    train_sft(cfg, resume=True, quiet=True)
    err = capfd.readouterr().err
    resumed = 6 if point == "latest" else 3
    assert len(sft_steps) == 8 - resumed                 # from the newest complete checkpoint, not from 0
    assert ("latest names step_00000003, older than step_00000006" in err) == (point == "latest")
    assert ("leftover" in err) == (point != "latest")   # the dead writer's folder was removed at the start
    assert _leftovers(tmp_path / "run") == []
    _same_state(_state(_final_ck(tmp_path / "run", 8)), ref["sft"]["state"])


@pytest.mark.parametrize("recipe,point", [("orl", "trainer"), ("orl", "latest"), ("offpolicy", "marker"),
                                          ("rft", "weights")])
def test_orl_and_rft_killed_while_checkpointing_resume_exactly(tmp_path, ref, recipe, point):
    kind = "rft" if recipe == "rft" else "orl"
    cfg = _rft(ref["start"], tmp_path / "run") if kind == "rft" else \
        _orl(ref["start"], tmp_path / "run", stale=3 if recipe == "offpolicy" else 1)
    _kill_at(point, 4, lambda: _train(kind, cfg, resume=False))
    _train(kind, cfg, resume=True)
    assert _leftovers(tmp_path / "run") == []
    _same_state(_state(_final_ck(tmp_path / "run", 4)), ref[recipe]["state"])
    steps = [json.loads(x)["step"] for x in open(tmp_path / "run" / "metrics.jsonl")]
    assert steps == [1, 2, 3, 4]


def test_offpolicy_resumes_exactly_between_two_refreshes(tmp_path, ref):
    """stale_every 3, save_every 2: the checkpoint of step 2 holds the stale policy of step 0."""
    cfg = _orl(ref["start"], tmp_path / "run", stale=3)
    train_orl(cfg, resume=False, quiet=True, stop_after=3)   # last checkpoint: step 2
    train_orl(cfg, resume=True, quiet=True)
    _same_state(_state(_final_ck(tmp_path / "run", 4)), ref["offpolicy"]["state"])


# ---- pointers, pruning, broken state


@pytest.mark.parametrize("latest", ["", "step_00000099"])
def test_empty_or_dangling_latest_falls_back_to_the_newest_complete(tmp_path, ref, sft_steps, latest, capfd):
    cfg = arith_sft_smoke(str(tmp_path / "run"))
    train_sft(cfg, resume=False, quiet=True, stop_after=6)   # checkpoints 3 and 6
    open(tmp_path / "run" / "checkpoints" / "latest", "w").write(latest)
    sft_steps.clear()
    capfd.readouterr()
    train_sft(cfg, resume=True, quiet=True)
    err = capfd.readouterr().err
    assert len(sft_steps) == 2                                # resumed at step 6
    assert "warning" in err and ("is empty" if not latest else "step_00000099, which does not exist") in err
    assert "step_00000006" in err
    _same_state(_state(_final_ck(tmp_path / "run", 8)), ref["sft"]["state"])


def test_checkpoint_folders_without_a_complete_one_are_an_error(tmp_path, sft_steps):
    cfg = arith_sft_smoke(str(tmp_path / "run"))
    train_sft(cfg, resume=False, quiet=True, stop_after=3)
    ck = tmp_path / "run" / "checkpoints"
    for n in (C.MARKER, C.TRAINER):                           # an incomplete folder by any criterion
        if (ck / "step_00000003" / n).exists():
            os.remove(ck / "step_00000003" / n)
    sft_steps.clear()
    with pytest.raises(C.RunDirError, match="holds no complete checkpoint.*step_00000003.*--no-resume"):
        train_sft(cfg, resume=True, quiet=True)
    shutil.rmtree(ck / "step_00000003")                      # only `latest` is left: it names a lost checkpoint
    with pytest.raises(C.RunDirError, match="holds no complete checkpoint"):
        train_sft(cfg, resume=True, quiet=True)
    assert sft_steps == []                                    # no silent restart from step 0


def test_pruning_keeps_a_new_runs_checkpoints_below_older_higher_steps(tmp_path, ref, sft_steps):
    cfg = arith_sft_smoke(str(tmp_path / "run"))
    train_sft(cfg, resume=False, quiet=True)                 # an earlier run: checkpoints 6 and 8 kept
    train_sft(cfg, resume=False, quiet=True, stop_after=3)   # started over in the same directory
    ck = tmp_path / "run" / "checkpoints"
    assert (ck / "step_00000003").is_dir(), "the new run's checkpoint was pruned"
    assert (ck / "step_00000003" / C.MARKER).exists()
    assert open(ck / "latest").read() == "step_00000003"
    assert C.latest_checkpoint(str(tmp_path / "run")) == str(ck / "step_00000003")
    sft_steps.clear()
    train_sft(cfg, resume=True, quiet=True)
    assert len(sft_steps) == 5                                # from the new run's step 3, not the old step 8
    kept = sorted(os.listdir(ck))
    assert kept == ["latest", "step_00000006", "step_00000008"]
    assert {json.load(open(ck / n / C.META))["generation"] for n in kept[1:]} == {3}  # both the last run's
    _same_state(_state(ck / "step_00000008"), ref["sft"]["state"])


def test_truncated_trainer_state_names_the_file_and_the_previous_checkpoint(tmp_path, ref):
    cfg = arith_sft_smoke(str(tmp_path / "run"))
    train_sft(cfg, resume=False, quiet=True, stop_after=6)
    ck = tmp_path / "run" / "checkpoints"
    p = ck / "step_00000006" / C.TRAINER
    with open(p, "r+b") as f:
        f.truncate(os.path.getsize(p) // 2)
    with pytest.raises(C.RunDirError) as e:
        train_sft(cfg, resume=True, quiet=True)
    msg = str(e.value)
    assert f"{p} is truncated or corrupt" in msg and "previous complete checkpoint is step 3" in msg
    assert f"--resume-from {ck / 'step_00000003'}" in msg and f"delete {ck / 'step_00000006'}" in msg
    train_sft(cfg, resume_from=str(ck / "step_00000003"), quiet=True)   # the offered way out
    _same_state(_state(ck / "step_00000008"), ref["sft"]["state"])


# ---- leftovers, the lock


def _plant_leftovers(run):
    ck = run / "checkpoints"
    (ck / ".tmp-step_00000006" / "dcp").mkdir(parents=True)
    (ck / ".tmp-step_00000006" / "model.safetensors").write_bytes(b"\0" * 100_000)
    (run / ".tmp-final1").mkdir()
    (run / "final.old-.tmp-x").mkdir()
    (ck / "latest.tmp").write_text("step_00000006")
    (ck / "step_00000003" / "trainer.pt.tmp").write_bytes(b"\0" * 10)
    return _leftovers(run)


def test_leftovers_of_dead_writers_are_removed_at_start(tmp_path, sft_steps, capfd):
    cfg = arith_sft_smoke(str(tmp_path / "run"))
    train_sft(cfg, resume=False, quiet=True, stop_after=3)
    assert len(_plant_leftovers(tmp_path / "run")) == 5
    capfd.readouterr()
    sft_steps.clear()
    train_sft(cfg, resume=True, quiet=True, stop_after=4)     # no checkpoint of its own (save_every 3)
    assert len(sft_steps) == 1 and _leftovers(tmp_path / "run") == []
    assert "removed 5 leftover(s)" in capfd.readouterr().err


def test_a_second_run_on_one_directory_fails_naming_the_holder(tmp_path, sft_steps):
    cfg = arith_sft_smoke(str(tmp_path / "run"))
    train_sft(cfg, resume=False, quiet=True, stop_after=3)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the first run: resumed, paused in its first step until killed
        try:
            S.sft_step = lambda *a, **k: os.write(w, b"1") and time.sleep(60)
            train_sft(cfg, resume=True, quiet=True)
        finally:
            os._exit(3)
    os.close(w)                                              # a child that dies early: EOF, not a hang
    try:
        assert os.read(r, 1) == b"1", "the first run could not open the directory"
        planted = _plant_leftovers(tmp_path / "run")        # a live holder's: not another run's to clean
        sft_steps.clear()
        with pytest.raises(C.RunDirError, match=f"in use by another run \\(pid {pid} on .*another --out"):
            train_sft(cfg, resume=True, quiet=True)
        assert sft_steps == [] and _leftovers(tmp_path / "run") == planted
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(r)
    train_sft(cfg, resume=True, quiet=True)                   # a killed holder leaves no stale lock
    assert len(sft_steps) == 5


# ---- config, writability


def test_a_changed_config_is_listed_unless_allowed(tmp_path, sft_steps, capfd):
    cfg = arith_sft_smoke(str(tmp_path / "run"))
    train_sft(cfg, resume=False, quiet=True, stop_after=3)
    changed = arith_sft_smoke(str(tmp_path / "run"))
    changed.batch_size, changed.stages[0].lr, changed.seed = 4, 0.5, 7
    changed.save_every, changed.log_every = 5, 1            # cadence may differ (MAY_DIFFER)
    sft_steps.clear()
    with pytest.raises(C.RunDirError) as e:
        train_sft(changed, resume=True, quiet=True)
    msg = str(e.value)
    assert "batch_size: 8 -> 4" in msg and "stages.0.lr: 0.001 -> 0.5" in msg and "seed: 0 -> 7" in msg
    assert "save_every" not in msg and "log_every" not in msg and "--allow-config-change" in msg
    fewer = arith_sft_smoke(str(tmp_path / "run"))
    fewer.stages[0].steps, fewer.stages[1].steps = 1, 1
    with pytest.raises(C.RunDirError, match="at step 3, past this run's last step 2"):
        train_sft(fewer, resume=True, quiet=True, allow_config_change=True)   # even when allowed
    assert sft_steps == []
    capfd.readouterr()
    cadence = arith_sft_smoke(str(tmp_path / "run"))
    cadence.save_every = 5
    train_sft(cadence, resume=True, quiet=True, stop_after=4)   # only a MAY_DIFFER field changed: no word
    assert "config" not in capfd.readouterr().err and len(sft_steps) == 1
    train_sft(changed, resume=True, quiet=True, allow_config_change=True)
    assert "changed config (allowed)" in capfd.readouterr().err and len(sft_steps) == 1 + 5


def test_unwritable_out_fails_before_step_one(tmp_path, sft_steps):
    (tmp_path / "a_file").write_text("")
    cfg = arith_sft_smoke(str(tmp_path / "a_file" / "run"))
    with pytest.raises(C.RunDirError, match=f"cannot create the run directory {tmp_path / 'a_file' / 'run'}"):
        train_sft(cfg, resume=True, quiet=True)
    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, 0o500)
    try:
        if not os.access(ro, os.W_OK):   # root writes anyway: test_disk_full_on_a_small_tmpfs checks a read-only disk
            with pytest.raises(C.RunDirError, match=f"{ro}.* not writable"):
                train_sft(arith_sft_smoke(str(ro)), resume=True, quiet=True)
    finally:
        os.chmod(ro, 0o700)
    assert sft_steps == []


# ---- metrics


@pytest.mark.parametrize("recipe", ["orl", "rft"])
def test_metrics_hold_each_step_once_after_a_resume(tmp_path, ref, recipe):
    cfg = _rft(ref["start"], tmp_path / "run") if recipe == "rft" else _orl(ref["start"], tmp_path / "run")
    _train(recipe, cfg, resume=False, stop_after=3)            # steps 1-3 logged, checkpoint at 2
    with open(tmp_path / "run" / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "loss": 1.')                        # a line cut by a kill
    _train(recipe, cfg, resume=True)
    rows = [json.loads(x) for x in open(tmp_path / "run" / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    keys = ("loss", "reward", "verified", "tpf")
    assert [[r.get(k) for k in keys] for r in rows] == [[r.get(k) for k in keys] for r in ref[recipe]["metrics"]]


# ---- a full disk


def _no_space(style):
    if style == "oserror":
        return OSError(errno.ENOSPC, "No space left on device")
    return RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")  # torch.save's


@pytest.mark.parametrize("style", ["oserror", "torch"])
def test_disk_full_while_checkpointing_keeps_the_previous_one(tmp_path, monkeypatch, style):
    """ENOSPC simulated in the DCP writer: an OSError, or torch.save's short-write error on a disk
    with no space left."""
    from orl.train import distributed as D  # noqa: PLC0415
    cfg = arith_sft_smoke(str(tmp_path / "run"))
    train_sft(cfg, resume=False, quiet=True, stop_after=3)
    prev = tmp_path / "run" / "checkpoints" / "step_00000003"
    before = {n: (prev / n).read_bytes() for n in (C.TRAINER, C.META, "model.safetensors") if (prev / n).exists()}

    def full(path, model, optimizer):
        os.makedirs(path, exist_ok=True)
        open(os.path.join(path, "__0_0.distcp"), "wb").write(b"\0" * 1000)   # the part written before the disk filled
        raise _no_space(style)
    monkeypatch.setattr(D, "save_dcp", full)
    if style == "torch":
        monkeypatch.setattr(C, "_free_bytes", lambda path: 0, raising=False)
    with pytest.raises(C.NoSpaceError, match=r"no space left on .* \(needs ~[0-9.e-]+ GB for a checkpoint.*step 6"
                                             r".*step_00000003 is intact"):
        train_sft(cfg, resume=True, quiet=True)
    assert _leftovers(tmp_path / "run") == []
    assert sorted(os.listdir(prev.parent)) == ["latest", "step_00000003"]
    assert {n: (prev / n).read_bytes() for n in before} == before
    monkeypatch.undo()
    assert C.latest_checkpoint(cfg.out) == str(prev)


_TMPFS_SCRIPT = textwrap.dedent("""
    import json, os, subprocess, sys
    sys.modules["torch.utils.tensorboard"] = None   # no event files on the small disk
    import torch
    from orl.model.checkpoint import read_state_dict
    from orl.recipes.arith import arith_sft_smoke
    from orl.train.sft import train_sft
    d = sys.argv[1]
    cfg = arith_sft_smoke(os.path.join(d, "run"))
    train_sft(cfg, resume=False, quiet=True, stop_after=3)
    prev = os.path.join(d, "run", "checkpoints", "step_00000003")
    size = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(prev) for f in fs)
    st = os.statvfs(d)
    with open(os.path.join(d, "filler"), "wb") as f:   # leave half a checkpoint free
        f.write(b"\\0" * (st.f_bavail * st.f_frsize - size // 2))
    out = {"size": size}
    try:
        train_sft(cfg, resume=True, quiet=True)
    except Exception as e:
        out["error"] = f"{type(e).__name__}: {e}"
    out["left"] = sorted(os.listdir(os.path.join(d, "run", "checkpoints")))
    out["tmp"] = [n for r, ds, fs in os.walk(d) for n in ds + fs if n.startswith(".tmp-") or n.endswith(".tmp")]
    out["prev_intact"] = bool(torch.load(os.path.join(prev, "trainer.pt"), weights_only=False)["step"] == 3
                              and read_state_dict(prev))
    os.remove(os.path.join(d, "filler"))
    train_sft(cfg, resume=True, quiet=True)                # space freed: it resumes and finishes
    out["final"] = os.path.exists(os.path.join(d, "run", "final", "model.safetensors"))
    subprocess.run(["mount", "-o", "remount,ro", d], check=True)   # a read-only disk: caught before step 1
    for run in ("run", "new"):
        try:
            train_sft(arith_sft_smoke(os.path.join(d, run)), resume=True, quiet=True)
        except Exception as e:
            out["ro_" + run] = f"{type(e).__name__}: {e}"
    print("RESULT " + json.dumps(out))
""")


def test_disk_full_on_a_small_tmpfs(tmp_path):
    """A real ENOSPC: a 16 MB tmpfs in a user + mount namespace (skipped where it cannot be mounted)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mount = ["unshare", "-Urm", "sh", "-c", 'mount -t tmpfs -o size=16m tmpfs "$1" && shift && exec "$@"', "sh",
             str(disk)]
    probe = subprocess.run([*mount, "true"], capture_output=True, text=True) if shutil.which("unshare") else None
    if probe is None or probe.returncode != 0:
        pytest.skip("cannot mount a small tmpfs in a user + mount namespace here (unshare -Urm, mount -t tmpfs): "
                    + (probe.stderr.strip()[-200:] if probe else "no unshare"))
    (tmp_path / "t.py").write_text(_TMPFS_SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    r = subprocess.run([*mount, sys.executable, str(tmp_path / "t.py"), str(disk)], capture_output=True, text=True,
                       timeout=120, env=env, cwd=os.path.dirname(os.path.dirname(FIXTURES)))
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.split("RESULT ", 1)[1])
    assert "error" in res, res
    assert res["error"].startswith("NoSpaceError: no space left on tmpfs mounted at "), res["error"]
    assert "GB for a checkpoint" in res["error"] and "step_00000003 is intact" in res["error"]
    assert res["left"] == ["latest", "step_00000003"] and res["tmp"] == [] and res["prev_intact"]
    assert res["final"]
    assert res["ro_run"].startswith(f"RunDirError: the run directory {disk / 'run'} is not writable (Read-only")
    assert res["ro_new"].startswith(f"RunDirError: cannot create the run directory {disk / 'new'}: Read-only")


# ---- the final folder is never missing


def test_replace_dir_never_leaves_the_target_missing(tmp_path, monkeypatch):
    from orl.model.checkpoint import files  # noqa: PLC0415
    path, tmp = tmp_path / "final", tmp_path / ".tmp-new"
    path.mkdir()
    (path / "w").write_text("old")
    tmp.mkdir()
    (tmp / "w").write_text("new")
    seen = []
    real = os.replace

    def spy(a, b):
        real(a, b)
        seen.append(os.path.exists(path))
    monkeypatch.setattr(files.os, "replace", spy)
    files._replace_dir(str(tmp), str(path))
    assert (path / "w").read_text() == "new" and not tmp.exists()
    assert all(seen), "the target was missing after a rename"
