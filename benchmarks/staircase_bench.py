"""Staircase replay attention on one GPU: our Triton kernels (`orl.kernels.staircase`) against dense
SDPA with the (B, T, T) bool mask, FlexAttention (compiled, the BlockMask of
`orl.model.masks.staircase_block_mask`) and flash causal attention at an equal number of visible
pairs. One command: `python benchmarks/staircase_bench.py --out DIR` (`--dry-run`: CPU only, builds
the layouts and prints their pair counts and tile tables; `--sweep`: also times a few kernel tiles).

Layout: ORL's packed replay as `orl.train.pack.pack` lays it out, from synthetic rollouts (the
token ids do not matter to attention): per response a prompt of 192..320 tokens, 6..20 response
blocks of K = 32 tokens (the clean copy), and 1..3 noisy states per block; responses are packed
into rows of T tokens as segments (a last, smaller response fills the gap where it fits), the rest
is padding. B = --tokens / T rows, so every T moves the same number of tokens.
Target (the project's): ours forward + backward <= 1.2 x flash causal attention at an equal number
of visible pairs, i.e. causal length T' with T' (T' + 1) / 2 = the layout's visible pairs per row,
same B, heads and head dim.
Measures, per (T, H:Hkv), bf16, d = 128: the mask builds (ours: exact tile tables; Flex:
create_block_mask), then forward and forward + backward time (CUDA events, 3 warm-ups, median of
--iters) of the four, and the ratios. First, an equivalence check at one shape: ours, Flex and dense
SDPA in bf16 against a float32 reference (o, dq, dk, dv; max error / max |reference|).
Prints markdown and writes DIR/staircase_results.md (date, card, versions, the command).
Shapes: B rows, T tokens, H / Hkv query / KV heads, d head dim, K block length.
"""
from __future__ import annotations

import argparse
import datetime
import math
import os
import random
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from orl.kernels import staircase as S  # noqa: E402
from orl.model.masks import staircase_block_mask, visible  # noqa: E402
from orl.train.pack import Selection, pack  # noqa: E402
from orl.train.rollout import Rollout, State  # noqa: E402

K = 32
LINES: list[str] = []
OUT = ["."]


def say(line: str = "") -> None:
    """Print, and rewrite the results file, so a run stopped part-way keeps what it measured."""
    print(line, flush=True)
    LINES.append(line)
    if OUT[0]:
        with open(os.path.join(OUT[0], "staircase_results.md"), "w") as f:
            f.write("\n".join(LINES) + "\n")


# ---------------------------------------------------------------- layouts

def _selection(P: int, states_per_block: list[int]) -> Selection:
    """A synthetic verified rollout of one prompt with ``states_per_block[b]`` captured states of block b."""
    nb = len(states_per_block)
    z = torch.zeros(K, dtype=torch.long)
    states = [State(block=b, step=s, canvas=z, unresolved=torch.ones(K, dtype=torch.bool), residual=None,
                    residual_where=None, residual_weight=None, entropy=torch.zeros(K))
              for b, n in enumerate(states_per_block) for s in range(n)]
    r = Rollout("synthetic", [0] * P, [0] * (nb * K), nb * K, "", 1.0, list(states_per_block), states)
    return Selection(r, list(range(len(states))), [])


def _tokens(P: int, spb: list[int]) -> int:
    return P + K * len(spb) + K * sum(spb)


def replay_row(T: int, rng: random.Random):
    """(3, T) int64 block, state, segment of one packed replay row, and its visible pairs."""
    sels, used = [], 0
    while True:
        P, nb = rng.randint(192, 320), rng.randint(6, 20)
        spb = [rng.randint(1, 3) for _ in range(nb)]
        if used + _tokens(P, spb) > T:
            break
        sels.append(_selection(P, spb))
        used += _tokens(P, spb)
    P = 256
    spb = [2] * max(0, (T - used - P) // (3 * K))  # fill the gap with a smaller response where it fits
    if spb:
        sels.append(_selection(P, spb))
    b = pack(sels, K, "block", "packed", max_row_tokens=T)
    assert b.tokens.shape[0] == 1
    meta, n = b.meta[0], b.meta.shape[-1]
    pairs = int(b.mask.sum())
    if n < T:  # pad to T exactly as `pack` pads: block 0, clean, one segment per padding token
        pad = T - n
        meta = torch.cat([meta, torch.stack([torch.zeros(pad, dtype=torch.long), torch.full((pad,), -1),
                                             -1 - torch.arange(pad)])], 1)
        pairs += pad
    return meta, pairs, len(sels)


def replay_layout(T: int, B: int, seed: int = 0):
    """meta (B, 3, T) int64, visible pairs per row (list), segments per row (list)."""
    rng = random.Random(seed + T)
    rows = [replay_row(T, rng) for _ in range(B)]
    return torch.stack([r[0] for r in rows]), [r[1] for r in rows], [r[2] for r in rows]


def causal_len(pairs: float) -> int:
    """T' with T' (T' + 1) / 2 = pairs (rounded)."""
    return round((math.sqrt(8 * pairs + 1) - 1) / 2)


# ---------------------------------------------------------------- timing

def gpu_time(fn, iters: int, warmup: int = 3) -> float:
    """Median milliseconds of ``fn`` (CUDA events around each call: `benchmarks/engine.py`'s timer)."""
    import engine  # noqa: PLC0415 - benchmarks/ is on the path (this script's folder)
    return 1e3 * engine.gpu_time(fn, iters, warmup)


def fwd_bwd(f, inputs, do):
    """A callable running f(*inputs) and its backward with ``do`` (fresh grads each call)."""
    def run():
        for x in inputs:
            x.grad = None
        f(*inputs).backward(do)
    return run


def flash_causal(q, k, v, scale):
    from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: PLC0415
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale,
                                              enable_gqa=q.shape[1] != k.shape[1])


def rand_qkv(B, H, Hkv, T, d, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(B, h, T, d, device="cuda", dtype=dtype, generator=g).requires_grad_()
            for h in (H, Hkv, Hkv)]


# ---------------------------------------------------------------- sections

def equivalence(meta, H, Hkv, d, flex, scale) -> None:
    """ours / Flex / dense SDPA in bf16 against a float32 reference, on one shape."""
    B, _, T = meta.shape
    sm = S.StaircaseMask(meta[:, 0], meta[:, 1], meta[:, 2])
    dense = sm.dense()
    bm = staircase_block_mask(meta[:, 0], meta[:, 1], meta[:, 2], 128)
    q, k, v = rand_qkv(B, H, Hkv, T, d, torch.bfloat16, seed=1)
    do = torch.randn_like(q)
    g = H // Hkv
    ref_in = [x.detach().float().requires_grad_() for x in (q, k, v)]
    ref = F.scaled_dot_product_attention(ref_in[0], ref_in[1].repeat_interleave(g, 1),
                                         ref_in[2].repeat_interleave(g, 1), attn_mask=dense[:, None], scale=scale)
    ref.backward(do.float())
    want = [ref.detach()] + [x.grad for x in ref_in]
    impls = {
        "ours": lambda a, b, c: S.staircase_attention(a, b, c, sm, scale),
        "flex": lambda a, b, c: flex(a, b, c, block_mask=bm, scale=scale, enable_gqa=g > 1),
        "dense SDPA": lambda a, b, c: F.scaled_dot_product_attention(a, b, c, attn_mask=dense[:, None], scale=scale,
                                                                    enable_gqa=g > 1),
    }
    say(f"## Equivalence: bf16 vs a float32 reference (T = {T}, B = {B}, H:Hkv = {H}:{Hkv}, d = {d})")
    say()
    say("err = max |x - x_fp32| / max |x_fp32|")
    say()
    say("| impl | o | dq | dk | dv |")
    say("|---|---|---|---|---|")
    errs = {}
    for name, f in impls.items():
        ins = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        o = f(*ins)
        o.backward(do)
        got = [o.detach()] + [x.grad for x in ins]
        errs[name] = [float((a.float() - w).abs().max() / w.abs().max()) for a, w in zip(got, want)]
        say(f"| {name} | " + " | ".join(f"{e:.2e}" for e in errs[name]) + " |")
    ok = all(e <= max(2 * ed, 2e-2) for e, ed in zip(errs["ours"], errs["dense SDPA"]))
    say()
    say(f"equivalence: {'PASS' if ok else 'FAIL'} (ours within max(2 x dense SDPA's bf16 error, 2e-2) on each)")
    say()


def bench_shape(T, B, H, Hkv, d, flex, scale, iters, seed) -> list:
    torch._dynamo.reset()  # FlexAttention compiles afresh per shape (else dynamo's recompile limit: eager flex)
    meta, pairs, segs = replay_layout(T, B, seed)
    meta = meta.cuda()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    sm = S.StaircaseMask(meta[:, 0], meta[:, 1], meta[:, 2])
    torch.cuda.synchronize()
    t_ours_mask = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    bm = staircase_block_mask(meta[:, 0], meta[:, 1], meta[:, 2], 128)
    torch.cuda.synchronize()
    t_flex_mask = (time.perf_counter() - t0) * 1e3
    dense = visible(*meta.unbind(1), *meta.unbind(1))
    per_row = sum(pairs) / B
    Tc = causal_len(per_row)
    g = H // Hkv
    q, k, v = rand_qkv(B, H, Hkv, T, d, torch.bfloat16)
    qc, kc, vc = rand_qkv(B, H, Hkv, Tc, d, torch.bfloat16, seed=2)
    do, doc = torch.randn_like(q), torch.randn_like(qc)
    fns = {
        "dense": lambda a, b, c: F.scaled_dot_product_attention(a, b, c, attn_mask=dense[:, None], scale=scale,
                                                               enable_gqa=g > 1),
        "flex": lambda a, b, c: flex(a, b, c, block_mask=bm, scale=scale, enable_gqa=g > 1),
        "ours": lambda a, b, c: S.staircase_attention(a, b, c, sm, scale),
    }
    times = {}
    for name, f in fns.items():
        with torch.no_grad():
            tf = gpu_time(lambda f=f: f(q, k, v), iters)
        times[name] = (tf, gpu_time(fwd_bwd(f, (q, k, v), do), iters))
    with torch.no_grad():
        tf = gpu_time(lambda: flash_causal(qc, kc, vc, scale), iters)
    times["causal"] = (tf, gpu_time(fwd_bwd(lambda a, b, c: flash_causal(a, b, c, scale), (qc, kc, vc), doc), iters))
    tb = sm.tables(sm.config.fwd.m, sm.config.fwd.n)
    return {"T": T, "B": B, "heads": f"{H}:{Hkv}", "segs": sum(segs) / B, "pairs": per_row,
            "density": per_row / T ** 2, "Tc": Tc, "visited": tb.visited() / tb.total(),
            "work": tb.visited() * tb.tile_m * tb.tile_n / sum(pairs), "mask_ours": t_ours_mask,
            "mask_flex": t_flex_mask, "times": times,
            "tflops": [4 * per_row * B * H * d * m / (times["ours"][i] * 1e-3) / 1e12 for i, m in ((0, 1.0), (1, 3.5))]}


def sweep(T, B, H, Hkv, d, scale, iters, seed) -> S.StaircaseConfig:
    """Forward, dQ and dK/dV tiles timed one kernel at a time (the others at their default); prints the best."""
    meta, _, _ = replay_layout(T, B, seed)
    meta = meta.cuda()
    sm = S.StaircaseMask(meta[:, 0], meta[:, 1], meta[:, 2], tile=32)
    q, k, v = rand_qkv(B, H, Hkv, T, d, torch.bfloat16)
    do = torch.randn_like(q)
    base = S.StaircaseConfig()
    cands = {
        "fwd": [S.Tiles(128, 64, 8, 3), S.Tiles(128, 64, 4, 3), S.Tiles(128, 64, 8, 2), S.Tiles(128, 128, 8, 3),
                S.Tiles(64, 64, 4, 3), S.Tiles(128, 32, 4, 3), S.Tiles(64, 32, 4, 3)],
        "dq": [S.Tiles(128, 64, 8, 2), S.Tiles(128, 64, 4, 2), S.Tiles(64, 64, 4, 2), S.Tiles(128, 32, 4, 2),
               S.Tiles(64, 32, 4, 3), S.Tiles(128, 64, 8, 3)],
        "dkdv": [S.Tiles(64, 128, 8, 2), S.Tiles(64, 128, 4, 2), S.Tiles(32, 128, 4, 2), S.Tiles(64, 64, 4, 2),
                 S.Tiles(32, 64, 4, 3), S.Tiles(32, 128, 8, 3), S.Tiles(64, 128, 8, 3)],
    }
    best = {}
    say(f"## Tile sweep (T = {T}, B = {B}, H:Hkv = {H}:{Hkv}, d = {d}; one kernel varied, the others default)")
    say()
    say("| kernel | m | n | warps | stages | ms (fwd; or fwd + bwd) |")
    say("|---|---|---|---|---|---|")
    for which, tiles in cands.items():
        res = []
        for t in tiles:
            cfg = S.StaircaseConfig(**{**{f: getattr(base, f) for f in ("fwd", "dq", "dkdv")}, which: t})
            def f(a, b, c, cfg=cfg):
                return S.staircase_attention(a, b, c, sm, scale, config=cfg)
            try:
                if which == "fwd":
                    with torch.no_grad():
                        ms = gpu_time(lambda: f(q, k, v), iters)  # noqa: B023 (called here)
                else:
                    ms = gpu_time(fwd_bwd(f, (q, k, v), do), iters)
            except Exception as e:  # noqa: BLE001 (a tile that does not fit, e.g. shared memory: reported, not fatal)
                say(f"| {which} | {t.m} | {t.n} | {t.warps} | {t.stages} | failed: {type(e).__name__} |")
                continue
            res.append((ms, t))
            say(f"| {which} | {t.m} | {t.n} | {t.warps} | {t.stages} | {ms:.3f} |")
        best[which] = min(res, key=lambda r: r[0])[1]
    cfg = S.StaircaseConfig(**best)
    say()
    say(f"best: `{cfg}`")
    say()
    return cfg


def dry_run(Ts, tokens, seed) -> None:
    for T in Ts:
        B = max(1, tokens // T)
        meta, pairs, segs = replay_layout(T, B, seed)
        sm = S.StaircaseMask(meta[:, 0], meta[:, 1], meta[:, 2])
        per_row = sum(pairs) / B
        print(f"T {T}  B {B}  segments/row {segs}  visible pairs/row {per_row:.0f}  density {per_row / T ** 2:.3f}  "
              f"T' (causal, equal pairs) {causal_len(per_row)}  padding/row "
              f"{[int((m[2] < 0).sum()) for m in meta]}")
        for tm, tn in sm.config.shapes():
            tb = sm.tables(tm, tn)
            c = tb.classes
            print(f"  tiles {tm}x{tn}: visited {tb.visited()} / {tb.total()} ({tb.visited() / tb.total():.3f}), "
                  f"full {int((c == S.FULL).sum())}, partial {int((c == S.PARTIAL).sum())}; "
                  f"pairs in visited tiles / visible pairs {tb.visited() * tm * tn / sum(pairs):.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=".", help="folder for staircase_results.md")
    ap.add_argument("--T", default="4096,8192")
    ap.add_argument("--heads", default="16:16,32:32,32:8", help="H:Hkv pairs")
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=16384, help="tokens per batch: B = tokens / T rows")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sweep", action="store_true", help="also time a few kernel tiles (at the largest shape)")
    ap.add_argument("--dry-run", action="store_true", help="CPU only: build the layouts, print pairs and tiles")
    a = ap.parse_args()
    Ts = [int(t) for t in a.T.split(",")]
    heads = [tuple(int(x) for x in h.split(":")) for h in a.heads.split(",")]
    if a.dry_run:
        dry_run(Ts, a.tokens, a.seed)
        return
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU (or --dry-run)")
    os.makedirs(a.out, exist_ok=True)
    OUT[0] = a.out
    import triton  # noqa: PLC0415
    from torch.nn.attention.flex_attention import flex_attention  # noqa: PLC0415
    flex = torch.compile(flex_attention, dynamic=False)
    d, scale = a.d, a.d ** -0.5
    say("# Staircase replay attention: Triton kernels vs dense SDPA, FlexAttention, flash causal")
    say()
    say(f"{datetime.date.today()} · {torch.cuda.get_device_name()} · torch {torch.__version__} · triton "
        f"{triton.__version__} · CUDA {torch.version.cuda} · command: `python benchmarks/staircase_bench.py "
        f"{' '.join(sys.argv[1:])}`")
    say()
    say(f"Layout: packed ORL replay rows (`orl.train.pack`), prompts 192..320, 6..20 blocks of K = {K}, 1..3 "
        f"noisy states per block, several segments per row, padding; bf16, d = {d}, scale d^-1/2; "
        f"ours: `{S.StaircaseConfig()}` over 32-token tables; Flex: BlockMask of 128.")
    say()
    meta, _, _ = replay_layout(Ts[0], 1, a.seed)
    H, Hkv = max(heads, key=lambda h: h[0] // h[1])
    equivalence(meta.cuda(), H, Hkv, d, flex, scale)
    if a.sweep:
        sweep(max(Ts), max(1, a.tokens // max(Ts)), 32, 8, d, scale, a.iters, a.seed)
    rows = []
    for T in Ts:
        for H, Hkv in heads:
            rows.append(bench_shape(T, max(1, a.tokens // T), H, Hkv, d, flex, scale, a.iters, a.seed))
            torch.cuda.empty_cache()
            r = rows[-1]
            t = r["times"]
            print(f"T {T} H:Hkv {H}:{Hkv}: fwd+bwd ours {t['ours'][1]:.2f} ms, causal(T'={r['Tc']}) "
                  f"{t['causal'][1]:.2f}, flex {t['flex'][1]:.2f}, dense {t['dense'][1]:.2f}; "
                  f"ours/causal {t['ours'][1] / t['causal'][1]:.2f}", flush=True)
    say("## Times (ms, median) and ratios")
    say()
    say("pairs = visible pairs per row; T' = causal length with as many pairs; visited = share of the forward "
        "kernel's tiles it visits; work = pairs in those tiles / visible pairs; TF/s = 4 pairs B H d (x3.5 with "
        "the backward) / our time.")
    say()
    say("| T | B | H:Hkv | segs/row | pairs/row | density | T' | visited | work | pass | dense | flex | ours "
        "| causal T' | ours/causal | ours/flex | ours/dense | ours TF/s |")
    say("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        for i, name in ((0, "fwd"), (1, "fwd+bwd")):
            t = {k: v[i] for k, v in r["times"].items()}
            say(f"| {r['T']} | {r['B']} | {r['heads']} | {r['segs']:.1f} | {r['pairs']:.3g} | {r['density']:.3f} | "
                f"{r['Tc']} | {r['visited']:.3f} | {r['work']:.2f} | {name} | {t['dense']:.3f} | {t['flex']:.3f} | {t['ours']:.3f} | "
                f"{t['causal']:.3f} | {t['ours'] / t['causal']:.2f} | {t['ours'] / t['flex']:.2f} | "
                f"{t['ours'] / t['dense']:.2f} | {r['tflops'][i]:.0f} |")
    say()
    say("Mask builds (ms, once per batch, shared by all layers): " + ", ".join(
        f"T {r['T']} {r['heads']}: ours {r['mask_ours']:.1f}, flex {r['mask_flex']:.1f}" for r in rows))
    worst = max(r["times"]["ours"][1] / r["times"]["causal"][1] for r in rows)
    say()
    say(f"Target ours fwd+bwd <= 1.2 x flash causal at equal pairs: worst {worst:.2f} -> "
        f"{'met' if worst <= 1.2 else 'NOT met'}")


if __name__ == "__main__":
    main()
