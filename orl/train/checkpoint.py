"""Run directories and their checkpoints: complete or absent, one writer at a time, checked on resume.

A run directory (``--out``) holds:

    .lock                         advisory lock (``fcntl.flock``) of the one run writing here, its pid inside
    metrics.jsonl                 one record per step, cut back to the resumed checkpoint's step on resume
    checkpoints/step_00000004/    one checkpoint:
        config.json, model.safetensors, tokenizer files   the model in HF layout (rank 0)
        dcp/                      model + optimizer through DCP, each rank its shards (`orl.train.distributed`)
        trainer.pt                the loop state (step, world size, what the loop adds)
        meta.json                 step, generation, world size, trainer kind, the run's config
        COMPLETE                  the completion marker, written last
    checkpoints/latest            the name of the newest complete checkpoint (for people and tools)
    final/                        the finished model (HF layout), written by the loops

Writing (`RunDir.save`): everything goes into ``checkpoints/.tmp-step_XXXXXXXX``, every file is
fsynced, then the marker (fsynced with its folder), then the folder takes its name (exchanged in
one rename with an older folder of the same step), then ``latest``, then pruning. A run killed at
any point leaves complete checkpoints and perhaps a ``.tmp-`` folder; the next run, holding the
lock (so every leftover is a dead writer's), removes leftovers before anything else. Out of disk
space, the partial folder is removed and the error says so; the previous checkpoint is untouched.

Order: checkpoints rank by (generation, step) read from their own ``meta.json``, never by folder
name. The generation counts the runs started in the directory, so a run started over
(``--no-resume``, ``--resume-from`` an older step) ranks above what an earlier run left there, and
pruning keeps the newest ``keep``.

Resume (`open_run`): from the newest complete checkpoint; ``latest`` is a hint only (empty,
dangling or behind: a warning line, then the scan). Checkpoint folders but none complete, a
corrupt trainer state, another trainer's run, a changed config (any field but `MAY_DIFFER`,
unless ``allow_config_change``) or a checkpoint past the run's last step are errors that name the
fix, never a silent restart from step 0.

Data order and noise are functions of (seed, step), so weights + optimizer + step (+ what a loop
adds: the off-policy ablation's stale policy) are the whole state.
Does not own: what the loops store in ``state``; model files (`orl.model.checkpoint`); DCP
(`orl.train.distributed`). The folder per step, its metadata and its marker are the same for the
single-file and the sharded (DCP) optimizer state.
"""
from __future__ import annotations

import dataclasses
import errno
import fcntl
import json
import os
import shutil
import signal
import socket
import sys
import time
from dataclasses import dataclass

import torch

from ..model.checkpoint import load_state, read_state_dict, save_pretrained
from ..model.checkpoint.files import _replace_dir

TRAINER, META, MARKER, LATEST, LOCK = "trainer.pt", "meta.json", "COMPLETE", "latest", ".lock"
FAULT_ENV = "ORL_CHECKPOINT_FAULT"   # tests: "POINT[@STEP]" SIGKILLs the writer there (see `_fault`)
FAULT_POINTS = ("weights", "trainer", "marker", "rename", "latest")

# Config fields a resume may change without --allow-config-change: none of them reaches the weights.
MAY_DIFFER = (
    "out",                    # the same run, moved or copied
    "save_every",             # checkpoint cadence: resume is exact from any step
    "log_every",              # logging cadence
    "eval_every", "eval_n",   # in-loop evaluation reads the weights and draws no training randomness
    "threads",                # speed only
)


class RunDirError(ValueError):
    """A run directory that cannot be used as asked; the message names the path and the fix."""


class NoSpaceError(RunDirError):
    """The disk filled up while a checkpoint was written; the partial one is gone, the previous intact."""

    errno = errno.ENOSPC


@dataclass(frozen=True)
class Checkpoint:
    path: str
    step: int
    generation: int
    meta: dict

    @property
    def name(self) -> str:
        return os.path.basename(self.path)


def _say(msg: str) -> None:
    print(f"orl: {msg}", file=sys.stderr, flush=True)


def _world() -> tuple[int, int]:
    import torch.distributed as dist  # noqa: PLC0415
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _barrier(world: int) -> None:
    if world > 1:
        import torch.distributed as dist  # noqa: PLC0415
        dist.barrier()


def _on_rank0(rank: int, world: int, fn):
    """``fn()`` on rank 0; its result (picklable) or its failure on every rank -- without this the
    other ranks would wait at the next collective forever when rank 0 fails."""
    out, err = None, None
    if rank == 0:
        try:
            out = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised below, after the other ranks heard of it
            err = e
    if world > 1:
        import torch.distributed as dist  # noqa: PLC0415
        box = [out, None if err is None else f"{type(err).__name__}: {err}"]
        dist.broadcast_object_list(box, src=0)
        if rank != 0:
            if box[1] is not None:
                raise RunDirError(f"rank 0 failed: {box[1]}")
            return box[0]
    if err is not None:
        raise err
    return out


def _fault(point: str, step: int) -> None:
    """Test hook: with ``ORL_CHECKPOINT_FAULT=POINT`` or ``POINT@STEP`` the writer SIGKILLs itself at
    POINT (`FAULT_POINTS`: after the weights, after trainer.pt, before the marker, before the rename,
    before ``latest``) of the checkpoint of STEP (any step without ``@``)."""
    spec = os.environ.get(FAULT_ENV)
    if spec:
        p, _, s = spec.partition("@")
        if p == point and (not s or int(s) == step):
            os.kill(os.getpid(), signal.SIGKILL)


# ---- small durable writes

def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path: str) -> None:
    for d, _, files in os.walk(path):
        for f in files:
            fd = os.open(os.path.join(d, f), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(d)


def _write_file(path: str, write) -> None:
    """``write(f)`` into a new binary file at ``path``, flushed and fsynced."""
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def _atomic_write_text(path: str, text: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"  # per writer: two processes never share a temporary
    try:
        _write_file(tmp, lambda f: f.write(text.encode()))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    _fsync_dir(os.path.dirname(path) or ".")


def _tree_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs
               if os.path.isfile(os.path.join(d, f)))


def _gb(n: float) -> str:
    return f"{n / 1e9:.2g}"


# ---- reading checkpoints

def _read_checkpoint(path: str) -> Checkpoint | None:
    """The checkpoint in folder ``path`` if it is complete (meta.json + marker), else None. A folder
    from before the marker (trainer.pt, no meta.json: its writer renamed trainer.pt in last) counts
    as complete, generation 0, its step read from trainer.pt."""
    meta_p = os.path.join(path, META)
    if os.path.exists(meta_p):
        if not os.path.exists(os.path.join(path, MARKER)):
            return None
        try:
            with open(meta_p) as f:
                meta = json.load(f)
            return Checkpoint(path, int(meta["step"]), int(meta["generation"]), meta)
        except (OSError, ValueError, KeyError, TypeError):
            return None
    if os.path.exists(os.path.join(path, TRAINER)):
        try:
            st = torch.load(os.path.join(path, TRAINER), map_location="cpu", weights_only=False)
            return Checkpoint(path, int(st["step"]), 0, {"step": int(st["step"]), "config": st.get("config")})
        except Exception:  # noqa: BLE001 - unreadable: not complete
            return None
    return None


def scan(run_dir: str) -> tuple[list[Checkpoint], list[str]]:
    """(complete checkpoints oldest first by (generation, step), names of the other step folders)."""
    root = os.path.join(run_dir, "checkpoints")
    complete, other = [], []
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        p = os.path.join(root, name)
        if name.startswith(".") or not os.path.isdir(p):
            continue
        ck = _read_checkpoint(p)
        if ck is None:
            other.append(name)
        else:
            complete.append(ck)
    complete.sort(key=lambda c: (c.generation, c.step))
    return complete, other


def latest_checkpoint(run_dir: str) -> str | None:
    """The newest complete checkpoint of ``run_dir`` (no lock, no checks: for tools), or None."""
    complete = scan(run_dir)[0]
    return complete[-1].path if complete else None


class CorruptCheckpoint(RunDirError):
    def __init__(self, what: str, cause: BaseException, hint: str):
        first = (str(cause).strip().splitlines() or [""])[0][:200]
        self.detail = f"{what} {hint} ({type(cause).__name__}: {first})"
        super().__init__(self.detail)


def _read_part(path: str, hint: str, fn):
    try:
        return fn(path)
    except BaseException as e:  # noqa: BLE001 - DCP's CheckpointException is a BaseException
        if isinstance(e, KeyboardInterrupt | SystemExit):
            raise
        raise CorruptCheckpoint(path, e, hint) from e


def load_checkpoint(path: str, model, optimizer) -> dict:
    """Restore model and optimiser in place from ``path`` (on any number of ranks when it holds a
    DCP folder; an older checkpoint's ``trainer.pt`` optimizer in one process); return the loop
    state. A part that cannot be read raises `CorruptCheckpoint` naming it."""
    st = _read_part(os.path.join(path, TRAINER), "is truncated or corrupt",
                    lambda p: torch.load(p, map_location="cpu", weights_only=False))
    if os.path.isdir(os.path.join(path, "dcp")):
        from .distributed import load_dcp  # noqa: PLC0415
        _read_part(os.path.join(path, "dcp"), "is truncated or corrupt, or does not fit this model",
                   lambda p: load_dcp(p, model, optimizer))
        st.pop("world", None)
        return st
    load_state(model, read_state_dict(path), where=path)
    optimizer.load_state_dict(st.pop("optimizer"))
    return st


# ---- the config stored with each checkpoint

def _plain(cfg) -> dict:
    """A config dataclass as JSON data (tuples become lists, anything odd its str)."""
    d = dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else dict(cfg)
    return json.loads(json.dumps(d, default=str))


def _flat(x, key: str = "") -> dict:
    if isinstance(x, dict):
        return {k: v for n, sub in x.items() for k, v in _flat(sub, f"{key}.{n}" if key else str(n)).items()}
    if isinstance(x, list) and x and any(isinstance(v, dict | list) for v in x):
        return {k: v for i, sub in enumerate(x) for k, v in _flat(sub, f"{key}.{i}").items()}
    return {key: x}


def config_diff(old: dict, new: dict) -> list[str]:
    """The fields that differ between two stored configs, outside `MAY_DIFFER`, as "key: old -> new"."""
    a, b = _flat(old), _flat(new)
    out = []
    for k in sorted(set(a) | set(b)):
        if k.split(".")[0] in MAY_DIFFER or a.get(k, ...) == b.get(k, ...):
            continue
        show = [json.dumps(d[k]) if k in d else "(absent)" for d in (a, b)]
        out.append(f"{k}: {show[0]} -> {show[1]}")
    return out


# ---- the run directory

def _check_writable(run_dir: str) -> None:
    try:
        os.makedirs(run_dir, exist_ok=True)
    except OSError as e:
        raise RunDirError(f"cannot create the run directory {run_dir}: {e.strerror or e}; pass a writable --out") \
            from e
    for d in (run_dir, os.path.join(run_dir, "checkpoints")):
        if not os.path.isdir(d):
            continue
        probe = os.path.join(d, f".write-probe.{os.getpid()}.tmp")
        try:
            with open(probe, "w"):
                pass
            os.remove(probe)
        except OSError as e:
            raise RunDirError(f"the run directory {d} is not writable ({e.strerror or e}); fix its permissions "
                              "or pass another --out") from e


def _lock(run_dir: str):
    """The run directory's advisory lock (an open file, held until closed), or None where the file
    system has no flock."""
    path = os.path.join(run_dir, LOCK)
    try:
        f = open(path, "a+")  # noqa: SIM115 - held open: the lock lasts as long as the file
    except OSError as e:
        raise RunDirError(f"cannot create the lock file {path} ({e.strerror or e}); pass a writable --out") from e
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        try:
            h = json.loads(f.read())
            holder = f"pid {h['pid']} on {h['host']}, since {h['since']}"
        except (ValueError, KeyError, TypeError):
            holder = "a process that left no pid"
        f.close()
        raise RunDirError(f"the run directory {run_dir} is in use by another run ({holder}; lock {path}): two "
                          "runs cannot share one --out. Wait for it to finish, stop it, or pass another --out") \
            from None
    except OSError as e:
        f.close()
        _say(f"warning: cannot lock {path} ({e.strerror or e}: a file system without flock?); running unlocked, "
             "leftovers of interrupted writes are kept")
        return None
    f.seek(0)
    f.truncate()
    f.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                        "since": time.strftime("%Y-%m-%dT%H:%M:%S")}) + "\n")
    f.flush()
    return f


def _clean_leftovers(run_dir: str) -> None:
    """Remove what interrupted writers left: ``.tmp-*`` folders (a checkpoint or ``final`` being
    written), ``*.old-.tmp-*`` folders (a replaced ``final``) and ``*.tmp`` files, in the run
    directory, ``checkpoints/`` and each step folder. Call with the lock held."""
    root = os.path.join(run_dir, "checkpoints")
    places = [run_dir, root] + ([os.path.join(root, n) for n in os.listdir(root) if not n.startswith(".")]
                                if os.path.isdir(root) else [])
    gone, freed = [], 0
    for d in places:
        if not os.path.isdir(d):
            continue
        for name in os.listdir(d):
            p = os.path.join(d, name)
            if os.path.isdir(p) and not os.path.islink(p) and (name.startswith(".tmp-") or ".old-.tmp-" in name):
                freed += _tree_bytes(p)
                shutil.rmtree(p, ignore_errors=True)
            elif os.path.isfile(p) and name.endswith(".tmp"):
                freed += os.path.getsize(p)
                os.remove(p)
            else:
                continue
            gone.append(os.path.relpath(p, run_dir))
    if gone:
        _say(f"removed {len(gone)} leftover(s) of interrupted writes in {run_dir} ({_gb(freed)} GB): "
             + ", ".join(gone[:6]) + (" ..." if len(gone) > 6 else ""))


def _trim_metrics(run_dir: str, step: int) -> None:
    """Cut ``metrics.jsonl`` back to the records of steps <= ``step`` (those after it are re-run), a
    truncated last line included, rewritten atomically."""
    p = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(p):
        return
    with open(p, "rb") as f:
        data = f.read()
    keep = []
    for line in data.split(b"\n"):
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("step"), int) and rec["step"] <= step:
            keep.append(line)
    text = b"".join(x + b"\n" for x in keep)
    if text != data:
        _atomic_write_text(p, text.decode())
        n = sum(1 for x in data.split(b"\n") if x.strip()) - len(keep)
        _say(f"{p}: dropped {n} record(s) past step {step} (a cut line, or steps re-run from the checkpoint)")


def _mount_of(path: str) -> str:
    """The device of ``path`` as "SOURCE mounted at MOUNT" (the mount point alone where unknown)."""
    p = os.path.realpath(path)
    while not os.path.ismount(p):
        p = os.path.dirname(p)
    src = None
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) > 1 and parts[1] == p:
                    src = parts[0]
    except OSError:
        pass
    return f"{src} mounted at {p}" if src else p


def _free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _is_disk_full(e: BaseException) -> bool:
    """ENOSPC / EDQUOT anywhere in the chain (DCP wraps each rank's failure; safetensors only says it
    in words; torch.save says "unexpected pos": the caller also checks the free space)."""
    todo, seen = [e], set()
    while todo:
        x = todo.pop()
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, OSError) and x.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(x) or "os error 28" in str(x) or "Disk quota exceeded" in str(x):
            return True
        todo += [x.__cause__, x.__context__]
        for f in (getattr(x, "failures", None) or {}).values():  # DCP's CheckpointException
            todo.append(f[0] if isinstance(f, tuple) else getattr(f, "exc", f))
    return False


class RunDir:
    """One run's directory, opened with `open_run`: its lock, the checkpoint it resumes from,
    checkpoint writes and the metrics log. Every rank holds one; rank 0 writes the shared files."""

    def __init__(self, run_dir: str, kind: str, config: dict, rank: int, world: int):
        self.run_dir, self.kind, self.config = run_dir, kind, config
        self.root = os.path.join(run_dir, "checkpoints")
        self.rank, self.world = rank, world
        self.generation = 0
        self.resumed: Checkpoint | None = None
        self.complete: list[Checkpoint] = []
        self._lockf = None

    # -- opening (rank 0)

    def _open(self, total_steps: int, resume: bool, resume_from: str | None, allow_config_change: bool) -> dict:
        _check_writable(self.run_dir)
        self._lockf = _lock(self.run_dir)
        try:
            if self._lockf is not None:
                _clean_leftovers(self.run_dir)
            self.complete, other = scan(self.run_dir)
            gens = [c.generation for c in self.complete]
            for name in other:  # a folder without its marker still took a generation
                try:
                    with open(os.path.join(self.root, name, META)) as f:
                        gens.append(int(json.load(f)["generation"]))
                except (OSError, ValueError, KeyError, TypeError):
                    pass
            self.generation = max(gens, default=0) + 1
            if resume_from:
                ck = _read_checkpoint(os.path.abspath(resume_from).rstrip("/"))
                if ck is None:
                    raise RunDirError(f"--resume-from {resume_from}: not a complete checkpoint folder (it needs "
                                      f"{META} and {MARKER}, written last by a finished save)")
            elif resume:
                ck = self._newest(other)
            else:
                ck = None
                if self.complete:
                    _say(f"starting over in {self.run_dir} (no resume): the {len(self.complete)} checkpoint(s) of an "
                         f"earlier run there (newest step {max(c.step for c in self.complete)}) rank below this "
                         "run's and are pruned as it saves")
            if ck is not None:
                self._check_resume(ck, total_steps, allow_config_change)
            self.resumed = ck
            _trim_metrics(self.run_dir, ck.step if ck else 0)
        except BaseException:
            self.close()
            raise
        return {"generation": self.generation, "resumed": ck.path if ck else None}

    def _newest(self, other: list[str]) -> Checkpoint | None:
        lp = os.path.join(self.root, LATEST)
        hint = None
        if os.path.exists(lp):
            with open(lp) as f:
                hint = f.read().strip()
        if not self.complete:
            if other or hint is not None:
                found = ", ".join(other[:6]) or "none"
                raise RunDirError(
                    f"{self.root} holds no complete checkpoint (step folders without {MARKER} or {META}: {found}; "
                    f"latest: {hint!r}), so there is nothing to resume from. Move them away, or start over with "
                    "--no-resume")
            return None
        newest = self.complete[-1]
        if hint != newest.name:
            names = {c.name: c for c in self.complete}
            why = ("is missing" if hint is None else "is empty" if hint == "" else
                   f"names {hint}, which does not exist" if not os.path.exists(os.path.join(self.root, hint)) else
                   f"names {hint}, which is not a complete checkpoint" if hint not in names else
                   f"names {hint}, older than {newest.name} (a run stopped between the two)")
            _say(f"warning: {lp} {why}; resuming from the newest complete checkpoint found by scanning: "
                 f"{newest.name} (step {newest.step})")
        return newest

    def _check_resume(self, ck: Checkpoint, total_steps: int, allow: bool) -> None:
        kind = ck.meta.get("trainer")
        if kind is not None and kind != self.kind:
            raise RunDirError(f"{ck.path} is a checkpoint of an `{kind}` run, this is `{self.kind}`: "
                              "pass another --out")
        if ck.step > total_steps:
            raise RunDirError(f"{ck.path} is at step {ck.step}, past this run's last step {total_steps}: set the "
                              f"steps back to at least {ck.step}, or start over with --no-resume or another --out")
        old = ck.meta.get("config")
        diffs = config_diff(old, self.config) if old is not None else []
        if diffs and not allow:
            raise RunDirError(f"the config differs from the one checkpointed in {ck.path}:\n  " + "\n  ".join(diffs)
                              + "\nResume with the checkpoint's values, pass --allow-config-change "
                              "(allow_config_change=True) to resume with the new ones, or start over with "
                              "--no-resume or another --out")
        if diffs:
            _say(f"warning: resuming {ck.path} with a changed config (allowed): " + "; ".join(diffs))

    def close(self) -> None:
        """Release the lock (the run is over, or failed)."""
        if self._lockf is not None:
            self._lockf.close()
            self._lockf = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- resuming

    @property
    def start_step(self) -> int:
        return self.resumed.step if self.resumed else 0

    def _previous(self, ck: Checkpoint) -> Checkpoint | None:
        older = [c for c in self.complete if (c.generation, c.step) < (ck.generation, ck.step)]
        return older[-1] if older else None

    def load(self, model, optimizer) -> dict:
        """Restore the resumed checkpoint into ``model`` and ``optimizer`` (every rank); returns its
        loop state (``{"step": 0}`` for a fresh start). A broken checkpoint raises an error naming
        the file and the previous complete checkpoint."""
        ck = self.resumed
        if ck is None:
            return {"step": 0}
        try:
            return load_checkpoint(ck.path, model, optimizer)
        except CorruptCheckpoint as e:
            prev = self._previous(ck)
            how = (f"the previous complete checkpoint is step {prev.step} ({prev.path}): resume from it with "
                   f"--resume-from {prev.path} (resume_from=...), or delete {ck.path}" if prev else
                   f"no earlier complete checkpoint is left: delete {ck.path} and start over with --no-resume")
            raise RunDirError(f"{e.detail}; {how}") from e

    # -- saving (every rank)

    def save(self, step: int, model, optimizer, state: dict, tokenizer=None, keep: int = 2, full_model=None) -> str:
        """Every rank calls it. The model in HF layout (rank 0; ``full_model``: the full copy of a
        sharded ``model``), model + optimizer through DCP (each rank its shards), ``trainer.pt``
        (``state`` + step + world), ``meta.json`` and the marker, all in a temporary folder renamed
        into place; then ``latest`` and pruning to the newest ``keep``. Returns the folder."""
        from .distributed import save_dcp  # noqa: PLC0415
        name = f"step_{step:08d}"
        tmp, dest = os.path.join(self.root, ".tmp-" + name), os.path.join(self.root, name)
        need = self._needed_bytes(model, optimizer)
        try:
            _on_rank0(self.rank, self.world, lambda: self._write_model(tmp, full_model or model, tokenizer))
            save_dcp(os.path.join(tmp, "dcp"), model, optimizer)
            _barrier(self.world)
            _fault("weights", step)
            _on_rank0(self.rank, self.world, lambda: self._commit(tmp, dest, step, state, keep))
        except BaseException as e:  # noqa: BLE001 - DCP's CheckpointException is a BaseException
            free = _free_bytes(self.root) if os.path.isdir(self.root) else 0
            if self.rank == 0 and os.path.isdir(tmp):
                shutil.rmtree(tmp, ignore_errors=True)  # a partial checkpoint: never resumed from, only in the way
            if isinstance(e, KeyboardInterrupt | SystemExit) or not (_is_disk_full(e) or free < need):
                raise
            prev = self.complete[-1].name if self.complete else None
            raise NoSpaceError(
                f"no space left on {_mount_of(self.root)} (needs ~{_gb(need)} GB for a checkpoint, {_gb(free)} GB "
                f"free) while writing checkpoint step {step} of {self.run_dir}; the partial checkpoint was removed"
                + (f", the previous checkpoint {prev} is intact: free some space and run again to resume from it"
                   if prev else "; no earlier checkpoint exists: free some space and run again")) from e
        return dest

    def _needed_bytes(self, model, optimizer) -> int:
        """About one checkpoint's bytes: the newest one's size, else HF weights + DCP model + AdamW's moments."""
        if self.complete and os.path.isdir(self.complete[-1].path):
            return _tree_bytes(self.complete[-1].path)
        return 4 * sum(p.numel() * p.element_size() for p in model.parameters())

    def _write_model(self, tmp: str, model, tokenizer) -> None:
        self._sync_metrics()  # the records of the steps this checkpoint covers are on disk before it
        os.makedirs(self.root, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        save_pretrained(model, tmp, tokenizer=tokenizer)

    def _commit(self, tmp: str, dest: str, step: int, state: dict, keep: int) -> None:
        _write_file(os.path.join(tmp, TRAINER), lambda f: torch.save({"step": step, "world": self.world, **state}, f))
        _fault("trainer", step)
        meta = {"step": step, "generation": self.generation, "world": self.world, "trainer": self.kind,
                "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "config": self.config}
        _write_file(os.path.join(tmp, META), lambda f: f.write(json.dumps(meta, indent=1).encode()))
        _fault("marker", step)
        _fsync_tree(tmp)
        _write_file(os.path.join(tmp, MARKER), lambda f: f.write(f"step {step}\n".encode()))
        _fsync_dir(tmp)
        _fault("rename", step)
        _replace_dir(tmp, dest)  # an older folder of this step (an earlier run's) is exchanged in one rename
        _fsync_dir(self.root)
        _fault("latest", step)
        self.complete = sorted([c for c in self.complete if c.path != dest] +
                               [Checkpoint(dest, step, self.generation, meta)], key=lambda c: (c.generation, c.step))
        _atomic_write_text(os.path.join(self.root, LATEST), self.complete[-1].name)
        for old in self.complete[:-keep]:
            shutil.rmtree(old.path, ignore_errors=True)
        self.complete = self.complete[-keep:]

    # -- metrics

    def log(self, record: dict) -> None:
        """Append one step's record to ``metrics.jsonl`` (rank 0; the file was cut back to the
        resumed step when the run opened, so no step appears twice)."""
        if self.rank == 0:
            with open(os.path.join(self.run_dir, "metrics.jsonl"), "a") as f:
                f.write(json.dumps(record) + "\n")

    def _sync_metrics(self) -> None:
        p = os.path.join(self.run_dir, "metrics.jsonl")
        if os.path.exists(p):
            with open(p, "rb+") as f:
                os.fsync(f.fileno())


def open_run(run_dir: str, kind: str, cfg, total_steps: int, resume: bool = True, resume_from: str | None = None,
             allow_config_change: bool = False) -> RunDir:
    """Open ``run_dir`` for a ``kind`` ("sft", "orl", "rft") run of config ``cfg`` (a dataclass)
    and ``total_steps`` steps, before step 1: writable (else an error naming the path), locked
    (another live run there: an error naming its pid), leftovers of dead writers removed, the
    checkpoint to resume from chosen and checked (``resume_from``: that one; ``resume=False``: none,
    a fresh start whose checkpoints rank above the earlier ones), ``metrics.jsonl`` cut back to
    its step. Every rank calls it (rank 0 does the work). ``close()`` it at the end (or use ``with``)."""
    rank, world = _world()
    run = RunDir(run_dir, kind, _plain(cfg), rank, world)
    shared = _on_rank0(rank, world, lambda: run._open(total_steps, resume or bool(resume_from), resume_from,
                                                      allow_config_change))
    if rank != 0:
        run.generation = shared["generation"]
        run.resumed = _read_checkpoint(shared["resumed"]) if shared["resumed"] else None
    return run
