"""Triton kernels vs PyTorch on the Qwen3-4B shape: one command on a GPU,
`python benchmarks/kernels_bench.py [--out DIR] [--no-sweep] [--no-round]`.

Measures, in order (each section reports and goes on if it fails):
  1. copy bandwidth (the floor's denominator, as `benchmarks/engine.py`);
  2. per GEMM of the round (qkv, o, gate_up with the SiLU * up epilogue, down, LM head) at M = 32
     and 256: max error of ours and of cuBLAS against a float32 reference, GPU time per call
     (CUDA graph of calls cycling weight copies past the L2, CUDA events), achieved weight GB/s
     and x floor (weight bytes / copy bandwidth); with the sweep, a few tile configs each and the
     best as a `TABLE` line for `orl/engine/kernels.py`;
  3. attention over the static cache (K = 32: 640 slots; K = 256: 1024) vs PyTorch SDPA with the
     runtime's mask, per layer (36 caches cycled), for a few split counts;
  4. whole passes on a 2-layer Qwen3-4B shape in bf16: logits error vs the PyTorch forward,
     round-by-round parity with the reference decoder, and graph / WHILE replay == eager, bitwise;
  5. a whole round through the runtime (36 layers, 512-token context): kernels "triton" vs
     "torch" (+ torch.compile), K = 32 and 256, plus where the Triton round's GPU time goes.
Prints markdown and writes DIR/kernels_results.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import sys
import traceback

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import engine as E  # noqa: E402  (benchmarks/engine.py: ceilings, gpu_time, ours)

from orl.decode import DecodeConfig  # noqa: E402
from orl.kernels import layers as Kn  # noqa: E402
from orl.engine.forward import StaticKV, attention_bias, bake, embed, forward  # noqa: E402
from orl.engine.graphs import conditional_nodes_available  # noqa: E402
from orl.engine.parity import compare_decode, teacher_forced  # noqa: E402
from orl.engine.runtime import Runtime  # noqa: E402
from orl.model import build_model, get_config  # noqa: E402

say = E.say


graph_time = E.graph_time


SHAPES = [("qkv", 6144, 2560, False), ("o", 2560, 4096, False), ("gate_up", 9728, 2560, True),
          ("down", 2560, 9728, False), ("lm_head", 151936, 2560, False)]


def sweep_configs(M: int, N: int, K: int, gated: bool) -> list:
    """Tiles around the current choice (TABLE entry or heuristic), each a Triton compile. Only
    M <= 64 is swept: from ``TritonKernels.cublas_min_m`` rows on, plain GEMMs go to cuBLAS."""
    base = Kn.gemm_config(M, N, K, gated)
    out = [base]
    if M <= 64:
        def cfg(**kw):
            return Kn.GemmConfig(**{**dataclasses.asdict(base), **kw})
        for w in (4, 8):
            out.append(cfg(warps=w))
            for st in (base.stages - 1, base.stages + 1):
                out.append(cfg(warps=w, stages=max(2, st)))
            if gated:  # split 1: SiLU(gate) * up fused in the GEMM; split > 1: partials + one epilogue kernel
                for bn in (16, 32, 64):
                    for bk, st in ((64, 4), (64, 6), (128, 3), (256, 2)):
                        out.append(cfg(BN=bn, BK=bk, stages=st, warps=w))
                for bn in (64, 128):
                    for split in (2, 4):
                        out.append(cfg(BN=bn, BK=128, stages=4, SPLIT=split, warps=w))
            else:
                for bn in (base.BN // 2, base.BN, base.BN * 2):
                    for split in (max(1, base.SPLIT // 2), base.SPLIT, base.SPLIT * 2):
                        if 32 <= bn <= 256:
                            out.append(cfg(BN=bn, SPLIT=split, warps=w))
    seen, uniq = set(), []
    for c in out:
        if c not in seen and (c.SPLIT == 1 or (-(-K // c.BK)) % c.SPLIT == 0):
            seen.add(c)
            uniq.append(c)
    return uniq


def gemms(ops, bw: float, do_sweep: bool) -> None:
    say("## GEMMs: ours (Triton) vs cuBLAS, bf16, one call per weight copy in a CUDA graph\n")
    say("err = max |y - y_fp32| / max |y_fp32|. Plain GEMMs: ours returns split-K partials (their sum is "
        "done by the next kernel in the round); gate_up: ours is the fused SiLU(gate) * up, torch is "
        "F.linear + chunk + silu * mul.\n")
    say("| GEMM | M | config | ours us | ours GB/s | ours x floor | torch us | torch GB/s | torch x floor | "
        "err ours | err torch |")
    say("|---|---|---|---|---|---|---|---|---|---|---|")
    suggestions, table_rows = [], []
    for name, N, K, gated in SHAPES:
        Nw = 2 * N if gated else N
        wbytes = Nw * K * 2
        n_copies = max(1, min(8, -(-300_000_000 // wbytes)))
        Ws = [torch.randn(Nw, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5 for _ in range(n_copies)]
        for M in (32, 256):
            try:
                x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
                W = Ws[0]
                ref = F.linear(x.float(), W.float())
                if gated:
                    g, u = ref.chunk(2, -1)
                    ref = F.silu(g) * u

                def torch_call(W):
                    y = F.linear(x, W)
                    if gated:
                        g, u = y.chunk(2, -1)
                        y = F.silu(g) * u
                    return y

                def ours_call(W, cfg=None):
                    return ops.linear(x, W, gated=gated, cfg=cfg)

                def ours_val(cfg=None):
                    y = ops.linear(x, W, gated=gated, cfg=cfg)
                    return (y if gated else y.float().sum(0)).float()
                scale = ref.abs().max().item()
                err_t = (torch_call(W).float() - ref).abs().max().item() / scale
                t_torch = graph_time(lambda: [torch_call(w) for w in Ws], n_copies)
                cfgs = sweep_configs(M, N, K, gated) if do_sweep and name != "lm_head" else \
                    [Kn.gemm_config(M, N, K, gated, ops.n_sm)]
                best = None
                for cfg in cfgs:
                    try:
                        err_o = (ours_val(cfg) - ref).abs().max().item() / scale
                        t = graph_time(lambda: [ours_call(w, cfg) for w in Ws], n_copies)
                    except Exception as exc:  # noqa: BLE001 - a config that does not compile: next
                        say(f"| {name} | {M} | {cfg} failed: {type(exc).__name__}: {str(exc)[:120]} |")
                        continue
                    tag = "heuristic" if cfg == cfgs[0] else "sweep"
                    floor = wbytes / bw
                    say(f"| {name} | {M} | {tag} BM{cfg.BM} BN{cfg.BN} BK{cfg.BK} split{cfg.SPLIT} w{cfg.warps} "
                        f"s{cfg.stages} | {t * 1e6:.1f} | {wbytes / t / 1e9:.0f} | {t / floor:.2f} | "
                        f"{t_torch * 1e6:.1f} | {wbytes / t_torch / 1e9:.0f} | {t_torch / floor:.2f} | "
                        f"{err_o:.1e} | {err_t:.1e} |")
                    if err_o < 2e-2 and (best is None or t < best[0]):
                        best = (t, cfg)
                if best is not None and M <= 64:
                    table_rows.append(dict(N=N, K=K, gated=gated, m_max=M, cfg=dataclasses.asdict(best[1])))
                if best is not None:
                    suggestions.append(f"    ({N}, {K}, {gated}): [({M if M <= 64 else 512}, Kn.{best[1]})],  "
                                       f"# {name} M={M}: {best[0] * 1e6:.1f} us")
            except Exception as exc:  # noqa: BLE001
                say(f"| {name} | {M} | failed: {type(exc).__name__}: {exc} |")
        Ws = None  # free the copies before the next shape
        torch.cuda.empty_cache()
    if table_rows:  # the rest of this run (and later runs: ORL_GEMM_TABLE=path) use the measured tiles
        path = os.path.join(E.OUT_DIR[0], "gemm_table.json")
        with open(path, "w") as f:
            json.dump(table_rows, f, indent=1)
        Kn.load_table(path)
        say(f"\nMeasured tiles for M = 32 written to {path} and used by the rest of this run.\n")
    say("\nBest config per shape and M (paste into `TABLE` in orl/engine/kernels.py, merging the M entries of "
        "a shape into one increasing list):\n")
    say("```")
    for s in suggestions:
        say(s)
    say("```\n")


def attention(ops) -> None:
    say("## Attention over the static cache (32 q heads, 8 KV heads, hd 128, bf16), per layer\n")
    say("| K | S | ours BR / BS / warps | ours split | ours us | torch SDPA us | max abs err vs fp32 (ours / torch) |")
    say("|---|---|---|---|---|---|---|")
    c = ops.cfg
    H, Hkv, hd, P = c.num_heads, c.num_kv_heads, c.head_dim, 512
    for K, S in ((32, 640), (256, 1024)):
        L = S + 128
        caches = [(torch.randn(1, Hkv, L, hd, device="cuda", dtype=torch.bfloat16),
                   torch.randn(1, Hkv, L, hd, device="cuda", dtype=torch.bfloat16)) for _ in range(36)]
        q = torch.randn(H, K, hd, device="cuda", dtype=torch.bfloat16)
        start = torch.tensor([P + K], device="cuda") if K == 32 else torch.tensor([P], device="cuda")
        lim = torch.full((K,), K, device="cuda")
        bias = attention_bias(start, lim, S, H // Hkv, torch.bfloat16)
        kc, vc = caches[0]
        ref = F.scaled_dot_product_attention(q.float().reshape(1, Hkv, -1, hd), kc[:, :, :S].float(),
                                             vc[:, :, :S].float(), attn_mask=bias.float(), scale=hd ** -0.5)
        ref = ref.reshape(H, K, hd).transpose(0, 1).reshape(K, H * hd)

        def torch_att(kc, vc):
            o = F.scaled_dot_product_attention(q.reshape(1, Hkv, -1, hd), kc[:, :, :S], vc[:, :, :S],
                                               attn_mask=bias, scale=hd ** -0.5)
            return o.reshape(1, H, K, hd).transpose(1, 2).reshape(K, H * hd)
        err_t = (torch_att(kc, vc).float() - ref).abs().max().item()
        t_torch = graph_time(lambda: [torch_att(k, v) for k, v in caches], 36)
        tiles = [dict()] + [dict(BR=br, BS=bs, warps=w) for br, bs, w in
                            ((128, 64, 8), (128, 32, 4), (64, 128, 4), (64, 64, 8), (32, 64, 4))]
        for tile in tiles:
            for split in (None, 1, 2, 4, 8):
                name = "default" if not tile else f"{tile['BR']} / {tile['BS']} / {tile['warps']}"
                try:
                    err = (ops.attention(q, kc, vc, start, lim, S, split=split, **tile).float() - ref).abs().max().item()
                    t = graph_time(lambda: [ops.attention(q, k, v, start, lim, S, split=split, **tile)
                                            for k, v in caches], 36)
                    say(f"| {K} | {S} | {name} | {split or 'auto'} | {t * 1e6:.1f} | {t_torch * 1e6:.1f} | "
                        f"{err:.1e} / {err_t:.1e} |")
                except Exception as exc:  # noqa: BLE001
                    say(f"| {K} | {S} | {name} | {split} | failed: {type(exc).__name__}: {str(exc)[:100]} |")
        assert not ops.counters.any(), "attention split counters were not reset"
        caches = None
    say()


def correctness() -> None:
    say("## Correctness on a 2-layer Qwen3-4B shape (bf16)\n")
    model = build_model(get_config("sdar", "qwen3-4b", num_layers=2, layer_types=None, tie_embeddings=False),
                        seed=1, device="cuda").eval().to(torch.bfloat16)
    cfg, K, P = model.config, 32, 40
    w = bake(model, max_len=512)
    ops = Kn.TritonKernels(w)
    prompt = torch.randint(5, 60, (1, P), generator=torch.Generator().manual_seed(3)).cuda()
    canvas = torch.full((1, 2 * K), cfg.mask_token_id, device="cuda")
    canvas[:, :K] = prompt[:, :K]
    lim = torch.cat([torch.full((K,), K), torch.full((K,), 2 * K)]).cuda()
    outs = []
    for kern in (None, ops):
        kv = StaticKV(cfg, 512, torch.bfloat16, "cuda")
        start = torch.zeros(1, dtype=torch.long, device="cuda")
        forward(w, embed(w, prompt), start, torch.arange(1, P + 1, device="cuda"), kv, P, None, kernels=kern)
        start += P
        outs.append(forward(w, embed(w, canvas), start, lim, kv, 128, logits_from=K, kernels=kern).float())
    rel = ((outs[1] - outs[0]).abs().max() / outs[0].abs().max()).item()
    say(f"- forward (prefill {P} + folded commit + canvas): max |logits triton - torch| / max |logits| = {rel:.1e} "
        f"(bf16 rounding: expect < 3e-2)")
    dcfg = DecodeConfig(block_size=K, max_new_tokens=3 * K, threshold=0.9)
    rt = Runtime(model, K, mode="eager", max_len=512, bucket=64, kernels="triton")
    p = teacher_forced(rt, model, prompt[:, :11], dcfg)
    say(f"- teacher-forced vs reference decoder: same decision {p.same_decision}/{p.rounds}, tie-explained "
        f"{p.tie_explained}, unexplained {len(p.unexplained)} (expect 0), max rel logit err {p.max_rel_logit_err:.1e}")
    modes = ["graph"] + (["while"] if conditional_nodes_available()[0] else [])
    base = None
    for mode in ["eager"] + modes:
        rt = Runtime(model, K, mode=mode, max_len=512, bucket=64, kernels="triton")
        out = rt.decode(prompt[:, :11], dcfg)
        out2 = rt.decode(prompt[:, :11], dcfg)
        if base is None:
            base = out
        same = out.tokens == out2.tokens == base.tokens and out.steps_per_block == base.steps_per_block
        say(f"- kernels='triton', mode {mode}: tokens equal eager (twice, graphs replayed): {same} (expect True)")
    fcfg = DecodeConfig(block_size=K, max_new_tokens=3 * K - 3, threshold=0.9)
    m32 = model.float()
    for mode in modes:
        c = compare_decode(Runtime(m32, K, mode=mode, max_len=512, bucket=64, kernels="triton"), m32,
                           prompt[:, :11], fcfg)
        say(f"- float32, mode {mode}: tokens equal the reference decoder: {c['equal']} (first diff {c['first_diff']})")
    say()


def rounds(bw: float) -> None:
    say("## A whole round through the runtime: Qwen3-4B shape, random weights, bf16, 512-token context\n")
    cfg = get_config("sdar", "qwen3-4b")
    P = 512
    model = build_model(cfg, seed=0, dtype=torch.bfloat16, device="cuda").eval()
    prompt = torch.randint(0, cfg.vocab_size, (1, P), generator=torch.Generator().manual_seed(0)).cuda()
    mode = "while" if conditional_nodes_available()[0] else "graph"
    say("| K | kernels | per round ms | x floor | weight GB/s | folded start ms | block ms (wall) |")
    say("|---|---|---|---|---|---|---|")
    for K, steps in ((32, 32), (256, 16)):
        probe = Runtime(model, K, mode="eager", max_len=P + 4 * K)
        wbytes = probe.w.weight_bytes()
        del probe
        floor = wbytes / bw
        for kern, comp in (("torch", True), ("triton", False)):
            try:
                torch._dynamo.reset()
                r = E.ours(model, prompt, K, steps, mode, comp, kernels=kern)
                t = r["round_gpu"]
                say(f"| {K} | {kern}{' + compile' if comp else ''} | {t * 1e3:.3f} | {t / floor:.2f} | "
                    f"{wbytes / t / 1e9:.0f} | {r['start_gpu'] * 1e3:.3f} | {r['block_wall'] * 1e3:.2f} |")
                if kern == "triton" and K == 32:
                    prof = profile(r["rt"], P, K)
                del r
            except Exception as exc:  # noqa: BLE001
                say(f"| {K} | {kern} | failed: {type(exc).__name__}: {exc} |")
                traceback.print_exc()
            torch.cuda.empty_cache()
    say(f"\nfloor = {wbytes / 1e9:.3f} GB of weights / {bw / 1e12:.2f} TB/s = {floor * 1e3:.3f} ms\n")
    if "prof" in locals():
        say("### One K=32 Triton round, run eagerly: GPU time by kernel\n")
        say("| kernel | count | ms |")
        say("|---|---|---|")
        for name, n, ms in prof:
            say(f"| {name} | {n} | {ms:.3f} |")


def profile(rt, P, K) -> list:
    from torch.profiler import ProfilerActivity, profile as prof_  # noqa: PLC0415
    S = rt._slots(P + 2 * K)
    rt.truncate(P)
    rt._round(S)
    torch.cuda.synchronize()
    with prof_(activities=[ProfilerActivity.CUDA]) as prof:
        rt._round(S)
        torch.cuda.synchronize()
    agg: dict = {}
    for e in prof.events():
        if e.device_type.name != "CUDA":
            continue
        a = agg.setdefault(e.name[:60], [0, 0.0])
        a[0] += 1
        a[1] += (e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total) / 1e3
    return sorted(((k, v[0], v[1]) for k, v in agg.items()), key=lambda r: -r[2])[:15]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--no-sweep", action="store_true", help="time only the heuristic GEMM tiles")
    ap.add_argument("--no-round", action="store_true", help="skip the whole-round section")
    ap.add_argument("--sections", default="gemm,attention,correctness,round",
                    help="comma-separated subset of: gemm, attention, correctness, round")
    args = ap.parse_args()
    E.OUT_DIR[0], E.RESULTS_FILE[0] = args.out, "kernels_results.md"
    os.makedirs(args.out, exist_ok=True)
    if not torch.cuda.is_available():
        sys.exit("kernels_bench.py needs a CUDA GPU")
    ok, why = Kn.available()
    if not ok:
        sys.exit(f"kernels_bench.py needs Triton: {why}")
    import triton  # noqa: PLC0415
    torch.backends.cuda.matmul.allow_tf32 = False
    say(f"# Triton kernels benchmark\n\n{datetime.date.today().isoformat()} · {torch.cuda.get_device_name()} · "
        f"torch {torch.__version__} · triton {triton.__version__} · CUDA {torch.version.cuda} · command: "
        "`python benchmarks/kernels_bench.py`\n")
    bw, _ = E.ceilings()
    say(f"Copy bandwidth (read + write): {bw / 1e12:.2f} TB/s\n")
    cfg = get_config("sdar", "qwen3-4b", num_layers=1, layer_types=None)
    ops = Kn.TritonKernels(bake(build_model(cfg, seed=0, dtype=torch.bfloat16, device="cuda").eval(), max_len=1280))
    wanted = set(args.sections.split(",")) - ({"round"} if args.no_round else set())
    sections = {"gemm": lambda: gemms(ops, bw, not args.no_sweep), "attention": lambda: attention(ops),
                "correctness": correctness, "round": lambda: rounds(bw)}
    for name, section in sections.items():
        if name not in wanted:
            continue
        try:
            section()
        except Exception as exc:  # noqa: BLE001 - report and go on
            say(f"\nsection failed: {type(exc).__name__}: {exc}\n")
            traceback.print_exc()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    with torch.no_grad():
        main()
