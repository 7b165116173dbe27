"""Engine benchmark: one command on a GPU, `python benchmarks/engine.py [--out DIR]`.

Measures, in order:
  1. the card's ceilings: device-to-device copy bandwidth (bytes read + written) and the bf16
     matmul rate (8192^3);
  2. correctness: the runtime against the reference decoder (orl.decode.decode, cached, greedy) --
     end-to-end tokens and round-by-round parity (`orl.engine.parity`) -- for tiny/small models in
     float32 and bf16 and a 2-layer Qwen3-4B shape in bf16, in each execution mode;
  3. speed on the Qwen3-4B shape (random weights, bf16, 512-token context), 32-token block and
     256-token canvas: per-round latency of
       (a) the reference decoder, eager (`orl.decode.decode`): the first engine baseline,
       (b) our runtime: one round as a CUDA graph; whole blocks in mode "while" (one launch),
           "graph" (host loop, one sync per round) and "eager"; optionally torch.compile'd layers,
       (c) transformers' Qwen3ForCausalLM (eager, dynamic cache cropped back each call),
     against the floor = weight bytes / measured copy bandwidth; host overhead per round =
     (block wall time - GPU time of its rounds) / rounds; whole-block latency for fixed rounds
     (threshold 1.0 never fires, so the top-quota fallback commits K/steps tokens per round);
  4. where one round's GPU time goes (profiler, eager round, kernels grouped by kind).
``--families sdar,llada`` adds the LLaDA-2.1-mini MoE shape (`benchmarks/engine_llada.py`: its
correctness on llada/tiny, then the same table with a floor counting only the experts a round
touches); the default ``--families sdar`` is the run above. ``--families dgemma`` runs the
DiffusionGemma 26B-A4B shape (`benchmarks/engine_dgemma.py`: correctness on dgemma/tiny, then our
runtime against its floor and transformers' own DiffusionGemma generate on the same weights).
Prints markdown tables and writes them to DIR/engine_results.md (and a JSON log).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from orl.decode import DecodeConfig, decode  # noqa: E402
from orl.engine.graphs import conditional_nodes_available  # noqa: E402
from orl.engine.parity import compare_decode, teacher_forced  # noqa: E402
from orl.engine.runtime import Runtime  # noqa: E402
from orl.model import build_model, get_config  # noqa: E402

LOG: dict = {}
OUT_LINES: list[str] = []


OUT_DIR = ["."]
RESULTS_FILE = ["engine_results.md"]   # the other benchmark scripts set their own name
QUIET = [False]                        # e.g. every rank but 0 under torchrun


def say(line: str = "") -> None:
    """Print, and rewrite the results file so a run stopped part-way keeps what it measured."""
    if QUIET[0]:
        return
    print(line, flush=True)
    OUT_LINES.append(line)
    with open(os.path.join(OUT_DIR[0], RESULTS_FILE[0]), "w") as f:
        f.write("\n".join(OUT_LINES) + "\n")


def table(header: list[str], rows: list[list]) -> None:
    say("| " + " | ".join(header) + " |")
    say("|" + "|".join("---" for _ in header) + "|")
    for r in rows:
        say("| " + " | ".join(str(x) for x in r) + " |")
    say()


def gpu_time(fn, iters: int = 20, warmup: int = 3) -> float:
    """Median seconds of fn() by CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) / 1e3)
    return statistics.median(ts)


def graph_time(fn, n_calls: int = 1) -> float:
    """GPU seconds per call of fn (which makes n_calls calls), captured in one CUDA graph after a
    warm-up on a side stream."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return gpu_time(g.replay, iters=20) / n_calls


def round_row(r: dict, mode: str, floor: float, wbytes: float) -> tuple[float, list]:
    """(seconds per round, the table cells per round ms / x floor / weight GB/s / host overhead)
    of one `ours` result: round GPU time for the graph modes (else block wall / rounds); host
    overhead = (block wall - block GPU time) / rounds for 'while', block wall / rounds - round
    time for 'graph', none for eager."""
    n = r["rounds"]
    per_round = r.get("round_gpu") or r.get("round_wall") or r["block_wall"] / n
    over = (r["block_wall"] - r["block_gpu"]) / n if "block_gpu" in r else \
        (r["block_wall"] / n - per_round if mode == "graph" else None)
    return per_round, [f"{per_round * 1e3:.3f}", f"{per_round / floor:.2f}", f"{wbytes / per_round / 1e9:.0f}",
                       "-" if over is None else f"{over * 1e6:.1f}"]


def wall_time(fn, iters: int = 10, warmup: int = 2) -> float:
    """Median seconds of fn() on the host clock, synchronised (fn syncs or we do)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


# ------------------------------------------------------------------------------ 1. ceilings
def ceilings() -> tuple[float, float]:
    n = 2 << 30  # 2 GiB per buffer, far past the 60 MB L2
    x = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
    y = torch.empty_like(x)
    t = gpu_time(lambda: y.copy_(x), iters=20)
    bw = 2 * n / t
    del x, y
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t = gpu_time(lambda: a @ b, iters=10)
    tf = 2 * 8192 ** 3 / t
    del a, b
    torch.cuda.empty_cache()
    return bw, tf


# --------------------------------------------------------------------------- 2. correctness
def correctness(modes: list[str]) -> None:
    say("## Correctness: runtime vs reference decoder (greedy, cached)\n")
    cases = [("sdar/tiny", dict(tie_embeddings=False), 8, 0.05, torch.float32),
             ("sdar/small", dict(tie_embeddings=False), 16, 0.05, torch.float32),
             ("sdar/small", dict(tie_embeddings=False), 16, 0.05, torch.bfloat16),
             ("qwen3-4b (2 layers)", dict(num_layers=2, layer_types=None, tie_embeddings=False), 32, 0.9, torch.float32),
             ("qwen3-4b (2 layers)", dict(num_layers=2, layer_types=None, tie_embeddings=False), 32, 0.9, torch.bfloat16)]
    rows = []
    for name, kw, K, thr, dtype in cases:
        size = "qwen3-4b" if name.startswith("qwen3") else name.split("/")[1]
        model = build_model(get_config("sdar", size, **kw), seed=1, device="cuda").eval()
        if model.residual_pathway is not None:
            torch.nn.init.normal_(model.residual_pathway.mlp.down_proj.weight, std=0.2)
        model = model.to(dtype)
        prompt = torch.randint(5, 60, (1, 13), generator=torch.Generator().manual_seed(5)).cuda()
        cfg = DecodeConfig(block_size=K, max_new_tokens=4 * K, threshold=thr)
        torch._dynamo.reset()  # compiled layers: a fresh cache per model (dynamo's per-function limit)
        runs = [(m, f, False) for m in modes for f in (True, False)] + [(modes[0], True, True)]
        for mode, fold, comp in runs:
            rt = Runtime(model, K, mode=mode, max_len=512, fold_commit=fold, bucket=64, compile=comp)
            c = compare_decode(rt, model, prompt, cfg)
            p = teacher_forced(rt, model, prompt, cfg)
            n = len(c["ref"].tokens[0])
            rows.append([name, str(dtype).replace("torch.", ""), mode + (" + compile" if comp else ""), fold,
                         "yes" if c["equal"] else f"no (first diff at {c['first_diff']}/{n})",
                         sum(c["ref"].steps_per_block[0]), f"{p.same_decision}/{p.rounds}", p.tie_explained,
                         len(p.unexplained), f"{p.max_rel_logit_err:.1e}"])
            LOG.setdefault("correctness", []).append(rows[-1])
        del model
    table(["model", "dtype", "mode", "fold commit", "same tokens end to end", "rounds (ref)",
           "teacher-forced: same decision", "tie-explained", "unexplained", "max rel. logit err"], rows)


# ------------------------------------------------------------------------------- 3. speed
def reference_round(model, prompt, K, steps, blocks: int = 4, **rule) -> tuple[float, int]:
    """Per-forward seconds of orl.decode.decode: the host time between two consecutive blocks'
    commits (``on_block``, synchronised) over that block's forwards (rounds + commit pass).
    ``rule``: DecodeConfig fields replacing the default threshold rule (e.g. the LLaDA rule)."""
    cfg = DecodeConfig(**{**dict(block_size=K, max_new_tokens=blocks * K, threshold=1.0, steps=steps), **rule})
    stamps: list[float] = []

    def mark(b, toks):
        torch.cuda.synchronize()
        stamps.append(time.perf_counter())

    decode(model, prompt, DecodeConfig(**{**dict(block_size=K, max_new_tokens=K, threshold=1.0, steps=steps),
                                          **rule}))  # warm-up
    out = decode(model, prompt, cfg, on_block=mark)
    rounds = out.steps_per_block[0][1]
    per_block = statistics.median(b - a for a, b in zip(stamps, stamps[1:]))
    return per_block / (rounds + 1), rounds


def ours(model, prompt, K, steps, mode, compile_layers, kernels: str = "torch", **rule) -> dict:
    """Our runtime at a fixed context: prefill once, then every timed block starts from the same
    committed length with a pending previous block (the steady state of fold_commit). ``rule``:
    DecodeConfig fields replacing the default threshold rule (e.g. the LLaDA rule)."""
    P = prompt.shape[1]
    t0 = time.perf_counter()
    rt = Runtime(model, K, mode=mode, max_len=P + 4 * K, compile=compile_layers, kernels=kernels)
    cfg = DecodeConfig(**{**dict(block_size=K, max_new_tokens=K, threshold=1.0, steps=steps), **rule})
    rt.set_request(cfg)
    rt.prefill(prompt)
    rt.generate_block()

    def block():
        rt.truncate(P)
        rt.pending = True  # as after any block: its tokens wait in rt.prev, committed by the next start
        return rt.generate_block()

    toks, rounds = block()
    setup = time.perf_counter() - t0
    wall = wall_time(block, iters=10, warmup=1)
    res = {"rounds": rounds, "block_wall": wall, "setup_s": setup, "rt": rt}
    if mode != "eager":
        S = rt._slots(P + 2 * K)
        g_round, g_start = rt._graph("round", False, S), rt._graph("start", True, S)
        rt.truncate(P)
        res["round_gpu"] = gpu_time(g_round.replay, iters=30)

        def replay_start():  # the folded start advances the cache length: rewind each time
            rt.truncate(P)
            g_start.replay()
        res["start_gpu"] = gpu_time(replay_start, iters=10)
        rt.truncate(P)
        if mode == "while":
            g_block = rt._graph("block", True, S)

            def replay():
                rt.truncate(P)
                rt.pending = True
                g_block.replay()
            res["block_gpu"] = gpu_time(replay, iters=10)
    return res


def gemm_chain(rt, M: int) -> float:
    """GPU seconds of only the round's matmuls (stock cuBLAS, M rows, one CUDA graph): the 4 per
    layer on the baked (fused) weights, then the LM head."""
    mats = [W for lw in rt.w.layers for W in (lw.qkv, lw.o, lw.gate_up, lw.down)] + [rt.w.lm_head]
    xs = {W.shape[1]: torch.randn(M, W.shape[1], device="cuda", dtype=W.dtype) for W in mats}

    def chain():
        for W in mats:
            torch.nn.functional.linear(xs[W.shape[1]], W)
    return graph_time(chain)


def hf_forward(cfg, K, P) -> float | None:
    try:
        from transformers import DynamicCache, Qwen3Config, Qwen3ForCausalLM  # noqa: PLC0415
    except ImportError:
        return None
    hcfg = Qwen3Config(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                       num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
                       num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                       max_position_embeddings=cfg.max_position, tie_word_embeddings=cfg.tie_embeddings,
                       rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta})
    torch.manual_seed(0)
    with torch.device("cuda"):
        hf = Qwen3ForCausalLM(hcfg).to(torch.bfloat16).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, P + K), device="cuda")
    cache = DynamicCache()
    with torch.no_grad():
        hf(input_ids=ids[:, :P], past_key_values=cache, use_cache=True)

        def step():
            hf(input_ids=ids[:, P:], past_key_values=cache, use_cache=True)
            cache.crop(P)
        t = wall_time(step, iters=10, warmup=3)
    del hf, cache
    torch.cuda.empty_cache()
    return t


def _kind(name: str) -> str:
    n = name.lower()
    return ("MoE grouped experts (orl triton)" if n.startswith("orl_moe") else
            "attention" if any(s in n for s in ("fmha", "attention", "flash", "attn")) else
            "gemm" if any(s in n for s in ("gemm", "cutlass", "sm90", "nvjet", "xmma")) else
            "norm / rope (orl triton)" if any(s in n for s in ("_add_norm", "_qk_rope")) else
            "inductor-fused (triton)" if n.startswith("triton") else
            "softmax/argmax/sort/reduce" if any(s in n for s in ("softmax", "argmax", "sort", "reduce")) else
            "elementwise/other")


def profile_round(rt, P, K, graph: bool = True, round_s: float | None = None, top: int = 8) -> list[list]:
    """Where one round's GPU time goes: kernels grouped by kind (rows [kind, count, ms]), then the
    ``top`` costliest kernels, then, for a replayed graph, the GPU time between kernels (round time
    minus the sum of kernel times: launch gaps, tails and waits). ``graph``: replay the round's CUDA
    graph as timed (compiled / Triton kernels as they run); else one eager round."""
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415
    S = rt._slots(P + 2 * K)
    rt.truncate(P)
    reps = 3 if graph else 1
    if graph:
        g = rt._graph("round", False, S)
        run = g.replay
    else:
        def run():
            rt._round(S)
    for _ in range(2):
        run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            run()
        torch.cuda.synchronize()
    kinds: dict[str, list] = {}
    names: dict[str, list] = {}
    total = 0.0
    for e in prof.events():
        if e.device_type.name != "CUDA":
            continue
        ms = (e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total) / 1e3 / reps
        for d, key in ((kinds, _kind(e.name)), (names, e.name[:70])):
            k = d.setdefault(key, [0, 0.0])
            k[0] += 1 / reps
            k[1] += ms
        total += ms
    if not kinds:
        raise RuntimeError("the profiler saw no kernels" + (" in the graph replay" if graph else ""))
    rows = [[k, round(v[0]), f"{v[1]:.3f}"] for k, v in sorted(kinds.items(), key=lambda kv: -kv[1][1])]
    rows.append(["**all kernels**", round(sum(v[0] for v in kinds.values())), f"{total:.3f}"])
    if graph and round_s is not None:
        rows.append(["**between kernels** (round GPU time - kernel time)", "-", f"{round_s * 1e3 - total:.3f}"])
    rows += [[f"top: `{k}`", round(v[0]), f"{v[1]:.3f}"] for k, v in
             sorted(names.items(), key=lambda kv: -kv[1][1])[:top]]
    return rows


def round_flops(w, M: int, S: int, route_ids: list | None = None) -> float:
    """Matmul FLOPs of one forward over M rows attending to S slots: every 2-D weight 2 M per
    element; MoE experts 2 per element per (token, expert) assignment (``route_ids`` one (M, k)
    tensor per MoE layer, else k per token); attention 4 M S H hd per layer; DiffusionGemma's
    self-conditioning soft embedding (probs @ E) once more the LM head's."""
    c = w.cfg
    f = 2.0 * M * w.lm_head.numel() * (2 if w.cfg.noise == "uniform" else 1)
    ids = iter(route_ids or [])
    for lw in w.layers:
        for name, t in lw._asdict().items():
            if isinstance(t, torch.Tensor) and t.dim() == 2:
                f += 2.0 * M * t.numel()
        moe = getattr(lw, "moe", None)
        if moe is not None:
            r = next(ids, None)
            assign = r.numel() if r is not None else M * c.num_experts_per_tok
            f += sum(2.0 * M * t.numel() for t in (moe.router, moe.shared_gate_up, moe.shared_down) if t is not None)
            f += 2.0 * assign * (moe.gate_up[0].numel() + moe.down[0].numel())
        f += 4.0 * M * S * c.num_heads * c.head_dim
    return f


def floor_of(w, M: int, S: int, wbytes: float, route_ids: list | None = None) -> tuple[float, str]:
    """(floor seconds, how it was found): max(weight bytes / copy bandwidth, matmul FLOPs / bf16
    rate), both ceilings measured in this run (LOG)."""
    t_bytes = wbytes / LOG["copy_bw"]
    flops = round_flops(w, M, S, route_ids)
    t_flops = flops / LOG["bf16_tflops"]
    how = (f"max(bytes {wbytes / 1e9:.3f} GB / {LOG['copy_bw'] / 1e12:.2f} TB/s = {t_bytes * 1e3:.3f} ms, "
           f"matmul {flops / 1e12:.3f} TFLOP / {LOG['bf16_tflops'] / 1e12:.0f} TFLOP/s = {t_flops * 1e3:.3f} ms)")
    return max(t_bytes, t_flops), how


def speed(bw: float, skip_hf: bool, kernels: str = "torch") -> None:
    torch._dynamo.reset()
    cfg = get_config("sdar", "qwen3-4b")
    P = 512
    say(f"## Speed: Qwen3-4B shape, random weights, bf16, {P}-token context\n")
    model = build_model(cfg, seed=0, dtype=torch.bfloat16, device="cuda").eval()
    prompt = torch.randint(0, cfg.vocab_size, (1, P), generator=torch.Generator().manual_seed(0)).cuda()
    rows, profs, notes = [], {}, []
    variants = [("while", True), ("graph", True), ("while", False), ("eager", False)]
    if kernels != "torch":  # the Triton forward (orl.kernels.layers): nothing to compile
        triton_rows = [("while", False, "triton"), ("graph", False, "triton")]
        variants = triton_rows if kernels == "triton" else variants[:1] + triton_rows + variants[1:]
    if QUICK:  # the best paths only (ORL_BENCH_PDL=1 adds the Triton forward with programmatic dependent launch)
        variants = ([("while", True)] if kernels != "triton" else []) + \
            ([("while", False, "triton")] if kernels != "torch" else []) + \
            ([("while", False, "triton-pdl")] if kernels != "torch" and os.environ.get("ORL_BENCH_PDL") else [])
    for K, steps_list in ((32, (32,) if QUICK else (32, 8)), (256, (16,))):
        probe = Runtime(model, K, mode="eager", max_len=P + 4 * K)
        wbytes = probe.w.weight_bytes()
        kv_bytes = probe.kv.bytes_per_slot() * (P + 2 * K)
        floor, how = floor_of(probe.w, K, P + K, wbytes)
        t_mm = gemm_chain(probe, K)
        del probe
        torch.cuda.empty_cache()
        notes.append(f"K={K}: floor {floor * 1e3:.3f} ms = {how}; weight bytes {wbytes / 1e9:.3f} GB "
                     f"(+ KV of {P + 2 * K} slots, {kv_bytes / 1e6:.0f} MB: {(wbytes + kv_bytes) / bw * 1e3:.3f} ms); "
                     f"the round's matmuls alone (stock cuBLAS, one graph): {t_mm * 1e3:.3f} ms = "
                     f"{t_mm / floor:.2f}x floor, {wbytes / t_mm / 1e12:.2f} TB/s")
        say(notes[-1])
        for steps in steps_list:
            if not QUICK:
                ref_t, ref_rounds = reference_round(model, prompt, K, steps)
                rows.append([K, "(a) reference decoder, eager", ref_rounds, f"{ref_t * 1e3:.2f}",
                             f"{ref_t / floor:.2f}", f"{wbytes / ref_t / 1e9:.0f}",
                             f"{ref_t * (ref_rounds + 1) * 1e3:.1f}", "-"])
                say("  " + " | ".join(str(x) for x in rows[-1]))
            for mode, comp, *kern in variants:
                kern = kern[0] if kern else "torch"
                if mode == "while" and "while" not in MODES:
                    continue
                pdl = os.environ.get("ORL_PDL")
                if kern == "triton-pdl":
                    os.environ["ORL_PDL"] = "1"
                try:
                    r = ours(model, prompt, K, steps, mode, comp, kernels=kern.removesuffix("-pdl"))
                except Exception as exc:  # noqa: BLE001 - report and go on
                    say(f"  {mode}{' + compile' if comp else ''} ({kern}) failed: {type(exc).__name__}: {exc}")
                    continue
                finally:
                    if pdl is None:
                        os.environ.pop("ORL_PDL", None)
                    else:
                        os.environ["ORL_PDL"] = pdl
                n = r["rounds"]
                name = f"(b) ours, {mode}" + (" + torch.compile" if comp else "") + \
                    (" + Triton kernels" if kern == "triton" else " + Triton kernels + PDL" if kern != "torch" else "")
                per_round, (ms, xf, gbs, over) = round_row(r, mode, floor, wbytes)
                rows.append([K, name, n, ms, xf, gbs, f"{r['block_wall'] * 1e3:.2f}", over])
                LOG.setdefault("speed", []).append(rows[-1] + [r["setup_s"], r.get("start_gpu")])
                say("  " + " | ".join(str(x) for x in rows[-1]) + f" | setup {r['setup_s']:.1f} s")
                if "start_gpu" in r and steps == steps_list[0]:
                    notes.append(f"K={K}, {name}: the folded start (previous block's commit + first round, "
                                 f"{2 * K} tokens) takes {r['start_gpu'] * 1e3:.3f} ms vs {per_round * 1e3:.3f} ms "
                                 f"for a round: the commit costs {(r['start_gpu'] - per_round) * 1e3:.3f} ms "
                                 "instead of a whole forward")
                if steps == steps_list[0] and mode == "while":  # the timed round graph, as it runs
                    try:
                        profs[f"K={K}: {name}"] = profile_round(r["rt"], P, K, round_s=per_round)
                    except Exception as exc:  # noqa: BLE001
                        say(f"  profile failed: {exc}")
                del r
                torch.cuda.empty_cache()
        if not skip_hf:
            try:
                t = hf_forward(cfg, K, P)
                if t is not None:
                    rows.append([K, "(c) transformers Qwen3ForCausalLM, eager, one forward", 1, f"{t * 1e3:.2f}",
                                 f"{t / floor:.2f}", f"{wbytes / t / 1e9:.0f}", "-", "-"])
                    say("  " + " | ".join(str(x) for x in rows[-1]))
            except Exception as exc:  # noqa: BLE001
                say(f"  transformers baseline failed: {type(exc).__name__}: {exc}")
        torch.cuda.empty_cache()
    say()
    for n in notes:
        say(f"- {n}")
    say("\nPer round: GPU time of one round graph (CUDA events, median of 30 replays) for the graph modes, "
        "block wall / rounds for the eager paths (reference: host time between two blocks' commits / "
        "(rounds + 1 commit)). Block: host wall time of one whole block incl. launch, sync and read-back. "
        "Host overhead: (block wall - block GPU time) / rounds for 'while'; block wall / rounds - round GPU "
        "time for 'graph' (includes the folded start's extra cost). Rounds are fixed by threshold 1.0 "
        "(never reached) and steps = K / quota.\n")
    table(["K", "variant", "rounds/block", "per round ms", "x floor", "weight GB/s", "block ms", "host overhead us/round"],
          rows)
    for name, prof_rows in profs.items():
        say(f"### One round, {name}: GPU time by kernel kind (profiler over replays of the round's graph)\n")
        table(["kind", "kernels", "ms"], prof_rows)


MODES: list[str] = []
QUICK: list[bool] = []   # --quick: best paths only (no reference decoder, no eager / uncompiled rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--no-hf", action="store_true", help="skip the transformers baseline")
    ap.add_argument("--no-correctness", action="store_true")
    ap.add_argument("--families", default="sdar",
                    help="comma-separated: sdar (Qwen3-4B shape, the default), llada (LLaDA-2.1-mini MoE shape), "
                         "dgemma (DiffusionGemma 26B-A4B shape, 256-token canvas)")
    ap.add_argument("--no-ref", action="store_true", help="skip the reference decoder in the llada section")
    ap.add_argument("--quick", action="store_true",
                    help="Qwen3 speed section: only the best paths (compiled / Triton WHILE loop), no reference")
    ap.add_argument("--kernels", choices=["torch", "triton", "both"], default="torch",
                    help="speed section: the PyTorch forward (default), the Triton kernels "
                         "(orl.kernels.layers) only, or both")
    args = ap.parse_args()
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    bad = sorted(set(families) - {"sdar", "llada", "dgemma"})
    if bad:
        ap.error(f"unknown families {bad}; choose from sdar, llada, dgemma")
    OUT_DIR[0] = args.out
    if args.quick:
        QUICK.append(True)
    os.makedirs(args.out, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    ok, why = conditional_nodes_available()
    MODES.extend(["while", "graph"] if ok else ["graph"])
    name = torch.cuda.get_device_name()
    say(f"# Engine benchmark\n\n{datetime.date.today().isoformat()} · {name} · torch {torch.__version__} · "
        f"CUDA {torch.version.cuda} · command: `python benchmarks/engine.py"
        + ("" if families == ["sdar"] else f" --families {args.families}") + "`"
        + ("" if ok else f" · device WHILE loop unavailable: {why}") + "\n")
    bw, tf = ceilings()
    LOG["copy_bw"], LOG["bf16_tflops"] = bw, tf
    say(f"Copy bandwidth (read + write): {bw / 1e12:.2f} TB/s · bf16 matmul 8192^3: {tf / 1e12:.0f} TFLOP/s\n")
    if "sdar" in families:
        if not args.no_correctness:
            correctness(MODES)
        speed(bw, args.no_hf, args.kernels)
    if "llada" in families:
        import engine_llada  # noqa: PLC0415 - benchmarks/ is on sys.path when run as a script
        if not args.no_correctness:
            engine_llada.correctness(sys.modules[__name__], MODES)
        engine_llada.speed(sys.modules[__name__], bw, MODES, args.no_ref)
    if "dgemma" in families:
        import engine_dgemma  # noqa: PLC0415 - benchmarks/ is on sys.path when run as a script
        engine_dgemma.run(sys.modules[__name__], bw, args.no_hf, MODES, correct=not args.no_correctness)
    with open(os.path.join(args.out, "engine_log.json"), "w") as f:
        json.dump(LOG, f, indent=1, default=str)


if __name__ == "__main__":
    with torch.no_grad():
        main()
