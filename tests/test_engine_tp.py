"""Tensor parallelism (`orl.engine.tp`) on CPU: two gloo processes, each running the runtime on
its shard (eager, float32), give the same tokens and rounds as one process and as the reference
decoder; the shards cover the weights exactly once."""
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from orl.decode import DecodeConfig, decode
from orl.engine.runtime import Runtime
from orl.model import build_model, get_config


def _model(size):
    m = build_model(get_config("sdar", size, tie_embeddings=False), seed=1).eval()
    # an explicit generator: the parent and the spawned ranks must build the very same weights
    torch.nn.init.normal_(m.residual_pathway.mlp.down_proj.weight, std=0.2, generator=torch.Generator().manual_seed(1))
    return m


def _cfg(model):
    K = model.config.block_size
    return DecodeConfig(rule="threshold", block_size=K, max_new_tokens=3 * K - 2, threshold=0.05, residual=True)


PROMPT = [[7, 8, 9, 11, 5, 6, 30]]


def _worker(rank, world, rendezvous, size, out_path):
    torch.set_num_threads(1)
    # rendezvous through a file: no TCP port to pick, so nothing another process can take first
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    try:
        model = _model(size)
        rt = Runtime(model, model.config.block_size, mode="eager", max_len=128, bucket=32, tp=True)
        out = rt.decode(torch.tensor(PROMPT), _cfg(model))
        n_local = sum(lw.qkv.numel() + lw.o.numel() + lw.gate_up.numel() + lw.down.numel() for lw in rt.w.layers)
        torch.save({"tokens": out.tokens, "steps": out.steps_per_block, "n_local": n_local,
                    "kv_heads": rt.kv.k[0].shape[1]}, f"{out_path}.{rank}")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("size", ["small"])
def test_tp2_tokens_equal_single_process(size, tmp_path):
    model = _model(size)
    cfg = _cfg(model)
    ref = decode(model, torch.tensor(PROMPT), cfg)
    one = Runtime(model, model.config.block_size, mode="eager", max_len=128, bucket=32)
    one = one.decode(torch.tensor(PROMPT), cfg)
    assert one.tokens == ref.tokens
    out = str(tmp_path / "tp")
    mp.spawn(_worker, args=(2, str(tmp_path / "rendezvous"), size, out), nprocs=2, join=True)
    res = [torch.load(f"{out}.{r}") for r in range(2)]
    full = sum(lw.qkv.numel() + lw.o.numel() + lw.gate_up.numel() + lw.down.numel()
               for lw in Runtime(model, model.config.block_size, mode="eager", max_len=16).w.layers)
    assert res[0]["n_local"] + res[1]["n_local"] == full
    assert res[0]["kv_heads"] == model.config.num_kv_heads // 2
    for r in res:
        assert r["tokens"] == ref.tokens, "a tensor-parallel rank decoded different tokens"
        assert r["steps"] == ref.steps_per_block
