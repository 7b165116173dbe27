"""Data parallelism for the ORL loop: FSDP2 sharding, the full copy the rollouts decode with, and
checkpoints through torch.distributed.checkpoint (DCP) that resume on any number of ranks.

Under ``torchrun`` (a process group of W > 1 ranks) the trained model is sharded with FSDP2
(``torch.distributed.fsdp.fully_shard`` per decoder layer, then the root): each rank holds 1/W of
the parameters, gradients and AdamW state; a forward all-gathers a layer's parameters, a backward
reduce-scatters its gradients, summed over ranks (the loop scales each rank's loss so that the sum
is the global loss: docs/method.md 3.3.5). Two consequences the loop follows:

  * rollouts decode different prompts on each rank, a different number of forwards each, so they
    cannot run through the sharded model (its all-gathers are collectives): each rank decodes with
    a plain full copy (``replica``), refreshed from the shards once per step (`full_state`);
  * every rank runs the same number of replay forwards and backwards: a rank with fewer micro-
    batches runs `idle_pass`es (a zero loss through the whole model) until all ranks are done.

Checkpoints: `save_dcp` / `load_dcp` write the model and optimizer state through DCP (each rank its
shards; any world size reads them back, 1 process included), beside the full model in HF layout.
Does not own: the step (`orl.train.loop`), the checkpoint folder's layout (`orl.train.checkpoint`).
"""
from __future__ import annotations

import contextlib
import copy
import warnings

import torch
import torch.distributed as dist


def shard(model, param_dtype: torch.dtype | None = None) -> None:
    """FSDP2 over the default process group, in place: one unit per decoder layer, then the root
    (embeddings, pathway, final norm, head); gradients summed over ranks, not averaged.
    ``param_dtype`` (bf16 for precision="bf16"): the dtype parameters are all-gathered in (half the
    traffic of float32; gradients reduce in float32 into the float32 shards)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # noqa: PLC0415
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32) if param_dtype else \
        MixedPrecisionPolicy()
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    model.set_gradient_divide_factor(1.0)
    model.set_force_sum_reduction_for_comms(True)  # plain SUM (gloo has no pre-multiplied sum)


def make_replica(model, dtype: torch.dtype | None = None):
    """A plain full copy for the rollouts (no gradients; taken before `shard`), in ``dtype`` (the
    runtime's rollout dtype: a bf16 copy is half a float32 one; None: the model's)."""
    rep = copy.deepcopy(model).eval().requires_grad_(False)
    return rep if dtype is None else rep.to(dtype)


def full_state(model) -> dict:
    """The full (unsharded) state dict on every rank; a collective under FSDP2."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict  # noqa: PLC0415
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))


def idle_pass(model, device) -> None:
    """A forward and backward of zero loss through every sharded unit (the all-gathers and
    reduce-scatters of one micro-batch, no contribution to any gradient)."""
    K = model.config.block_size
    tok = torch.zeros(1, K, dtype=torch.long, device=device)
    mask = torch.ones(1, K, K, dtype=torch.bool, device=device)
    out = model(tok, torch.arange(K, device=device), mask, return_hidden=True)
    (model.head(out).sum() * 0.0).backward()


def _joined() -> bool:
    return dist.is_available() and dist.is_initialized()


@contextlib.contextmanager
def _single_process_quiet():
    """DCP warns on every call without a process group that it assumes one process: we do."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def max_over_ranks(n: int, device) -> int:
    t = torch.tensor([n], dtype=torch.long, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def grad_norm(gn) -> float:
    """A clip_grad_norm_ result as a float (a DTensor under FSDP2)."""
    return float(gn.full_tensor() if hasattr(gn, "full_tensor") else gn)


def fill_adam_state(optimizer) -> None:
    """Give every parameter without AdamW state (it never had a gradient yet, e.g. the residual
    pathway before its SFT stage) the state AdamW would create on its first step (step 0, zero
    moments), so that saved and loaded state dicts hold the same keys; AdamW's later steps are
    the same as from no state."""
    if not isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW):
        raise TypeError(f"checkpoints of the loops hold AdamW state, not {type(optimizer).__name__}")
    from torch.optim.optimizer import _get_scalar_dtype  # noqa: PLC0415
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad and not optimizer.state.get(p):
                st = {"step": torch.tensor(0.0, dtype=_get_scalar_dtype()),
                      "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                      "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
                if group.get("amsgrad"):
                    st["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                optimizer.state[p] = st


def save_dcp(path: str, model, optimizer) -> None:
    """Model and optimizer state into ``path`` (a folder) through DCP; every rank calls it."""
    import torch.distributed.checkpoint as dcp  # noqa: PLC0415
    from torch.distributed.checkpoint.state_dict import get_state_dict  # noqa: PLC0415
    fill_adam_state(optimizer)
    msd, osd = get_state_dict(model, optimizer)
    with _single_process_quiet():
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=path, no_dist=not _joined())


def load_dcp(path: str, model, optimizer) -> None:
    """Restore what `save_dcp` wrote into ``model`` / ``optimizer`` as they are sharded now (any
    number of ranks, one process included): DCP reads each rank's slices."""
    import torch.distributed.checkpoint as dcp  # noqa: PLC0415
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # noqa: PLC0415
    fill_adam_state(optimizer)
    msd, osd = get_state_dict(model, optimizer)
    state = {"model": msd, "optim": osd}
    with _single_process_quiet():
        dcp.load(state, checkpoint_id=path, no_dist=not _joined())
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
