"""Rollout benchmark: G rows per launch through the runtime, one command on a GPU.

    python benchmarks/rollout.py --out DIR [--families sdar,llada] [--batches 1,8,16,64]
                                 [--new-tokens 256] [--ref-batch 16]

For the Qwen3-4B shape (block 32) and the LLaDA-2.1-mini shape (random bf16 weights, built on the
GPU), one shared 128-token prompt, sampled rollouts (temperature 1.0, the SDAR threshold rule /
LLaDA's threshold + editing with thresholds that never fire, so every block takes a fixed number of
rounds: 16 for SDAR (2 tokens a round), 33 for LLaDA (one mask a round + one editing-only step)),
``--new-tokens`` per row, for each batch B:
  * per-round latency = (decode wall - prefill) / rounds, against its floor: max((weight bytes +
    the KV bytes a round reads) / copy bandwidth, matmul FLOPs of B*K rows / bf16 matmul rate),
    both ceilings measured in this run (`benchmarks/engine.py`'s `ceilings`, `round_flops`);
  * rollout tokens/s (B * new tokens / decode wall);
  * capture overhead: the same decode with `capture_topk=16` (every step's state into pinned host
    memory) against without;
and the eager reference decoder (`orl.decode.decode(trace=True)`, what the ORL loop ran on CPU)
on the ``--ref-batch`` batch, same prompt and tokens, in the same run. Writes DIR/rollout_results.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import engine as E  # noqa: E402

from orl.decode import DecodeConfig, decode  # noqa: E402
from orl.decode.rng import CounterRNG  # noqa: E402
from orl.engine.runtime import Runtime  # noqa: E402
from orl.model import build_model, get_config  # noqa: E402

P, TOPK = 128, 16
SAMPLER = ["torch"]  # the mask rules' logits pass: "torch", or "triton" (orl.kernels.canvas, fused)


def family(name: str):
    """(model, DecodeConfig fields, rounds per block) of a family's benchmark shape."""
    if name == "sdar":
        cfg = get_config("sdar", "qwen3-4b")
        model = build_model(cfg, seed=0, dtype=torch.bfloat16, device="cuda").eval()
        return model, dict(rule="threshold", threshold=1.01, steps=16), 16
    import engine_llada  # noqa: PLC0415
    model = engine_llada.random_model(get_config("llada", "llada2.1-mini"))
    return model, dict(rule="llada", threshold=1.01, edit_threshold=1.01, max_post_steps=1), 33


def timed(fn) -> float:
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t


def run(name: str, batches: list[int], new_tokens: int, ref_batch: int, profile: tuple = ()) -> None:
    torch._dynamo.reset()
    model, rule, rpb = family(name)
    K = model.config.block_size
    prompt = torch.randint(0, model.config.vocab_size, (1, P), generator=torch.Generator().manual_seed(0)).cuda()
    dcfg = DecodeConfig(block_size=K, max_new_tokens=new_tokens, temperature=1.0, **rule)
    E.say(f"## Rollouts: {name} shape ({model.config.num_layers} layers, D {model.config.hidden_size}), "
          f"bf16, {P}-token prompt, {new_tokens} new tokens, block {K}, {rpb} rounds a block\n")
    rows, ref_tps, ref_tps_rt = [], None, None
    for B in batches:
        try:
            r = one_batch(model, prompt, dcfg, B, new_tokens, B in profile)
        except Exception as exc:  # noqa: BLE001 - report and go on to the next batch
            E.say(f"  B = {B} failed: {type(exc).__name__}: {str(exc)[:300]}")
            torch.cuda.empty_cache()
            continue
        rows.append(r["row"])
        if B == ref_batch:
            ref_tps_rt = r["tps"]
    E.table(["B", "B*K rows", "rounds", "ms / round", "floor ms", "x floor", "rollout tok/s", "decode s",
             "capture overhead", "setup s"], rows)
    if ref_batch:
        p = prompt.expand(ref_batch, -1)
        decode(model, p, dataclasses.replace(dcfg, max_new_tokens=K), rng=CounterRNG(2), trace=True)  # warm-up
        t = timed(lambda: decode(model, p, dcfg, rng=CounterRNG(2), trace=True))
        ref_tps = ref_batch * new_tokens / t
        vs = f"= **{ref_tps_rt / ref_tps:.1f}x** (target >= 10x)" if ref_tps_rt else "(runtime row missing)"
        E.say(f"Eager reference decoder (`orl.decode.decode(trace=True)` without logits in the trace, so lighter "
              f"than the ORL loop's; bf16, cached), B = {ref_batch}: {t:.2f} s, {ref_tps:.0f} tokens/s; the runtime "
              f"at B = {ref_batch}: {ref_tps_rt or 0:.0f} tokens/s {vs}\n")
    torch.cuda.empty_cache()


def one_batch(model, prompt, dcfg, B: int, new_tokens: int, profile: bool = False) -> dict:
    K = dcfg.block_size
    t0 = time.perf_counter()
    rt = Runtime(model, K, batch=B, max_len=P + new_tokens + 2 * K, bucket=64, sampler=SAMPLER[0])
    rt.decode(prompt, dcfg, seed=1)  # compile + capture the graphs of every cache bucket
    rt.decode(prompt, dcfg, seed=1, capture_topk=TOPK)
    setup = time.perf_counter() - t0
    t_pre = timed(lambda: rt.prefill(prompt))
    walls = {}
    for cap in (None, TOPK):
        ts = []
        for rep in range(2):
            ts.append(timed(lambda: rt.decode(prompt, dcfg, seed=2 + rep, capture_topk=cap)))
        walls[cap] = min(ts)
    out = rt.decode(prompt, dcfg, seed=2, capture_topk=TOPK)
    got_rounds = sum(max(s[b] for s in out.steps_per_block) for b in range(len(out.steps_per_block[0])))
    per_round = (walls[None] - t_pre) / got_rounds
    S = P + new_tokens // 2 + K  # attended slots, averaged over the rollout
    kv_read = rt.kv.bytes_per_slot() * B * S
    ids, touched = None, ""
    if any(lw.moe is not None for lw in rt.w.layers):  # MoE: count only the experts a round touches
        ids, touched = moe_route_ids(rt)
    wbytes = rt.w.weight_bytes(ids)
    floor, how = E.floor_of(rt.w, B * K, S, wbytes + kv_read, ids)
    cap_over = walls[TOPK] / walls[None] - 1
    tps = B * new_tokens / walls[None]
    n_states = len(out.trace)
    row = [B, B * K, got_rounds, f"{per_round * 1e3:.2f}", f"{floor * 1e3:.2f}", f"{per_round / floor:.2f}",
           f"{tps:.0f}", f"{walls[None]:.2f}", f"{100 * cap_over:+.1f} %", f"{setup:.0f}"]
    E.say("  " + " | ".join(str(x) for x in row) + f"   (floor: {how}{touched}; {n_states} captured steps; "
          f"capture {rt._cap.bytes_per_round() / 1e6:.1f} MB a round)")
    if profile:  # where a round's time goes, with and without capture (the request state of the last decode)
        for cap in (TOPK, None):
            rt.set_request(dcfg, seed=2, capture_topk=cap)
            rt.prefill(prompt)
            E.say(f"\n### B = {B}: one round's GPU time by kernel kind ({'with' if cap else 'without'} capture)\n")
            E.table(["kind", "kernels", "ms"], E.profile_round(rt, P, K, graph=True))
    return {"row": row, "tps": tps}


def moe_route_ids(rt) -> tuple[list | None, str]:
    """Router ids of one eager forward over the runtime's last canvas (B rows of the last block of a
    decode: the rows' own sampled tokens), and a note of how many experts they touch. The runtime
    is left truncated to the prompt, so call it after the timed decodes and the profile. On failure
    (None, note): the floor then counts every expert, as the note says."""
    import engine_llada  # noqa: PLC0415
    try:
        ids, _ = engine_llada.touched(rt, P)
    except Exception as exc:  # noqa: BLE001 - report and fall back to all experts
        return None, f"; router ids failed ({type(exc).__name__}), floor counts ALL experts"
    per = [int(torch.unique(i).numel()) for i in ids]
    return ids, f"; a round touches {sum(per) / len(per):.1f} of {rt.w.cfg.num_experts} experts per MoE layer"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--families", default="sdar,llada")
    ap.add_argument("--batches", default="1,8,16,64")
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--ref-batch", type=int, default=16)
    ap.add_argument("--sampler", default="torch", choices=["torch", "triton"],
                    help="the mask rules' logits pass: torch ops, or the fused Triton kernel")
    ap.add_argument("--profile", default="", help="profile one round at these batches (comma-separated; empty: none)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    SAMPLER[0] = a.sampler
    E.OUT_DIR[0], E.RESULTS_FILE[0] = a.out, "rollout_results.md"
    bw, tf = E.ceilings()
    E.LOG["copy_bw"], E.LOG["bf16_tflops"] = bw, tf
    E.say(f"# Rollout benchmark ({datetime.date.today()}, {torch.cuda.get_device_name()}, torch {torch.__version__})\n")
    E.say(f"`python benchmarks/rollout.py --families {a.families} --batches {a.batches} --new-tokens {a.new_tokens} "
          f"--ref-batch {a.ref_batch} --sampler {a.sampler}`; ceilings: copy {bw / 1e12:.2f} TB/s, bf16 matmul {tf / 1e12:.0f} TFLOP/s\n")
    for name in a.families.split(","):
        run(name, [int(b) for b in a.batches.split(",")], a.new_tokens, a.ref_batch,
            tuple(int(b) for b in a.profile.split(",") if b))


if __name__ == "__main__":
    main()
