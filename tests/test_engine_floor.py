"""The engine benchmark's floor (`benchmarks/engine.py`): the matmul FLOPs it charges one round
(``round_flops``) equal what torch's own FLOP counter sees on that same forward -- dense (sdar) and
MoE (llada, the PyTorch expert twin) -- and the floor is the larger of its two bounds."""
import os
import sys

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import engine as E  # noqa: E402

from orl.engine.forward import StaticKV, bake, embed, forward  # noqa: E402
from orl.model import build_model, get_config  # noqa: E402


@pytest.mark.parametrize("family", ["sdar", "llada"])
def test_round_flops_match_torch_flop_counter(family):
    model = build_model(get_config(family, "tiny"), seed=0).eval()
    w = bake(model, max_len=64, moe_backend="torch")
    cfg = model.config
    T, start, S = 8, 16, 32
    kv = StaticKV(cfg, 64, w.dtype, "cpu")
    tokens = torch.randint(0, cfg.vocab_size, (1, T), generator=torch.Generator().manual_seed(0))
    lim = torch.full((T,), T)
    ids: list = []
    with torch.no_grad():
        h = embed(w, tokens)
        # the math SDPA backend: its matmuls are what the counter sees (it has no rule for the CPU flash op)
        with FlopCounterMode(display=False) as fc, sdpa_kernel(SDPBackend.MATH):
            forward(w, h, torch.tensor([start]), lim, kv, S, route_out=ids if family == "llada" else None)
    counted = fc.get_total_flops()
    if family == "llada":  # route_out ran the router a second time (for the ids): not part of a round
        with torch.no_grad(), FlopCounterMode(display=False) as fc2:
            for lw in w.layers:
                if lw.moe is not None:
                    torch.nn.functional.linear(torch.zeros(T, cfg.hidden_size), lw.moe.router)
        counted -= fc2.get_total_flops()
        assert len(ids) == cfg.num_layers - cfg.first_dense_layers
    assert E.round_flops(w, T, S, ids or None) == pytest.approx(counted, rel=1e-9)


def test_floor_is_the_larger_bound(monkeypatch):
    w = bake(build_model(get_config("sdar", "tiny"), seed=0).eval(), max_len=64)
    monkeypatch.setitem(E.LOG, "copy_bw", 1e12)
    monkeypatch.setitem(E.LOG, "bf16_tflops", 1e15)
    flops = E.round_flops(w, 4, 16)
    t, how = E.floor_of(w, 4, 16, wbytes=1e9)                       # 1 ms of bytes, far more than the FLOPs
    assert t == pytest.approx(1e-3) and "bytes" in how
    t, _ = E.floor_of(w, 4, 16, wbytes=1.0)                          # negligible bytes: the FLOP bound
    assert t == pytest.approx(flops / 1e15)
