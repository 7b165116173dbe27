"""LLaDA-2.x checkpoints (``llada2_moe``: inclusionAI's ``LLaDA2MoeModelLM``) in our one model.

Owns: translating a LLaDA-2.x ``config.json`` into `ModelConfig` (family "llada") and back, and the
key map between its tensors and ours in both directions. Written from the published modeling
code's semantics (a Ling / Bailing-MoE decoder; docs/formats.md 3): pre-norm layers, a fused
``query_key_value`` projection, RMSNorm on each query / key head, NeoX-style partial RoPE on the
first ``int(head_dim * partial_rotary_factor)`` dims of a head, the first ``first_k_dense_replace``
layers dense and the rest MoE (router ``gate``, routed experts, shared experts of
``moe_intermediate_size * num_shared_experts``), unshifted logits. Parity with an independent
reference forward: tests/test_parity_llada2.py.

Two exact re-parameterisations map it onto our layers:
  * partial RoPE: ours rotates dims (j, hd/2 + j) for j < r/2 at frequency theta'^(-2j/hd)
    ("proportional", `orl.model.layers.rope_cos_sin`); LLaDA-2 rotates (j, r/2 + j) at
    theta^(-2j/r). With theta' = theta^(hd/r) (`full_rope_theta`; `rope_theta` keeps theta) and the
    head dims of q and k permuted (`rope_perm`, applied to the projection rows and the q/k norm
    weights; q.k is unchanged by a permutation applied to both) the two are the same function.
  * experts: LLaDA-2 stores one MLP per expert (``experts.{e}.{gate,up,down}_proj``); ours stacks
    them (``gate_up_proj`` (E, 2I, D) rows [gate; up], ``down_proj`` (E, D, I)).

The router maps field for field onto ours (`ModelConfig.router_*`, `orl.model.layers.group_limited_route`):
the published gate scores experts with a sigmoid (``score_function``; "softmax" is honoured, as
Ling / Bailing-MoE-V2 code does), adds ``mlp.gate.expert_bias`` (ours ``mlp.expert_bias``, a
buffer) for the choice only when ``moe_router_enable_expert_bias``, limits the choice to the top
``topk_group`` of ``n_group`` expert groups, renormalises (``norm_topk_prob``, k > 1) and scales the
weights by ``routed_scaling_factor``. A model of ours with the plain router is written as
``score_function: "softmax"``, one group, no bias, scale 1. Still refused, each named in one error:
other score functions, groups that do not divide the experts, a non-zero ``expert_bias`` in a
checkpoint whose config disables it (a missing one where it enables it), and the non-router
options below. A LLaDA-2.x checkpoint has
no mask id or block length in its config (its ``generate`` takes ``mask_id=156895``,
``block_length=32``): they are required (`formats.diffusion_fields`).
Does not own: reading/writing files (`files`), the decoding protocol of the family (`orl.decode`).
"""
from __future__ import annotations

import torch

from ..config import ModelConfig
from .formats import CheckpointError, Format, diffusion_fields, register
from .qwen3 import DIFFUSION, token_ids

_ACT_IN = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}
_ACT_OUT = {v: k for k, v in _ACT_IN.items()}


def rope_perm(head_dim: int, rotary_dim: int) -> list[int]:
    """ours[i] = theirs[perm[i]] for one head: LLaDA-2's rotated pairs (j, r/2 + j) land on our
    (j, hd/2 + j), its unrotated dims [r, hd) fill our remaining slots in order."""
    h, r = head_dim // 2, rotary_dim // 2
    rest = list(range(rotary_dim, head_dim))
    return list(range(r)) + rest[:h - r] + list(range(r, rotary_dim)) + rest[h - r:]


def _rotary(cfg: ModelConfig) -> int:
    return cfg.layer_rope("full")[2]


# --------------------------------------------------------------------------- config
def config_from_llada2(d: dict) -> ModelConfig:
    """Our config from a LLaDA-2.x config.json; absent keys take the published
    ``LLaDA2MoeConfig`` defaults. Refuses what our model cannot express (listed in one error)."""
    problems = []
    D, H = d.get("hidden_size", 1024), d.get("num_attention_heads", 16)
    hd = d.get("head_dim") or D // H
    partial = float(d.get("partial_rotary_factor", 0.5))
    r = int(hd * partial)
    frac = r / hd
    if r % 2 or r <= 0 or 2 * int(frac * hd // 2) != r:
        problems.append(f"partial_rotary_factor {partial} gives {r} rotary dims of {hd}; need an even count")
    theta = float(d.get("rope_theta", 10_000.0))
    if d.get("rope_scaling"):
        problems.append(f"rope_scaling {d['rope_scaling']} (only plain RoPE is implemented)")
    if d.get("use_sliding_window"):
        problems.append("use_sliding_window=True")
    if d.get("use_bias", True):
        problems.append("use_bias=True (a bias on attention.dense; ours has none)")
    if d.get("norm_head"):
        problems.append("norm_head=True")
    act = d.get("hidden_act", "silu")
    if act not in _ACT_IN:
        problems.append(f"hidden_act {act!r} (silu or gelu_pytorch_tanh)")
    E, k = d.get("num_experts") or 0, d.get("num_experts_per_tok", 2)
    I = d.get("moe_intermediate_size") or 0
    shared = d.get("num_shared_experts") or 0
    router = {}
    if E:
        router = _router_from(d)
        if router["router_score"] not in ("sigmoid", "softmax"):
            problems.append(f"router score_function {router['router_score']!r} (sigmoid or softmax)")
        G, Gk = router["router_groups"], router["router_topk_groups"]
        if G < 1 or E % G or not 1 <= Gk <= G:
            problems.append(f"n_group {G} / topk_group {Gk} with {E} experts (n_group must divide num_experts, "
                            "1 <= topk_group <= n_group)")
        elif not 1 <= k <= Gk * (E // G):
            problems.append(f"num_experts_per_tok {k} of the {Gk * (E // G)} experts in {Gk} of {G} groups")
        se = d.get("moe_shared_expert_intermediate_size")
        if shared and se is not None and se != I * shared:
            problems.append(f"moe_shared_expert_intermediate_size {se} != moe_intermediate_size x num_shared_experts")
    if problems:
        raise CheckpointError("cannot express this LLaDA-2.x config: " + "; ".join(problems))
    return ModelConfig(
        family="llada", vocab_size=d.get("vocab_size", 30_592), hidden_size=D,
        num_layers=d.get("num_hidden_layers", 24), num_heads=H, num_kv_heads=d.get("num_key_value_heads") or H, head_dim=hd,
        intermediate_size=d.get("intermediate_size") or 0, rope_theta=theta,
        full_rope_theta=None if r == hd else theta ** (hd / r), full_rotary_fraction=frac,
        rms_eps=d.get("rms_norm_eps", 1e-5), max_position=d.get("max_position_embeddings", 16_384),
        tie_embeddings=bool(d.get("tie_word_embeddings", False)), qk_norm=bool(d.get("use_qk_norm", True)),
        attention_bias=bool(d.get("use_qkv_bias", False)), hidden_act=_ACT_IN[act],
        num_experts=E, num_experts_per_tok=k if E else 0, moe_intermediate_size=I if E else 0,
        num_shared_experts=shared if E else 0, first_dense_layers=d.get("first_k_dense_replace", 0) if E else 0,
        router_norm_topk=bool(d.get("norm_topk_prob", True)) and k > 1,  # the published gate: top-1 unnormalised
        **router, pathway="none", **diffusion_fields(d, DIFFUSION, "LLaDA-2.x"))


def _router_from(d: dict) -> dict:
    """Our router fields from a LLaDA-2.x config; absent keys take the published gate's values
    (sigmoid, expert bias on, 8 groups of which 4 kept, scale 2.5)."""
    return dict(router_score=d.get("score_function") or "sigmoid",
                router_bias=bool(d.get("moe_router_enable_expert_bias", True)),
                router_groups=int(d.get("n_group", 8) or 1), router_topk_groups=int(d.get("topk_group", 4) or 1),
                router_scaling=float(2.5 if d.get("routed_scaling_factor") is None else d["routed_scaling_factor"]))


def config_to_llada2(cfg: ModelConfig, source: dict | None, ids: dict | None) -> dict:
    """A LLaDA-2.x config.json for ``cfg`` (the source's own keys kept: auto_map, token ids). Every
    key is written; the router's from ``cfg`` (a plain router: softmax, one group, no bias, scale 1),
    a source's value kept where it reads back equal (1 stays 1, not 1.0)."""
    if cfg.hidden_act not in _ACT_OUT:
        raise CheckpointError(f"hidden_act {cfg.hidden_act!r} has no LLaDA-2.x name")
    d = dict(source or {"architectures": ["LLaDA2MoeModelLM"], "model_type": "llada2_moe", "embedding_dropout": 0.0,
                        "attention_dropout": 0.0, "output_dropout": 0.0, "initializer_range": 0.02,
                        "use_cache": True, "output_router_logits": False, "pad_token_id": None})
    moe = cfg.is_moe
    d.update(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
             num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
             num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, hidden_act=_ACT_OUT[cfg.hidden_act],
             use_qkv_bias=cfg.attention_bias, use_bias=False, use_qk_norm=cfg.qk_norm, norm_head=False,
             rms_norm_eps=cfg.rms_eps, tie_word_embeddings=cfg.tie_embeddings,
             max_position_embeddings=cfg.max_position, rope_theta=cfg.rope_theta, rope_scaling=None,
             partial_rotary_factor=_rotary(cfg) / cfg.head_dim, use_sliding_window=False,
             num_experts=cfg.num_experts if moe else None, num_experts_per_tok=cfg.num_experts_per_tok if moe else 0,
             moe_intermediate_size=cfg.moe_intermediate_size if moe else None,
             num_shared_experts=cfg.num_shared_experts if moe else 0,
             first_k_dense_replace=cfg.first_dense_layers if moe else 0,
             mask_token_id=cfg.mask_token_id, block_size=cfg.block_size)
    for k, v in dict(score_function=cfg.router_score, moe_router_enable_expert_bias=cfg.router_bias,
                     n_group=cfg.router_groups, topk_group=cfg.router_topk_groups,
                     routed_scaling_factor=cfg.router_scaling).items():
        if d.get(k) != v:
            d[k] = v
    if "norm_topk_prob" not in d or cfg.num_experts_per_tok > 1:  # top-1: the published gate never renormalises
        d["norm_topk_prob"] = cfg.router_norm_topk
    d.pop("moe_shared_expert_intermediate_size", None)
    return token_ids(d, ids)


def generation_llada2(cfg: ModelConfig, source: dict | None, ids: dict | None) -> dict:
    return token_ids(dict(source or {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}), ids)


# --------------------------------------------------------------------------- keys
def _heads(w: torch.Tensor, n: int, hd: int, perm: list[int]) -> torch.Tensor:
    """Rows (or entries) of ``n`` heads of ``hd`` reordered within each head: out[h, i] = w[h, perm[i]]."""
    return w.reshape(n, hd, *w.shape[1:])[:, perm].reshape(w.shape)


def llada2_to_ours(cfg: ModelConfig, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our state dict from a LLaDA-2.x checkpoint's tensors. Tensors of ours (the residual
    pathway) and unknown names pass through, so that `load_state` reports what does not fit."""
    H, Hkv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    perm = rope_perm(hd, _rotary(cfg))
    out, experts = {}, {}
    for key, v in state.items():
        if key == "model.word_embeddings.weight":
            out["model.embed_tokens.weight"] = v
            continue
        if not key.startswith("model.layers."):
            out[key] = v  # model.norm, lm_head, residual_pathway.*, unknown
            continue
        _, _, i, rest = key.split(".", 3)
        p = f"model.layers.{i}."
        if rest in ("attention.query_key_value.weight", "attention.query_key_value.bias"):
            kind = rest.rsplit(".", 1)[1]
            q, k_, v_ = v.split([H * hd, Hkv * hd, Hkv * hd])
            out[p + f"self_attn.q_proj.{kind}"] = _heads(q, H, hd, perm)
            out[p + f"self_attn.k_proj.{kind}"] = _heads(k_, Hkv, hd, perm)
            out[p + f"self_attn.v_proj.{kind}"] = v_
        elif rest == "attention.query_layernorm.weight":
            out[p + "self_attn.q_norm.weight"] = v[perm]
        elif rest == "attention.key_layernorm.weight":
            out[p + "self_attn.k_norm.weight"] = v[perm]
        elif rest.startswith("attention.dense."):
            out[p + "self_attn.o_proj." + rest.rsplit(".", 1)[1]] = v
        elif rest == "mlp.gate.expert_bias":
            if cfg.router_bias:
                out[p + "mlp.expert_bias"] = v
            elif torch.count_nonzero(v):
                raise CheckpointError(f"{key} is not zero but config.json sets moe_router_enable_expert_bias false, "
                                      "so it is unclear whether the router adds it to its choice; set "
                                      "moe_router_enable_expert_bias true in config.json to route with it")
        elif rest.startswith("mlp.experts."):
            _, _, e, name = rest.split(".", 3)
            experts.setdefault(i, {})[(int(e), name)] = v
        elif rest.startswith("mlp.shared_experts.") and v.numel() == 0:
            continue  # num_shared_experts = 0 still builds a zero-width shared MLP
        else:
            out[key] = v
    for i, ex in experts.items():
        names = ("gate_proj.weight", "up_proj.weight", "down_proj.weight")
        want = {(e, n) for e in range(cfg.num_experts) for n in names}
        if set(ex) != want:
            raise CheckpointError(f"model.layers.{i}.mlp.experts: missing "
                                  f"{sorted(f'{e}.{n}' for e, n in want - set(ex))[:6]}, unexpected "
                                  f"{sorted(f'{e}.{n}' for e, n in set(ex) - want)[:6]}")
        if cfg.router_bias and f"model.layers.{i}.mlp.expert_bias" not in out:
            raise CheckpointError(f"model.layers.{i}.mlp.gate.expert_bias is missing: config.json enables the "
                                  "router's expert bias (moe_router_enable_expert_bias, true when absent); add the "
                                  "tensor, or set the key false if the router has none")
        E = range(cfg.num_experts)
        out[f"model.layers.{i}.mlp.gate_up_proj"] = torch.stack(
            [torch.cat([ex[(e, "gate_proj.weight")], ex[(e, "up_proj.weight")]]) for e in E])
        out[f"model.layers.{i}.mlp.down_proj"] = torch.stack([ex[(e, "down_proj.weight")] for e in E])
    return out


def ours_to_llada2(cfg: ModelConfig, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """LLaDA-2.x names for our state dict (inverse of `llada2_to_ours`; a model without an expert
    bias gets a zero ``expert_bias`` per MoE layer, as the published model registers one). Every
    tensor is its own copy."""
    H, Hkv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    inv = sorted(range(hd), key=rope_perm(hd, _rotary(cfg)).__getitem__)  # theirs[perm[i]] = ours[i]
    out = {}
    for key, v in state.items():
        if key == "model.embed_tokens.weight":
            out["model.word_embeddings.weight"] = v
            continue
        if not key.startswith("model.layers."):
            if key != "lm_head.weight" or not cfg.tie_embeddings:
                out[key] = v
            continue
        _, _, i, rest = key.split(".", 3)
        p = f"model.layers.{i}."
        if rest.startswith("self_attn.q_proj."):
            kind = rest.rsplit(".", 1)[1]
            out[p + f"attention.query_key_value.{kind}"] = torch.cat([
                _heads(v, H, hd, inv), _heads(state[p + f"self_attn.k_proj.{kind}"], Hkv, hd, inv),
                state[p + f"self_attn.v_proj.{kind}"]])
        elif rest.startswith(("self_attn.k_proj.", "self_attn.v_proj.")):
            continue  # fused with q_proj above
        elif rest == "self_attn.q_norm.weight":
            out[p + "attention.query_layernorm.weight"] = v[inv]
        elif rest == "self_attn.k_norm.weight":
            out[p + "attention.key_layernorm.weight"] = v[inv]
        elif rest == "self_attn.o_proj.weight":
            out[p + "attention.dense.weight"] = v
        elif rest == "mlp.gate_up_proj":
            I = v.shape[1] // 2
            for e in range(v.shape[0]):
                out[p + f"mlp.experts.{e}.gate_proj.weight"] = v[e, :I].clone()
                out[p + f"mlp.experts.{e}.up_proj.weight"] = v[e, I:].clone()
        elif rest == "mlp.down_proj" and v.dim() == 3:
            for e in range(v.shape[0]):
                out[p + f"mlp.experts.{e}.down_proj.weight"] = v[e].clone()
        elif rest == "mlp.expert_bias":
            out[p + "mlp.gate.expert_bias"] = v
        else:  # norms, the router, dense and shared MLPs: same names
            if rest == "mlp.gate.weight" and not cfg.router_bias:  # the published gate always has one
                out[p + "mlp.gate.expert_bias"] = torch.zeros(v.shape[0], dtype=v.dtype)
            out[key] = v
    return out


LLADA2 = register(Format("llada2", config_from_llada2, llada2_to_ours, config_to=config_to_llada2,
                         from_ours=ours_to_llada2, generation=generation_llada2, family="llada",
                         diffusion=DIFFUSION), "llada2_moe")
