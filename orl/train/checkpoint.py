"""Exact, atomic training checkpoints: model (HF layout) + model and optimiser through DCP + loop state.

Owns the run directory's ``checkpoints/step_XXXXXXXX`` folders and the ``latest`` pointer. A
checkpoint counts only once ``trainer.pt`` is in place and ``latest`` names it (both written via
rename), so a run killed at any point resumes from the last complete checkpoint. Data order and
noise are functions of (seed, step), so weights + optimiser + step are the whole state.
Does not own: what the loop stores in ``state`` beyond the optimiser.
"""
from __future__ import annotations

import os
import shutil

import torch

from ..model.checkpoint import load_state, read_state_dict, save_pretrained


def _atomic_write_text(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _world() -> tuple[int, int]:
    import torch.distributed as dist  # noqa: PLC0415
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _barrier(world: int) -> None:
    if world > 1:
        import torch.distributed as dist  # noqa: PLC0415
        dist.barrier()


def save_checkpoint(run_dir: str, step: int, model, optimizer, state: dict, tokenizer=None, keep: int = 2,
                    full_model=None) -> str:
    """Every rank calls it. The model in HF layout (rank 0; ``full_model``: the full copy of a
    sharded ``model``), model + optimizer through DCP (``dcp/``, each rank its shards:
    `orl.train.distributed`), then ``trainer.pt`` (the loop state) and the ``latest`` pointer."""
    from .distributed import save_dcp  # noqa: PLC0415
    rank, world = _world()
    root = os.path.join(run_dir, "checkpoints")
    d = os.path.join(root, f"step_{step:08d}")
    if rank == 0:
        os.makedirs(root, exist_ok=True)
        save_pretrained(full_model if full_model is not None else model, d, tokenizer=tokenizer)
    _barrier(world)
    save_dcp(os.path.join(d, "dcp"), model, optimizer)
    _barrier(world)
    if rank == 0:
        tmp = os.path.join(d, "trainer.pt.tmp")
        torch.save({"step": step, "world": world, **state}, tmp)
        os.replace(tmp, os.path.join(d, "trainer.pt"))
        _atomic_write_text(os.path.join(root, "latest"), os.path.basename(d))
        done = sorted(x for x in os.listdir(root) if x.startswith("step_") and
                      os.path.exists(os.path.join(root, x, "trainer.pt")))
        for old in done[:-keep]:
            shutil.rmtree(os.path.join(root, old), ignore_errors=True)
    _barrier(world)
    return d


def latest_checkpoint(run_dir: str) -> str | None:
    p = os.path.join(run_dir, "checkpoints", "latest")
    if not os.path.exists(p):
        return None
    d = os.path.join(run_dir, "checkpoints", open(p).read().strip())
    return d if os.path.exists(os.path.join(d, "trainer.pt")) else None


def load_checkpoint(path: str, model, optimizer) -> dict:
    """Restore model and optimiser in place from ``path`` (on any number of ranks when it holds a
    DCP folder; an older checkpoint's ``trainer.pt`` optimizer in one process); return the loop state."""
    st = torch.load(os.path.join(path, "trainer.pt"), map_location="cpu", weights_only=False)
    if os.path.isdir(os.path.join(path, "dcp")):
        from .distributed import load_dcp  # noqa: PLC0415
        load_dcp(os.path.join(path, "dcp"), model, optimizer)
        st.pop("world", None)
        return st
    load_state(model, read_state_dict(path), where=path)
    optimizer.load_state_dict(st.pop("optimizer"))
    return st
