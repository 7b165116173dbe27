"""Exact, atomic training checkpoints: model (HF layout) + optimiser + loop state.

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


def save_checkpoint(run_dir: str, step: int, model, optimizer, state: dict, tokenizer=None, keep: int = 2) -> str:
    root = os.path.join(run_dir, "checkpoints")
    os.makedirs(root, exist_ok=True)
    d = os.path.join(root, f"step_{step:08d}")
    save_pretrained(model, d, tokenizer=tokenizer)
    tmp = os.path.join(d, "trainer.pt.tmp")
    torch.save({"optimizer": optimizer.state_dict(), "step": step, **state}, tmp)
    os.replace(tmp, os.path.join(d, "trainer.pt"))
    _atomic_write_text(os.path.join(root, "latest"), os.path.basename(d))
    done = sorted(x for x in os.listdir(root) if x.startswith("step_") and
                  os.path.exists(os.path.join(root, x, "trainer.pt")))
    for old in done[:-keep]:
        shutil.rmtree(os.path.join(root, old), ignore_errors=True)
    return d


def latest_checkpoint(run_dir: str) -> str | None:
    p = os.path.join(run_dir, "checkpoints", "latest")
    if not os.path.exists(p):
        return None
    d = os.path.join(run_dir, "checkpoints", open(p).read().strip())
    return d if os.path.exists(os.path.join(d, "trainer.pt")) else None


def load_checkpoint(path: str, model, optimizer) -> dict:
    """Restore model and optimiser in place from ``path``; return the stored loop state."""
    load_state(model, read_state_dict(path), where=path)
    st = torch.load(os.path.join(path, "trainer.pt"), map_location="cpu", weights_only=False)
    optimizer.load_state_dict(st.pop("optimizer"))
    return st
