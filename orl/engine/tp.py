"""Tensor parallelism for the dense engine runtime, under ``torchrun`` (``EngineConfig.tp = True``).

Megatron-style sharding of the baked weights over the ranks of the default ``torch.distributed``
group (NCCL on GPUs, gloo on CPU), R ranks, rank r:
  qkv      column-parallel by heads: the q rows of query heads [r H/R, (r+1) H/R) and the k / v rows
           of KV heads [r Hkv/R, (r+1) Hkv/R) (a GQA group never straddles ranks); each rank keeps
           only its KV heads in its cache
  o        row-parallel (the matching H hd / R input columns), then an all-reduce (sum)
  gate_up  column-parallel: gate and up rows [r I/R, (r+1) I/R)
  down     row-parallel, then an all-reduce
  LM head, embedding, norms, residual pathway: replicated. After each all-reduce every rank holds
           the same hidden states, so every rank computes the same logits and takes the same
           decisions: each runs the same device-side loop and no tokens are exchanged.
Two all-reduces of (T, D) per layer. The replicated LM head (0.78 GB at the Qwen3-4B shape) bounds
the speed-up at 2 ranks to about 1.5x; a vocab-parallel head (all-gather of the logits) is the
next step. Numerics: the per-rank partial sums are added by the collective, so logits match one
process within rounding (float32: the same tokens, `tests/test_engine_tp.py`).
Does not own: process launch (``torchrun``), what is decoded (`orl.engine.runtime`).
"""
from __future__ import annotations

import dataclasses
import functools

import torch
import torch.distributed as dist


def setup() -> tuple[int, int, torch.device]:
    """Join the ``torchrun`` group (NCCL when CUDA is available, else gloo) if not joined yet;
    returns (rank, world size, this rank's device)."""
    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if torch.cuda.is_available():
        dev = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
    return rank, world, dev


def _all_reduce(t: torch.Tensor, group=None) -> torch.Tensor:
    dist.all_reduce(t, group=group)
    return t


def shard(w, rank: int | None = None, world: int | None = None, group=None):
    """This rank's share of a `orl.engine.forward.Baked` (see module docstring): a new Baked whose
    cfg has the local head and MLP counts and whose ``tp_reduce`` all-reduces over ``group``."""
    if not dist.is_initialized():
        raise RuntimeError("tensor parallelism needs torch.distributed: launch with torchrun "
                           "(orl.engine.tp.setup() joins the group)")
    rank = dist.get_rank(group) if rank is None else rank
    world = dist.get_world_size(group) if world is None else world
    cfg = w.cfg
    H, Hkv, hd, I = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size
    if any(getattr(lw, "moe", None) is not None for lw in w.layers):
        raise NotImplementedError("tensor parallelism covers dense layers; MoE layers are not sharded yet")
    if H % world or Hkv % world or I % world:
        raise ValueError(f"{world} ranks must divide the heads ({H}), KV heads ({Hkv}) and MLP width ({I})")
    Hl, Hkvl, Il = H // world, Hkv // world, I // world

    def rows(t, lo, n):
        return t[lo:lo + n]

    def qkv_slice(t):  # t: ((H + 2 Hkv) hd, ...) or its bias
        q = rows(t, rank * Hl * hd, Hl * hd)
        k = rows(t, H * hd + rank * Hkvl * hd, Hkvl * hd)
        v = rows(t, (H + Hkv) * hd + rank * Hkvl * hd, Hkvl * hd)
        return torch.cat([q, k, v]).contiguous()

    layers = []
    for lw in w.layers:
        layers.append(lw._replace(
            qkv=qkv_slice(lw.qkv), qkv_bias=None if lw.qkv_bias is None else qkv_slice(lw.qkv_bias),
            o=lw.o[:, rank * Hl * hd:(rank + 1) * Hl * hd].contiguous(),
            gate_up=torch.cat([rows(lw.gate_up, rank * Il, Il), rows(lw.gate_up, I + rank * Il, Il)]).contiguous(),
            down=lw.down[:, rank * Il:(rank + 1) * Il].contiguous()))
    local = dataclasses.replace(cfg, num_heads=Hl, num_kv_heads=Hkvl, intermediate_size=Il)
    return dataclasses.replace(w, cfg=local, layers=layers, tp_reduce=functools.partial(_all_reduce, group=group))
