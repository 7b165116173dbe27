"""DiffusionGemma section of the engine benchmark (`python benchmarks/engine.py --families dgemma`).

Measures, on the DiffusionGemma 26B-A4B shape (random bf16 weights, ~50 GB, built on the GPU
without a float32 copy), a 512-token context and a 256-token canvas:
  1. correctness on dgemma/tiny (float32): each runtime mode decodes the reference decoder's
     canvases in its rounds when both draw from the runtime's counter RNG;
  2. our runtime: per-round latency (one round graph, CUDA events), the folded start, whole-canvas
     latency for a fixed number of rounds (the stop test disabled), host overhead per round, in
     modes "while" / "graph" / "eager";
  3. the floor: weight bytes a round reads, counting only the experts the round's router picks
     (one eager round's router ids; reported per layer), over the measured copy bandwidth;
  4. transformers' own DiffusionGemma ``generate`` on the SAME weights (the HF model is built with
     random weights and ours aliases its tensors through `orl.model.checkpoint.dgemma`, so one copy is on
     the GPU): its decoder forward and its whole denoising step inside its generation loop, and
     our speed-up over both.
If transformers is missing or its model cannot be built, ours is built alone (2-4 without the
transformers rows). Runs on CPU with ``size="tiny"`` (eager only) as a smoke test of this script.
"""
from __future__ import annotations

import os
import statistics
import time

import torch

from orl.decode import DecodeConfig
from orl.engine import forward as F_
from orl.engine.runtime import Runtime
from orl.model import get_config
from orl.model.transformer import Transformer

TINY_VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                   num_key_value_heads=2, head_dim=16, position_embedding_size=64)


# ------------------------------------------------------------------------------- weights
def build_hf(cfg, device):
    """transformers' DiffusionGemmaForBlockDiffusion of our config's shape, random bf16 weights
    created on ``device`` (tiny vision tower)."""
    from transformers import (DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion,  # noqa: PLC0415
                              DiffusionGemmaTextConfig)
    from transformers.models.gemma4 import Gemma4VisionConfig  # noqa: PLC0415
    tc = DiffusionGemmaTextConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, layer_types=[t + "_attention" for t in cfg.layer_types],
        num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
        global_head_dim=cfg.full_head_dim, num_global_key_value_heads=cfg.full_num_kv_heads,
        sliding_window=cfg.sliding_window, num_experts=cfg.num_experts, top_k_experts=cfg.num_experts_per_tok,
        moe_intermediate_size=cfg.moe_intermediate_size, max_position_embeddings=cfg.max_position,
        rms_norm_eps=cfg.rms_eps)
    hc = DiffusionGemmaConfig(text_config=tc, vision_config=Gemma4VisionConfig(**TINY_VISION),
                              canvas_length=cfg.block_size)
    torch.manual_seed(0)
    with torch.device(device):
        hf = DiffusionGemmaForBlockDiffusion._from_config(hc, dtype=torch.bfloat16)
    if next(hf.parameters()).device.type != torch.device(device).type:
        hf = hf.to(device)
    return hf.eval()


def ours_from_hf(hf):
    """Our `Transformer` whose weights ARE the HF model's tensors (no copy)."""
    from orl.model.checkpoint.dgemma import config_from_dgemma, dgemma_to_ours  # noqa: PLC0415
    cfg = config_from_dgemma(hf.config.to_dict())
    state = {k: v for k, v in hf.state_dict().items() if k.startswith("model.decoder.")
             or (k.startswith("model.encoder.language_model.") and k.endswith("layer_scalar"))}
    with torch.device("meta"):
        model = Transformer(cfg).to(torch.bfloat16)
    res = model.load_state_dict(dgemma_to_ours(cfg, state), strict=False, assign=True)
    if set(res.missing_keys) - {"lm_head.weight"} or res.unexpected_keys:
        raise RuntimeError(f"weight mapping incomplete: missing {res.missing_keys[:5]}, "
                           f"unexpected {res.unexpected_keys[:5]}")
    model.lm_head.weight = model.model.embed_tokens.weight
    e = model.model.embed_tokens.weight
    if model.residual_pathway is not None:  # the non-persistent gamma buffer stayed on meta
        model.residual_pathway.gamma = torch.tensor(float(cfg.pathway_gamma), dtype=e.dtype, device=e.device)
    return model.eval()


def build_ours(cfg, device):
    """Our model alone, random weights initialised directly in bf16 on ``device``."""
    old = torch.get_default_dtype()
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = Transformer(cfg)
    finally:
        torch.set_default_dtype(old)
    return model.eval()


# ------------------------------------------------------------------------------- timing
def _timer(h, device):
    if device.type == "cuda":
        return h.gpu_time
    def cpu_time(fn, iters=3, warmup=1):
        for _ in range(warmup):
            fn()
        ts = []
        for _ in range(iters):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        return statistics.median(ts)
    return cpu_time


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def request(K, steps) -> DecodeConfig:
    """Fixed rounds: the stop test never passes (stability window longer than the canvas's rounds,
    confidence bound ~0), so every canvas takes ``steps`` rounds."""
    return DecodeConfig(rule="dgemma", block_size=K, max_new_tokens=K, steps=steps, temperature=0.8,
                        t_min=0.4, t_max=0.8, entropy_bound=0.1, stability_threshold=steps + 1,
                        confidence_threshold=1e-30)


def ours(h, model, prompt, K, steps, mode, device) -> dict:
    """Our runtime at a fixed context, steady state of fold_commit (as `engine.ours`); mode
    "while+compile" is mode "while" with torch.compile'd layers."""
    P = prompt.shape[1]
    timer = _timer(h, device)
    t0 = time.perf_counter()
    compiled = mode.endswith("+compile")
    mode = mode.removesuffix("+compile")
    rt = Runtime(model, K, mode=mode, max_len=P + 3 * K, compile=compiled)
    rt.set_request(request(K, steps), seed=0)
    rt.prefill(prompt)
    rt.generate_block()

    def block():
        rt.truncate(P)
        rt.pending = True
        return rt.generate_block()

    _, rounds = block()
    res = {"rounds": rounds, "setup_s": time.perf_counter() - t0, "rt": rt}
    iters = 5 if mode != "eager" else 2
    wall = []
    for _ in range(iters):
        _sync(device)
        t = time.perf_counter()
        block()
        _sync(device)
        wall.append(time.perf_counter() - t)
    res["block_wall"] = statistics.median(wall)
    S = rt._slots(P + 2 * K)
    if mode != "eager":
        g_round, g_start = rt._graph("round", False, S), rt._graph("start", True, S)
        rt.truncate(P)
        res["round_gpu"] = timer(g_round.replay, iters=20)

        def replay_start():
            rt.truncate(P)
            g_start.replay()
        res["start_gpu"] = timer(replay_start, iters=10)
        if mode == "while":
            g_block = rt._graph("block", True, S)

            def replay():
                rt.truncate(P)
                rt.pending = True
                g_block.replay()
            res["block_gpu"] = timer(replay, iters=5)
    else:
        rt.truncate(P)
        res["round_wall"] = timer(lambda: rt._round(S), iters=3)
    return res


def routed_experts(rt, P) -> list:
    """Router ids (T, k) per layer of one eager canvas round at context P (rt after a block)."""
    rt.truncate(P)
    ids: list = []
    S = rt._slots(P + rt.K)
    h = F_.embed(rt.w, rt.canvas, rt.z, rt.where)
    anc = torch.zeros_like(rt.lim_canvas)
    F_.forward(rt.w, h, rt.cache_len, rt.lim_canvas, rt.kv, S, logits_from=None, route_out=ids,
               canvas_rows=rt.where, anc=anc)
    return ids


def hf_parity(hf, rt, prompt) -> str:
    """One first-step canvas forward (no self-conditioning) through transformers and through our
    runtime on the same weights: max |diff| of the logits relative to their max, argmax agreement."""
    from transformers.cache_utils import DynamicCache  # noqa: PLC0415
    P, K = prompt.shape[1], rt.K
    canvas = torch.randint(0, rt.mcfg.vocab_size, (1, K), generator=torch.Generator().manual_seed(1)).to(prompt.device)
    import inspect  # noqa: PLC0415

    def cache_kw(fn):  # transformers 5.24 names the argument `cache`; older 5.x `past_key_values`
        return "cache" if "cache" in inspect.signature(fn).parameters else "past_key_values"
    cache = DynamicCache(config=hf.config.get_text_config(decoder=True))
    out = hf.model.encoder(input_ids=prompt, **{cache_kw(hf.model.encoder.forward): cache})
    cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None) or cache
    ref = hf(decoder_input_ids=canvas, **{cache_kw(hf.forward): cache}).logits.float()
    rt.prefill(prompt)
    got = rt._embed_forward(canvas, rt.lim_canvas, rt._slots(P + K), None, rt.where).float()
    err = float((got - ref).abs().max()) / float(ref.abs().max())
    agree = float((got.argmax(-1) == ref.argmax(-1)).float().mean())
    return f"max rel. logit diff {err:.1e}, argmax agreement {agree:.3f}"


def hf_generate(hf, prompt, K, steps, device) -> dict:
    """transformers' generate for one canvas of ``steps`` denoising steps (stop test disabled):
    its decoder forwards timed (synchronised) inside the loop, its prefill, its whole wall time."""
    from transformers.cache_utils import DynamicCache  # noqa: PLC0415
    kw = dict(max_new_tokens=K, max_denoising_steps=steps, stability_threshold=steps + 1,
              confidence_threshold=1e-30, t_min=0.4, t_max=0.8, eos_token_id=None)
    times: list[float] = []
    orig = hf.forward

    def timed(*a, **k):
        _sync(device)
        t = time.perf_counter()
        out = orig(*a, **k)
        _sync(device)
        times.append(time.perf_counter() - t)
        return out

    hf.forward = timed  # generate() looks the decoder forward up on the instance
    try:
        hf.generate(prompt, **kw)  # warm-up
        walls, fwd, pre = [], [], []
        for _ in range(2):
            times.clear()
            _sync(device)
            t = time.perf_counter()
            hf.generate(prompt, **kw)
            _sync(device)
            walls.append(time.perf_counter() - t)
            fwd += times
            _sync(device)
            t = time.perf_counter()
            hf.model.encoder(input_ids=prompt, cache=DynamicCache(config=hf.config.get_text_config(decoder=True)))
            _sync(device)
            pre.append(time.perf_counter() - t)
    finally:
        del hf.forward
    wall, prefill = statistics.median(walls), statistics.median(pre)
    return {"forward": statistics.median(fwd), "step": (wall - prefill) / steps, "wall": wall, "prefill": prefill,
            "calls": len(times)}


# ------------------------------------------------------------------------------- section
def correctness(h, modes) -> None:
    import os  # noqa: PLC0415
    import sys  # noqa: PLC0415
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    from test_engine_dgemma import _cfg, _model, _reference  # noqa: PLC0415
    h.say("## DiffusionGemma correctness: runtime vs reference decoder (dgemma/tiny, float32, same counter RNG)\n")
    model = _model().cuda()
    prompt = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(7)).cuda()
    rows = []
    for name, kw in (("sampled T 0.8->0.4, 6 steps", dict(steps=6, max_new_tokens=48)),
                     ("low temperature, early stop", dict(steps=12, t_min=0.01, t_max=0.02, max_new_tokens=48)),
                     ("greedy, stability 0", dict(steps=5, temperature=0.0, stability_threshold=0))):
        cfg = _cfg(**kw)
        ref = _reference(model, prompt, cfg, seed=11)
        for mode in ["eager"] + modes:
            for fold in (True, False):
                try:
                    rt = Runtime(model, 16, mode=mode, max_len=160, fold_commit=fold, bucket=32)
                    out = rt.decode(prompt, cfg, seed=11)
                    same = out.block_tokens == ref.block_tokens and out.steps_per_block == ref.steps_per_block
                    rows.append([name, mode, fold, "yes" if same else "NO", ref.steps_per_block[0],
                                 out.steps_per_block[0]])
                except Exception as exc:  # noqa: BLE001 - report and go on
                    rows.append([name, mode, fold, f"error: {type(exc).__name__}: {exc}"[:120], "-", "-"])
                h.LOG.setdefault("dgemma_correctness", []).append(rows[-1])
    h.table(["setting", "mode", "fold commit", "same canvases + rounds", "rounds (ref)", "rounds (ours)"], rows)


def run(h, bw: float, skip_hf: bool, modes: list[str], correct: bool = True, size: str = "diffusiongemma-26b-a4b",
        P: int = 512, steps: int = 8, device: str = "cuda") -> None:
    """The DiffusionGemma section; ``h`` is benchmarks/engine.py (say, table, gpu_time, LOG)."""
    device = torch.device(device)
    if device.type == "cuda" and correct:
        try:
            correctness(h, modes)
        except Exception as exc:  # noqa: BLE001
            h.say(f"DiffusionGemma correctness failed: {type(exc).__name__}: {exc}\n")
        torch._dynamo.reset()
    cfg = get_config("dgemma", size)
    K = cfg.block_size
    h.say(f"## Speed: DiffusionGemma {size} shape, random weights, bf16, {P}-token context, {K}-token canvas\n")
    hf = None
    t0 = time.perf_counter()
    if not skip_hf:
        try:
            hf = build_hf(cfg, device)
            model = ours_from_hf(hf)
            h.say(f"- weights: transformers' DiffusionGemmaForBlockDiffusion, random bf16, built on {device} in "
                  f"{time.perf_counter() - t0:.0f} s; ours aliases the same tensors (attention "
                  f"{hf.config._attn_implementation}, experts {getattr(hf.config, '_experts_implementation', '?')})")
        except Exception as exc:  # noqa: BLE001
            h.say(f"- transformers model unavailable ({type(exc).__name__}: {exc}); building ours alone")
            hf = None
    if hf is None:
        model = build_ours(cfg, device)
        h.say(f"- weights: ours, random bf16, built on {device} in {time.perf_counter() - t0:.0f} s")
    if device.type == "cuda":
        h.say(f"- GPU memory after building: {torch.cuda.memory_allocated() / 1e9:.1f} GB allocated")
    prompt = torch.randint(0, cfg.vocab_size, (1, P), generator=torch.Generator().manual_seed(0)).to(device)
    rows, notes, floor, wbytes, best, profs = [], [], None, None, None, {}
    extra = [m for m in os.environ.get("DG_MODES", "").split(",") if m]   # e.g. DG_MODES=while+compile
    for mode in (modes + extra + ["eager"]) if device.type == "cuda" else ["eager"]:
        try:
            r = ours(h, model, prompt, K, steps, mode, device)
        except Exception as exc:  # noqa: BLE001 - report and go on
            h.say(f"  ours, {mode} failed: {type(exc).__name__}: {exc}")
            continue
        rt = r.pop("rt")
        if floor is None:
            ids = routed_experts(rt, P)
            touched = [int(torch.unique(i).numel()) for i in ids]
            wbytes, all_bytes = rt.w.weight_bytes(ids), rt.w.weight_bytes()
            floor, how = h.floor_of(rt.w, K, P + K, wbytes, ids)
            kv_bytes = rt.kv.bytes_per_slot() * (P + 2 * K)
            notes.append(f"experts touched by one round ({K} tokens x top-{cfg.num_experts_per_tok}), per layer: "
                         f"{touched} (mean {statistics.mean(touched):.1f} of {cfg.num_experts})")
            notes.append(f"weight bytes of a round {wbytes / 1e9:.2f} GB (all experts: {all_bytes / 1e9:.2f} GB); "
                         f"floor {floor * 1e3:.2f} ms = {how} (+ KV of {P + 2 * K} slots, "
                         f"{kv_bytes / 1e6:.0f} MB: {(wbytes + kv_bytes) / bw * 1e3:.2f} ms); the self-conditioning "
                         f"soft embedding reads E ({rt.w.embed.numel() * 2 / 1e9:.2f} GB) a second time; MoE backend "
                         f"{rt.w.moe_backend}")
            if hf is not None:
                try:
                    notes.append("ours vs transformers on these weights, one canvas forward (bf16): "
                                 + hf_parity(hf, rt, prompt))
                except Exception as exc:  # noqa: BLE001
                    notes.append(f"parity check with transformers failed: {type(exc).__name__}: {exc}")
            for n in notes:
                h.say(f"- {n}")
            notes.clear()
        n = r["rounds"]
        per_round, (ms, xf, gbs, over) = h.round_row(r, mode, floor, wbytes)
        if best is None or per_round < best[0]:  # the fastest path is the one compared with transformers
            best = (per_round, r["block_wall"], mode)
        rows.append([f"(b) ours, {mode}", n, ms, xf, gbs, f"{r['block_wall'] * 1e3:.1f}", over])
        if "start_gpu" in r and mode == modes[0]:
            notes.append(f"{mode}: the folded start (previous canvas's causal encode + first round, {2 * K} tokens) "
                         f"takes {r['start_gpu'] * 1e3:.2f} ms vs {per_round * 1e3:.2f} ms for a round")
        if mode.startswith("while") and device.type == "cuda":  # the timed round graph, as it runs
            try:
                prof = h.profile_round(rt, P, K, round_s=per_round)
                profs[mode] = prof
                h.LOG.setdefault("dgemma_profile", {})[mode] = prof
            except Exception as exc:  # noqa: BLE001 - a profile must not end the benchmark
                notes.append(f"profile failed: {type(exc).__name__}: {exc}")
        h.LOG.setdefault("dgemma_speed", []).append(rows[-1] + [r["setup_s"], r.get("start_gpu")])
        h.say("  " + " | ".join(str(x) for x in rows[-1]) + f" | setup {r['setup_s']:.1f} s")
        del rt, r
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if hf is not None and best is not None:
        try:
            r = hf_generate(hf, prompt, K, steps, device)
            for name, t in (("(c) transformers generate: decoder forward", r["forward"]),
                            ("(c) transformers generate: whole denoising step", r["step"])):
                rows.append([name, steps, f"{t * 1e3:.2f}", f"{t / floor:.2f}", f"{wbytes / t / 1e9:.0f}",
                             f"{(r['wall'] - r['prefill']) * 1e3:.1f}", "-"])
                h.say("  " + " | ".join(str(x) for x in rows[-1]))
            notes.append(f"speed-up of ours ({best[2]}, per round) over transformers: {r['forward'] / best[0]:.1f}x its "
                         f"decoder forward, {r['step'] / best[0]:.1f}x its whole denoising step; per canvas "
                         f"({steps} rounds, prefill excluded): {(r['wall'] - r['prefill']) / best[1]:.1f}x "
                         f"(its prefill of {P} tokens: {r['prefill'] * 1e3:.1f} ms)")
            h.LOG["dgemma_hf"] = r
        except Exception as exc:  # noqa: BLE001
            h.say(f"  transformers generate failed: {type(exc).__name__}: {exc}")
    h.say()
    for n in notes:
        h.say(f"- {n}")
    h.say(f"\nPer round: GPU time of one round graph (CUDA events) for the graph modes, one eager round's wall "
          f"time for eager. Canvas: host wall time of a whole canvas of {steps} rounds (stop test disabled), incl. "
          "the folded encode of the previous canvas, launch, sync and read-back; for transformers its generate "
          "wall time minus its prefill. Host overhead: (canvas wall - canvas GPU time) / rounds for 'while'.\n")
    h.table(["variant", "rounds/canvas", "per round ms", "x floor", "weight GB/s", "canvas ms",
             "host overhead us/round"], rows)
    for mode, prof in profs.items():
        h.say(f"### One DiffusionGemma round, {mode}: GPU time by kernel kind (profiler over replays of the "
              "round's graph)\n")
        h.table(["kind", "kernels", "ms"], prof)
    del model, hf
    if device.type == "cuda":
        torch.cuda.empty_cache()
