"""Tensor-parallel runtime on several GPUs: `torchrun --nproc_per_node 2 benchmarks/tp_bench.py [--out DIR]`.

Each rank runs the same device-side loop on its shard (`orl.engine.tp`). Reports, from rank 0:
  1. correctness: float32 sdar/small, TP = world vs the reference decoder (same tokens expected),
     per mode (eager / graph / while);
  2. speed on the Qwen3-4B shape (random bf16 weights, 512-token context, K = 32 and 256):
     per-round GPU time of the round graph at TP = world (PyTorch layers, no compile; and with
     ``--kernels triton`` the Triton forward) vs TP = 1 on rank 0 (the same settings, and with
     torch.compile as the single-GPU default), plus whether the TP tokens equal TP = 1's (bf16: they
     may part at a rounding tie; the first differing index is printed).
Writes DIR/tp_results.md.
"""
from __future__ import annotations

import argparse
import os
import sys
import traceback

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import engine as E  # noqa: E402  (gpu_time, wall_time)

from orl.decode import DecodeConfig, decode  # noqa: E402
from orl.engine import tp  # noqa: E402
from orl.engine.graphs import conditional_nodes_available  # noqa: E402
from orl.engine.runtime import Runtime  # noqa: E402
from orl.model import build_model, get_config  # noqa: E402

RANK, WORLD = 0, 1
say = E.say   # main() names tp_results.md and silences every rank but 0


def modes() -> list[str]:
    return ["graph"] + (["while"] if conditional_nodes_available()[0] else [])


def correctness(dev) -> None:
    say(f"## Correctness: float32 sdar/small, TP={WORLD} vs the reference decoder\n")
    model = build_model(get_config("sdar", "small", tie_embeddings=False), seed=1, device=dev).eval()
    torch.nn.init.normal_(model.residual_pathway.mlp.down_proj.weight, std=0.2,
                          generator=torch.Generator(dev).manual_seed(0))
    K = model.config.block_size
    prompt = torch.randint(5, 60, (1, 11), generator=torch.Generator().manual_seed(3)).to(dev)
    cfg = DecodeConfig(block_size=K, max_new_tokens=3 * K - 3, threshold=0.05)
    ref = decode(model, prompt, cfg)
    for mode in ["eager"] + modes():
        try:
            out = Runtime(model, K, mode=mode, max_len=256, bucket=64, tp=True).decode(prompt, cfg)
            say(f"- mode {mode}: same tokens {out.tokens == ref.tokens}, same rounds "
                f"{out.steps_per_block == ref.steps_per_block} (expect True, True)")
        except Exception as exc:  # noqa: BLE001 - report and go on (every rank fails alike)
            say(f"- mode {mode}: failed: {type(exc).__name__}: {exc}")
            traceback.print_exc()
    say()


def measure(model, prompt, K, mode, *, tp_on, kernels="torch", compile_layers=False) -> dict:
    """Round-graph GPU time, whole-block wall time and two blocks' tokens (as benchmarks/engine.py)."""
    P = prompt.shape[1]
    rt = Runtime(model, K, mode=mode, max_len=P + 4 * K, tp=tp_on, kernels=kernels, compile=compile_layers)
    rt.set_request(DecodeConfig(block_size=K, max_new_tokens=K, threshold=1.0, steps=32 if K == 32 else 16))
    rt.prefill(prompt)
    toks = rt.generate_block()[0] + rt.generate_block()[0]

    def block():
        rt.truncate(P)
        rt.pending = True
        return rt.generate_block()
    wall = E.wall_time(block, iters=5, warmup=1)
    S = rt._slots(P + 2 * K)
    g = rt._graph("round", False, S)
    rt.truncate(P)
    t = E.gpu_time(g.replay, iters=30)
    return {"round": t, "block": wall, "tokens": toks, "bytes": rt.w.weight_bytes()}


def speed(dev, kernel_list) -> None:
    say(f"## Speed: Qwen3-4B shape, bf16, 512-token context, TP={WORLD} vs TP=1\n")
    cfg = get_config("sdar", "qwen3-4b")
    P = 512
    model = build_model(cfg, seed=0, dtype=torch.bfloat16, device=dev).eval()
    prompt = torch.randint(0, cfg.vocab_size, (1, P), generator=torch.Generator().manual_seed(0)).to(dev)
    # "graph": NCCL's all-reduce does not capture into a conditional WHILE body ("invalid argument"
    # at capture end, measured 2026-11-30), so TP runs one graph per round with a host loop
    mode = os.environ.get("TP_MODE", "graph")
    say(f"mode {mode}; per round = GPU time of one round graph (CUDA events, median of 30, rank 0)\n")
    say("| K | TP | kernels | per round ms | weight bytes per rank GB | block ms (wall) | tokens equal TP=1 |")
    say("|---|---|---|---|---|---|---|")
    for K in (32, 256):
        single = {}
        for kern in kernel_list:
            if RANK == 0:  # TP = 1 on rank 0 while the others wait
                for comp in ([False, True] if kern == "torch" else [False]):
                    try:
                        torch._dynamo.reset()
                        r = measure(model, prompt, K, mode, tp_on=False, kernels=kern, compile_layers=comp)
                        single.setdefault(kern, r)
                        say(f"| {K} | 1 | {kern}{' + compile' if comp else ''} | {r['round'] * 1e3:.3f} | "
                            f"{r['bytes'] / 1e9:.2f} | {r['block'] * 1e3:.2f} | - |")
                    except Exception as exc:  # noqa: BLE001
                        say(f"| {K} | 1 | {kern} | failed: {type(exc).__name__}: {exc} |")
                    torch.cuda.empty_cache()
            dist.barrier()
            try:
                r = measure(model, prompt, K, mode, tp_on=True, kernels=kern)
                ref = single.get(kern)
                diff = None if ref is None else next(
                    (i for i, (a, b) in enumerate(zip(r["tokens"], ref["tokens"])) if a != b), None)
                eq = "-" if ref is None else ("yes" if diff is None else f"no (first diff at {diff})")
                say(f"| {K} | {WORLD} | {kern} | {r['round'] * 1e3:.3f} | {r['bytes'] / 1e9:.2f} | "
                    f"{r['block'] * 1e3:.2f} | {eq} |")
            except Exception as exc:  # noqa: BLE001
                say(f"| {K} | {WORLD} | {kern} | failed: {type(exc).__name__}: {exc} |")
                traceback.print_exc()
            torch.cuda.empty_cache()
            dist.barrier()
    say("\nbf16 tokens may part from TP=1's at an argmax near-tie (the all-reduce sums in a different "
        "order); the float32 section checks exact equality.")


def main() -> None:
    global RANK, WORLD
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--kernels", choices=["torch", "triton", "both"], default="both")
    args = ap.parse_args()
    if "RANK" not in os.environ:
        sys.exit("launch with torchrun, e.g. torchrun --nproc_per_node 2 benchmarks/tp_bench.py")
    if not torch.cuda.is_available():
        sys.exit("tp_bench.py needs CUDA GPUs (the CPU path is tested in tests/test_engine_tp.py)")
    RANK, WORLD, dev = tp.setup()
    E.OUT_DIR[0], E.RESULTS_FILE[0], E.QUIET[0] = args.out, "tp_results.md", RANK != 0
    os.makedirs(args.out, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    say(f"# Tensor-parallel engine benchmark\n\n{WORLD} x {torch.cuda.get_device_name()} · "
        f"torch {torch.__version__} · command: `torchrun --nproc_per_node {WORLD} benchmarks/tp_bench.py`\n")
    kernel_list = {"torch": ["torch"], "triton": ["triton"], "both": ["torch", "triton"]}[args.kernels]
    for section in (lambda: correctness(dev), lambda: speed(dev, kernel_list)):
        try:
            with torch.no_grad():
                section()
        except Exception as exc:  # noqa: BLE001
            say(f"\nsection failed: {type(exc).__name__}: {exc}\n")
            traceback.print_exc()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
