"""DiffusionGemma checkpoints (transformers ``DiffusionGemmaForBlockDiffusion``) in our one model.

Owns: translating a DiffusionGemma ``config.json`` into `ModelConfig` and back
(`config_from_dgemma`, `config_to_dgemma`), and the key mapping between HF's checkpoint and our
parameter names in both directions (`dgemma_to_ours`, `ours_to_dgemma`). What we save loads in
transformers as ``DiffusionGemmaForBlockDiffusion`` with the same logits (tests/test_formats.py).
The numerics that make the result equal to HF live in the model as configuration
(docs/diffusiongemma-spec.md; `config.DGEMMA_OPTIONS`).
Does not own: reading/writing files or validation (`orl.model.checkpoint.files`), the vision tower
(text only: its keys are ignored on load and not written on save; a model loaded from a
DiffusionGemma checkpoint keeps that checkpoint's ``vision_config``, one without gets a minimal
placeholder, `PLACEHOLDER_VISION`, so that transformers builds a small, randomly initialised tower
it never uses for text).

HF's encoder (causal, writes the KV cache) and decoder (canvas, reads it) share every text weight;
only the ``layer_scalar`` buffers exist twice. They become our ``layer_scalar`` (clean / encoder
mode) and ``canvas_layer_scalar`` (canvas / decoder mode). Name map, per layer i:
  HF  model.decoder.layers.{i}.                 ours  model.layers.{i}.
      router.proj.weight                              moe.gate.weight
      router.scale / router.per_expert_scale          moe.router_scale / moe.per_expert_scale
      experts.gate_up_proj / experts.down_proj        moe.gate_up_proj / moe.down_proj
      layer_scalar                                    canvas_layer_scalar
  HF  model.encoder.language_model.layers.{i}.layer_scalar    ours  model.layers.{i}.layer_scalar
  HF  model.decoder.self_conditioning.pre_norm / {gate,up,down}_proj
                                                ours  residual_pathway.norm / mlp.{gate,up,down}_proj
  everything else keeps its name under ``model.`` (embed_tokens, norm, self_attn.*, mlp.*, norms).
HF's self-conditioning has no 1/gamma: ours stores W_down x gamma (`orl.model.pathway`), so the
file holds W_down / gamma (the function's weight; exact for a power-of-two gamma) and gamma itself
sits in config.json's ``orl`` block.
"""
from __future__ import annotations

import torch

from ..config import DGEMMA_OPTIONS, ModelConfig
from .formats import CheckpointError, Format, register
from .qwen3 import token_ids

DEC = "model.decoder."
ENC = "model.encoder.language_model."
_LAYER_RENAME = {  # HF suffix inside a layer -> ours
    "router.proj.weight": "moe.gate.weight",
    "router.scale": "moe.router_scale",
    "router.per_expert_scale": "moe.per_expert_scale",
    "experts.gate_up_proj": "moe.gate_up_proj",
    "experts.down_proj": "moe.down_proj",
}
_SELF_COND = {"pre_norm.weight": "norm.weight", "gate_proj.weight": "mlp.gate_proj.weight",
              "up_proj.weight": "mlp.up_proj.weight", "down_proj.weight": "mlp.down_proj.weight"}
_TYPES = {"sliding_attention": "sliding", "full_attention": "full"}
_TYPES_OUT = {v: k for k, v in _TYPES.items()}
# transformers always builds the vision tower; a text-only model saved without a source config gets
# this one (the smallest Gemma-4 vision config), whose random weights no text forward reads.
PLACEHOLDER_VISION = {"model_type": "gemma4_vision", "hidden_size": 32, "intermediate_size": 64,
                      "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 16,
                      "position_embedding_size": 64}


# --------------------------------------------------------------------------- config
def config_from_dgemma(d: dict) -> ModelConfig:
    """Our config from a DiffusionGemma config.json (``diffusion_gemma`` with a ``text_config``,
    or a bare ``diffusion_gemma_text``). Accepts per-layer head dims either as an explicit
    ``per_layer_config`` or as ``global_head_dim`` / ``num_global_key_value_heads``; refuses what
    our model cannot express (listed in one error)."""
    t = d.get("text_config", d)
    H, n = t["hidden_size"], t["num_hidden_layers"]
    problems = []
    types = t.get("layer_types") or ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(n)]
    types = list(types)
    types[-1] = "full_attention"  # HF forces the last layer to full attention
    if set(types) - set(_TYPES):
        problems.append(f"unknown layer_types {sorted(set(types) - set(_TYPES))}")
    kinds = [_TYPES.get(x, "full") for x in types]

    hd, kv = t.get("head_dim", 256), t.get("num_key_value_heads", 4)
    plc = t.get("per_layer_config")
    if plc is None:  # constructor form (HF pops these into per_layer_config)
        g = {"head_dim": t.get("global_head_dim", 512)}
        if t.get("num_global_key_value_heads") is not None:
            g["num_key_value_heads"] = t["num_global_key_value_heads"]
        plc = {i: g for i, k in enumerate(kinds) if k == "full"}
    plc = {int(i): v for i, v in plc.items()}
    shapes = {"sliding": set(), "full": set()}
    for i, k in enumerate(kinds):
        o = plc.get(i, {})
        shapes[k].add((o.get("head_dim", hd), o.get("num_key_value_heads", kv)))
    for k, s in shapes.items():
        if len(s) > 1:
            problems.append(f"{k} layers have different (head_dim, kv_heads) {sorted(s)}; ours are per layer type")
    if shapes["sliding"] and shapes["sliding"] != {(hd, kv)}:
        problems.append(f"sliding layers override head_dim/kv heads {sorted(shapes['sliding'])}")
    full_hd, full_kv = next(iter(shapes["full"])) if shapes["full"] else (hd, kv)

    rp = t.get("rope_parameters") or {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6}}
    rope = {}
    for name in ("sliding_attention", "full_attention"):
        p = rp.get(name) or {}
        rt, frac = p.get("rope_type", "default"), float(p.get("partial_rotary_factor", 1.0))
        if rt not in ("default", "proportional") or float(p.get("factor", 1.0)) != 1.0:
            problems.append(f"{name} rope {p} unsupported (only 'default' and 'proportional' without scaling)")
        if rt == "default" and frac != 1.0:
            problems.append(f"{name}: 'default' RoPE with partial_rotary_factor {frac} (NeoX-style) unsupported")
        rope[name] = (float(p.get("rope_theta", 10_000.0)), frac)
    if rope["sliding_attention"][1] != 1.0:
        problems.append("sliding layers with partial rotary are unsupported")

    if t.get("use_bidirectional_attention") == "all":
        problems.append("use_bidirectional_attention='all' (bidirectional encoder) is not implemented")
    act = t.get("hidden_activation", "gelu_pytorch_tanh")
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        problems.append(f"hidden_activation {act!r} unsupported (gelu_pytorch_tanh only)")
    if t.get("attention_bias"):
        problems.append("attention_bias=True unsupported")
    if not t.get("num_experts"):
        problems.append("num_experts missing: DiffusionGemma layers are all MoE")
    if problems:
        raise CheckpointError("cannot express this DiffusionGemma config: " + "; ".join(problems))

    tie = bool(d.get("tie_word_embeddings", t.get("tie_word_embeddings", True)))
    return ModelConfig(**{**DGEMMA_OPTIONS, **dict(
        family="dgemma", vocab_size=t["vocab_size"], hidden_size=H, num_layers=n, num_heads=t["num_attention_heads"],
        num_kv_heads=kv, head_dim=hd, intermediate_size=t["intermediate_size"],
        rope_theta=rope["sliding_attention"][0], rms_eps=t.get("rms_norm_eps", 1e-6),
        max_position=t.get("max_position_embeddings", 131_072), tie_embeddings=tie,
        embed_scale=H ** 0.5, final_logit_softcap=float(t.get("final_logit_softcapping", 30.0)),
        sliding_window=t.get("sliding_window", 512), layer_types=kinds,
        full_head_dim=full_hd, full_num_kv_heads=full_kv, full_rope_theta=rope["full_attention"][0],
        full_rotary_fraction=rope["full_attention"][1],
        num_experts=t["num_experts"], num_experts_per_tok=t["top_k_experts"],
        moe_intermediate_size=t["moe_intermediate_size"],
        block_size=d.get("canvas_length", 256), pathway="mlp", pathway_intermediate=t["intermediate_size"])})


def config_to_dgemma(cfg: ModelConfig, source: dict | None, ids: dict | None) -> dict:
    """A DiffusionGemma config.json for ``cfg`` (``diffusion_gemma`` with a ``text_config``; the
    source's other keys, vision config included, kept). Token ids go into the text config."""
    fresh = {"architectures": ["DiffusionGemmaForBlockDiffusion"], "model_type": "diffusion_gemma",
             "boi_token_id": 255_999, "eoi_token_id": 258_882, "image_token_id": 258_880,
             "initializer_range": 0.02, "vision_config": dict(PLACEHOLDER_VISION)}
    if source is not None and "text_config" not in source:  # a bare diffusion_gemma_text config
        source = {**fresh, "text_config": source}
    d = dict(source or fresh)
    t = dict(d.get("text_config") or {"model_type": "diffusion_gemma_text", "attention_dropout": 0.0,
                                      "initializer_range": 0.02, "use_bidirectional_attention": None,
                                      "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2})
    for k in ("global_head_dim", "num_global_key_value_heads"):  # the constructor form; we write per_layer_config
        t.pop(k, None)
    full_hd, full_kv = cfg.full_head_dim or cfg.head_dim, cfg.full_num_kv_heads or cfg.num_kv_heads
    t.update(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
             num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
             head_dim=cfg.head_dim, hidden_activation="gelu_pytorch_tanh", max_position_embeddings=cfg.max_position,
             rms_norm_eps=cfg.rms_eps, tie_word_embeddings=cfg.tie_embeddings, attention_bias=cfg.attention_bias,
             sliding_window=cfg.sliding_window, layer_types=[_TYPES_OUT[k] for k in cfg.layer_types],
             per_layer_config={str(i): {"head_dim": full_hd, "num_key_value_heads": full_kv}
                               for i, k in enumerate(cfg.layer_types) if k == "full"},
             rope_parameters={
                 "sliding_attention": {"rope_type": "default", "rope_theta": cfg.rope_theta},
                 "full_attention": {"rope_type": "proportional", "partial_rotary_factor": cfg.full_rotary_fraction,
                                    "rope_theta": cfg.layer_rope("full")[1]}},
             final_logit_softcapping=cfg.final_logit_softcap, num_experts=cfg.num_experts,
             top_k_experts=cfg.num_experts_per_tok, moe_intermediate_size=cfg.moe_intermediate_size)
    d.update(text_config=token_ids(t, ids), canvas_length=cfg.block_size, tie_word_embeddings=cfg.tie_embeddings)
    return d


def generation_dgemma(cfg: ModelConfig, source: dict | None, ids: dict | None) -> dict:
    """generation_config.json: the source's, or what transformers writes for a new model (its
    DiffusionGemma generate returns a dict) with the tokenizer's ids."""
    return token_ids(dict(source or {"return_dict_in_generate": True}), ids)


# --------------------------------------------------------------------------- keys
def _strip(state: dict, prefix: str) -> dict:
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


def dgemma_to_ours(cfg: ModelConfig, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our state dict from a DiffusionGemma checkpoint's tensors (HF names). A state already in
    our names (saved by `orl.model.save_pretrained`) is returned unchanged.

    Text weights may come as ``model.decoder.*`` (what ``save_pretrained`` writes),
    ``model.encoder.language_model.*``, or both (then they must be equal: HF ties them). Vision
    keys are dropped. Unknown text keys keep a mapped name so that `load_state` reports them.
    """
    if not any(k.startswith((DEC, "model.encoder.")) for k in state):
        return dict(state)
    dec, enc = _strip(state, DEC), _strip(state, ENC)
    text = dict(enc)
    for k, v in dec.items():
        if k in enc and not k.endswith("layer_scalar") and (enc[k].shape != v.shape or not torch.equal(enc[k], v)):
            raise CheckpointError(f"{ENC}{k} and {DEC}{k} differ; our model shares one set of text weights")
        text[k] = v
    out = {}
    for k, v in text.items():
        if k.startswith("self_conditioning."):
            rest = k[len("self_conditioning."):]
            if rest == "down_proj.weight" and cfg.pathway_gamma != 1.0:
                v = v * cfg.pathway_gamma  # ours stores W_down x gamma (`orl.model.pathway`)
            out["residual_pathway." + _SELF_COND.get(rest, rest)] = v
        elif k.startswith("layers."):
            _, i, rest = k.split(".", 2)
            if rest == "layer_scalar":
                continue
            out[f"model.layers.{i}.{_LAYER_RENAME.get(rest, rest)}"] = v
        else:
            out["model." + k] = v
    for i in range(cfg.num_layers):  # one scalar per mode; a checkpoint with one copy serves both
        s_enc, s_dec = enc.get(f"layers.{i}.layer_scalar"), dec.get(f"layers.{i}.layer_scalar")
        if s_enc is not None or s_dec is not None:
            out[f"model.layers.{i}.layer_scalar"] = s_enc if s_enc is not None else s_dec
            out[f"model.layers.{i}.canvas_layer_scalar"] = s_dec if s_dec is not None else s_enc
    if not cfg.tie_embeddings and "lm_head.weight" in state:
        out["lm_head.weight"] = state["lm_head.weight"]
    return out


def ours_to_dgemma(cfg: ModelConfig, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF DiffusionGemma names for our state dict: the text tensors ``save_pretrained`` of
    ``DiffusionGemmaForBlockDiffusion`` writes (``model.decoder.*`` plus the encoder's
    ``layer_scalar`` copies; no vision tower). Inverse of `dgemma_to_ours`."""
    back_layer = {v: k for k, v in _LAYER_RENAME.items()}
    back_sc = {v: k for k, v in _SELF_COND.items()}
    out = {}
    for k, v in state.items():
        if k.startswith("residual_pathway."):
            rest = k[len("residual_pathway."):]
            if rest == "mlp.down_proj.weight" and cfg.pathway_gamma != 1.0:
                v = v / cfg.pathway_gamma  # the function's weight (exact for a power-of-two gamma)
            out[DEC + "self_conditioning." + back_sc.get(rest, rest)] = v
        elif k.startswith("model.layers."):
            _, _, i, rest = k.split(".", 3)
            if rest == "layer_scalar":
                out[f"{ENC}layers.{i}.layer_scalar"] = v
            elif rest == "canvas_layer_scalar":
                out[f"{DEC}layers.{i}.layer_scalar"] = v
            else:
                out[f"{DEC}layers.{i}.{back_layer.get(rest, rest)}"] = v
        elif k.startswith("model."):
            out[DEC + k[len("model."):]] = v
        elif k == "lm_head.weight" and not cfg.tie_embeddings:
            out[k] = v
    return out


DGEMMA = register(Format("dgemma", config_from_dgemma, dgemma_to_ours, config_to=config_to_dgemma,
                         from_ours=ours_to_dgemma, generation=generation_dgemma, family="dgemma",
                         diffusion=(("block_size", "canvas_length"),), pathway_native=True),
                  "diffusion_gemma", "diffusion_gemma_text")
