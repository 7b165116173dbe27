"""LLaDA-2.1-mini section of `benchmarks/engine.py` (``--families ...,llada``); not run on its own.

Measures, on the full-size shape (16B MoE: 20 layers, the first dense, 256 experts top-8 + 1
shared expert; random bf16 weights built directly on the GPU, 32 GB), 512-token context, block 32,
under LLaDA-2.1's rule (threshold + editing) with threshold 1.0 and edit threshold 1.0, so every
block takes exactly K + 1 rounds (one mask per round, then one editing-only post step that edits
nothing):
  * correctness first: `llada/tiny` in float32, runtime vs the reference decoder, each mode;
  * per-round GPU time of our runtime (one round graph), modes "while" / "graph" / "eager",
    optionally torch.compile'd layers; host overhead per round; whole-block wall time;
  * the floor of that round: every dense / attention / router / shared-expert / LM-head byte
    plus only the routed experts the round's tokens touch (`orl.engine.forward.Baked.weight_bytes`
    with the round's router ids), over the measured copy bandwidth; how many experts it touched;
  * the reference decoder's (`orl.decode.decode`) time per forward on the same weights.
The timed round replays on the state left by a finished block (its 32 committed tokens as the
canvas), and the floor is computed from the routing of that same state.
Helpers (say, table, timers, `ours`, `reference_round`, `profile_round`) are engine.py's, passed in
as the module ``E`` so that both write one results file.
"""
from __future__ import annotations

import time

import torch

from orl.decode import DecodeConfig
from orl.engine import forward as F_
from orl.engine.parity import compare_decode
from orl.engine.runtime import Runtime
from orl.model import build_model, get_config
from orl.model.layers import MoE, RMSNorm
from orl.model.transformer import Transformer

RULE = dict(rule="llada", threshold=1.0, edit_threshold=1.0)  # K + 1 rounds per block, fixed


def random_model(cfg, seed: int = 0, dtype=torch.bfloat16, device="cuda") -> Transformer:
    """A random model built in ``dtype`` directly on the GPU (no float32 copy: 32 GB, not 96 GB
    at peak). Same init scheme as `orl.model.build_model` (normal 0.02, experts D^-1/2 / I^-1/2,
    norms 1); every parameter is checked to be initialised."""
    if cfg.pathway != "none" or cfg.tie_embeddings or cfg.norm_offset != 0.0:
        raise ValueError("random_model covers untied models without a residual pathway and norm_offset 0")
    with torch.device("meta"):
        model = Transformer(cfg)
    model = model.to(dtype).to_empty(device=device)
    g = torch.Generator(device=device).manual_seed(seed)
    done = set()
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, RMSNorm) and mod.weight is not None:
                mod.weight.fill_(1.0)
                done.add(id(mod.weight))
            elif isinstance(mod, (torch.nn.Linear, torch.nn.Embedding)):
                mod.weight.normal_(0, 0.02, generator=g)
                done.add(id(mod.weight))
            elif isinstance(mod, MoE):
                mod.gate_up_proj.normal_(0, cfg.hidden_size ** -0.5, generator=g)
                mod.down_proj.normal_(0, cfg.moe_intermediate_size ** -0.5, generator=g)
                done |= {id(mod.gate_up_proj), id(mod.down_proj)}
    missed = [n for n, p in model.named_parameters() if id(p) not in done]
    if missed or list(model.buffers()):
        raise RuntimeError(f"random_model left parameters/buffers uninitialised: {missed[:5]}")
    return model.eval()


def correctness(E, modes: list[str]) -> None:
    E.say("### LLaDA correctness: llada/tiny, float32, runtime vs reference decoder (rule llada)\n")
    model = build_model(get_config("llada", "tiny", tie_embeddings=False), seed=1, device="cuda").eval()
    torch.nn.init.normal_(model.residual_pathway.mlp.down_proj.weight, std=0.2)
    torch.nn.init.normal_(model.lm_head.weight, std=0.3)  # peaked: commits and edits happen
    K = model.config.block_size
    prompt = torch.randint(5, 60, (1, 11), generator=torch.Generator().manual_seed(3)).cuda()
    rows = []
    for thr, ethr in ((0.5, 0.3), (0.95, 0.9)):
        cfg = DecodeConfig(rule="llada", block_size=K, max_new_tokens=3 * K, threshold=thr, edit_threshold=ethr)
        for mode, comp in [("eager", False)] + [(m, False) for m in modes] + [(modes[0], True)]:
            try:
                rt = Runtime(model, K, mode=mode, max_len=128, bucket=32, compile=comp)
                c = compare_decode(rt, model, prompt, cfg)
                res = "yes" if c["equal"] else f"no (first diff at {c['first_diff']})"
                backend = rt.w.moe_backend
            except Exception as exc:  # noqa: BLE001 - report and go on
                res, backend = f"failed: {type(exc).__name__}: {exc}"[:200], "-"
            rows.append([f"{thr}/{ethr}", mode + (" + compile" if comp else ""), backend, res])
            E.LOG.setdefault("llada_correctness", []).append(rows[-1])
    E.table(["threshold/edit", "mode", "MoE backend", "same tokens and rounds"], rows)
    torch._dynamo.reset()


def touched(rt, P: int) -> tuple[list, int]:
    """Router ids of one eager round on the runtime's current canvas (state of the timed round)."""
    K = rt.K
    S = rt._slots(P + 2 * K)
    rt.truncate(P)
    ids: list = []
    F_.forward(rt.w, F_.embed(rt.w, rt.canvas), rt.cache_len, rt.lim_canvas, rt.kv, S, route_out=ids)
    return ids, S


def speed(E, bw: float, modes: list[str], skip_ref: bool = False) -> None:
    torch._dynamo.reset()
    cfg = get_config("llada", "llada2.1-mini")
    P, K = 512, 32
    E.say(f"## Speed: LLaDA-2.1-mini shape (MoE, {cfg.num_experts} experts top-{cfg.num_experts_per_tok} + "
          f"{cfg.num_shared_experts} shared), random weights, bf16, {P}-token context, block {K}, rule llada\n")
    t0 = time.perf_counter()
    model = random_model(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    E.say(f"- model: {n_params / 1e9:.2f}B parameters, {n_params * 2 / 1e9:.1f} GB, built in "
          f"{time.perf_counter() - t0:.1f} s; GPU memory allocated {torch.cuda.memory_allocated() / 1e9:.1f} GB")
    prompt = torch.randint(0, cfg.vocab_size, (1, P), generator=torch.Generator().manual_seed(0)).cuda()
    rows, notes, profs = [], [], {}
    floor = wbytes = None
    n_moe = cfg.num_layers - cfg.first_dense_layers
    variants = [(m, False, "torch") for m in modes] + [(modes[0], True, "torch"), (modes[0], False, "triton")]
    if not E.QUICK:
        variants.append(("eager", False, "torch"))
    for mode, comp, kern in variants:
        name = f"(b) ours, {mode}" + (" + torch.compile" if comp else "") + (" + Triton kernels" if kern != "torch" else "")
        try:
            r = E.ours(model, prompt, K, None, mode, comp, kernels=kern, **RULE)
        except Exception as exc:  # noqa: BLE001 - report and go on
            E.say(f"  {name} failed: {type(exc).__name__}: {exc}")
            torch.cuda.empty_cache()
            continue
        rt, n = r["rt"], r["rounds"]
        if floor is None:  # the floor of the timed round: dense bytes + the experts it touches
            full = rt.w.weight_bytes()
            try:
                ids, _ = touched(rt, P)
            except Exception as exc:  # noqa: BLE001 - fall back to counting every expert
                E.say(f"  router ids of the timed round failed ({type(exc).__name__}: {exc}); "
                      "the floor below counts ALL experts")
                ids = [torch.arange(cfg.num_experts)] * n_moe
            wbytes = rt.w.weight_bytes(ids)
            floor, how = E.floor_of(rt.w, K, P + K, wbytes, ids)
            per_layer = [int(torch.unique(i).numel()) for i in ids]
            notes.append(f"the timed round touches {sum(per_layer)} of {n_moe * cfg.num_experts} routed experts "
                         f"({sum(per_layer) / n_moe:.1f} per MoE layer on average, min {min(per_layer)}, "
                         f"max {max(per_layer)}) -> floor bytes {wbytes / 1e9:.3f} GB of {full / 1e9:.3f} GB; "
                         f"floor {floor * 1e3:.3f} ms = {how}; MoE backend {rt.w.moe_backend}")
            E.say(f"- {notes[-1]}")
            E.LOG["llada_floor"] = dict(bytes=wbytes, all_bytes=full, experts_per_layer=per_layer, floor_s=floor)
        per_round, (ms, xf, gbs, over) = E.round_row(r, mode, floor, wbytes)
        rows.append([K, name, n, ms, xf, gbs, f"{r['block_wall'] * 1e3:.2f}", over])
        E.LOG.setdefault("llada_speed", []).append(rows[-1] + [r["setup_s"], r.get("start_gpu")])
        E.say("  " + " | ".join(str(x) for x in rows[-1]) + f" | setup {r['setup_s']:.1f} s")
        if "start_gpu" in r and mode == modes[0]:
            notes.append(f"{name}: the folded start ({2 * K} tokens) takes {r['start_gpu'] * 1e3:.3f} ms vs "
                         f"{per_round * 1e3:.3f} ms for a round")
        if mode == "while":  # the timed round graph, as it runs
            try:
                profs[name] = E.profile_round(rt, P, K, round_s=per_round)
            except Exception as exc:  # noqa: BLE001
                E.say(f"  profile failed: {exc}")
        del r, rt
        torch.cuda.empty_cache()
    if not skip_ref and floor is not None:
        try:
            ref_t, ref_rounds = E.reference_round(model, prompt, K, None, blocks=3, **RULE)
            rows.insert(0, [K, "(a) reference decoder, eager", ref_rounds, f"{ref_t * 1e3:.2f}", f"{ref_t / floor:.2f}",
                            f"{wbytes / ref_t / 1e9:.0f}", f"{ref_t * (ref_rounds + 1) * 1e3:.1f}", "-"])
            E.say("  " + " | ".join(str(x) for x in rows[0]))
        except Exception as exc:  # noqa: BLE001
            E.say(f"  reference decoder failed: {type(exc).__name__}: {exc}")
    E.say()
    for n in notes:
        E.say(f"- {n}")
    E.say("\nColumns as in the Qwen3 table; the floor counts all dense/attention/router/shared-expert/LM-head "
          "bytes and only the routed experts the timed round touches. No transformers baseline for this family "
          "(LLaDA-2.x is not in transformers).\n")
    E.table(["K", "variant", "rounds/block", "per round ms", "x floor", "weight GB/s", "block ms",
             "host overhead us/round"], rows)
    for name, prof_rows in profs.items():
        E.say(f"### One LLaDA round (K=32) of {name}: GPU time by kernel kind (profiler over replays of the "
              "round's graph)\n")
        E.table(["kind", "kernels", "ms"], prof_rows)
    del model
    torch.cuda.empty_cache()
