"""Reference forward of a LLaDA-2.x (``llada2_moe``) model, for parity tests (NOT a test file: no
``test_*`` functions). Written from the published architecture (inclusionAI's
``modeling_llada2_moe.py``: a Ling / Bailing-MoE decoder), in plain torch over a dict of tensors
under the checkpoint's own names; nothing here imports ``orl``.

  h = word_embeddings[ids]
  per layer i:  a = input_layernorm(h)
                q, k, v = split(query_key_value(a)) into H, Hkv, Hkv heads of hd
                q, k = query_layernorm(q), key_layernorm(k)         (RMSNorm over hd, per head)
                q, k = NeoX partial RoPE on dims [0, r), r = int(hd * partial_rotary_factor):
                       rotate-half within those r dims, inv_freq_j = theta^(-2j/r); dims [r, hd) pass
                h = h + dense(softmax(q k^T / sqrt(hd) + mask) v)   (GQA: kv head of q head = h // (H/Hkv))
                b = post_attention_layernorm(h)
                h = h + (mlp(b) if i < first_k_dense_replace else moe(b))
  logits = lm_head(norm(h))  (no shift: position t predicts token t)
  mlp(x) = down(silu(gate(x)) * up(x))
  moe(x) = sum_j w_j expert_{e_j}(x) + shared_experts(x), the router in float32:
           s = sigmoid(x W^T) (``score_function`` "softmax": softmax(x W^T)), experts chosen by the
           top-k of s + expert_bias within the top ``topk_group`` of ``n_group`` groups (a group
           scores the sum of its two best), w = s at the chosen experts, divided by their sum when
           k > 1 (and ``norm_topk_prob``), times ``routed_scaling_factor``.
Everything runs in float64 here, so the reference's own rounding is far below the tolerance.
"""
from __future__ import annotations

import json
import math
import os

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

# the tiny config of the parity tests: a router our MoE can express (softmax, every group kept,
# zero bias, scale 1), partial RoPE 0.5, biased fused QKV, one dense layer, one shared expert
TINY = dict(
    model_type="llada2_moe", architectures=["LLaDA2MoeModelLM"], vocab_size=96, hidden_size=64,
    intermediate_size=96, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    hidden_act="silu", use_qkv_bias=True, use_bias=False, use_qk_norm=True, norm_head=False, rms_norm_eps=1e-6,
    tie_word_embeddings=False, max_position_embeddings=512, rope_theta=10_000.0, rope_scaling=None,
    partial_rotary_factor=0.5, use_sliding_window=False, num_experts=4, num_shared_experts=1,
    num_experts_per_tok=2, moe_intermediate_size=32, first_k_dense_replace=1, n_group=2, topk_group=2,
    routed_scaling_factor=1.0, score_function="softmax", norm_topk_prob=True, moe_router_enable_expert_bias=True,
    mask_token_id=95, block_size=8)


def _hd(c: dict) -> int:
    return c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]


def random_state(c: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """Seeded float32 weights under LLaDA-2.x names: linear N(0, 1/sqrt(in)), norms U(0.5, 1.5),
    embeddings N(0, 1), biases N(0, 0.1), router N(0, 1), expert_bias zero."""
    g = torch.Generator().manual_seed(seed)
    D, H, Hkv, hd, V = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], _hd(c), c["vocab_size"]

    def lin(o, i):
        return torch.randn(o, i, generator=g) / math.sqrt(i)

    def norm(n):
        return 0.5 + torch.rand(n, generator=g)

    s = {"model.word_embeddings.weight": torch.randn(V, D, generator=g), "model.norm.weight": norm(D)}
    if not c.get("tie_word_embeddings"):
        s["lm_head.weight"] = lin(V, D)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        s[p + "input_layernorm.weight"], s[p + "post_attention_layernorm.weight"] = norm(D), norm(D)
        s[p + "attention.query_key_value.weight"] = lin((H + 2 * Hkv) * hd, D)
        if c.get("use_qkv_bias"):
            s[p + "attention.query_key_value.bias"] = 0.1 * torch.randn((H + 2 * Hkv) * hd, generator=g)
        if c.get("use_qk_norm", True):
            s[p + "attention.query_layernorm.weight"], s[p + "attention.key_layernorm.weight"] = norm(hd), norm(hd)
        s[p + "attention.dense.weight"] = lin(D, H * hd)
        mlps = []
        if c.get("num_experts") and i >= c.get("first_k_dense_replace", 0):
            E, I = c["num_experts"], c["moe_intermediate_size"]
            s[p + "mlp.gate.weight"] = torch.randn(E, D, generator=g)
            s[p + "mlp.gate.expert_bias"] = torch.zeros(E)
            mlps = [(f"mlp.experts.{e}.", I) for e in range(E)]
            if c.get("num_shared_experts"):
                mlps.append(("mlp.shared_experts.", I * c["num_shared_experts"]))
        else:
            mlps = [("mlp.", c["intermediate_size"])]
        for q, I in mlps:
            s[p + q + "gate_proj.weight"], s[p + q + "up_proj.weight"] = lin(I, D), lin(I, D)
            s[p + q + "down_proj.weight"] = lin(D, I)
    return s


def write_checkpoint(path: str, c: dict, state: dict[str, torch.Tensor]) -> None:
    """A LLaDA-2.x checkpoint directory: config.json + model.safetensors."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(c, f, indent=1)
    save_file({k: v.contiguous() for k, v in state.items()}, os.path.join(path, "model.safetensors"))


def _rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x, pos, r, theta):
    """NeoX partial rotary: x (B, H, T, hd); rotate-half within the first r dims."""
    inv = 1.0 / theta ** (torch.arange(0, r, 2, dtype=torch.float64) / r)
    f = pos.double()[:, None] * inv  # (T, r/2)
    cos, sin = torch.cat([f, f], -1).cos(), torch.cat([f, f], -1).sin()
    rot, rest = x[..., :r], x[..., r:]
    a, b = rot[..., : r // 2], rot[..., r // 2:]
    return torch.cat([rot * cos + torch.cat([-b, a], -1) * sin, rest], -1)


def _mlp(s, p, x):
    return F.linear(F.silu(F.linear(x, s[p + "gate_proj.weight"])) * F.linear(x, s[p + "up_proj.weight"]),
                    s[p + "down_proj.weight"])


def _route(s, p, x, c):
    """Expert ids (N, k) and weights (N, k) of tokens x (N, D)."""
    E, k = c["num_experts"], c["num_experts_per_tok"]
    logits = F.linear(x, s[p + "gate.weight"])
    scores = logits.softmax(-1) if c.get("score_function", "sigmoid") == "softmax" else logits.sigmoid()
    choice = scores + s[p + "gate.expert_bias"]
    G, Gk = c.get("n_group", 8) or 1, c.get("topk_group", 4) or 1
    groups = choice.view(-1, G, E // G).topk(min(2, E // G), -1).values.sum(-1)  # (N, G)
    keep = torch.zeros_like(groups, dtype=torch.bool).scatter_(1, groups.topk(min(Gk, G), -1).indices, True)
    choice = choice.masked_fill(~keep.repeat_interleave(E // G, 1), float("-inf"))
    idx = choice.topk(k, -1).indices
    w = scores.gather(1, idx)
    if k > 1 and c.get("norm_topk_prob", True):
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    return idx, w * c.get("routed_scaling_factor", 2.5)


def _moe(s, p, x, c):
    B, T, D = x.shape
    x2 = x.reshape(-1, D)
    idx, w = _route(s, p + "mlp.", x2, c)
    y = torch.zeros_like(x2)
    for n in range(x2.shape[0]):
        for j in range(idx.shape[1]):
            y[n] += w[n, j] * _mlp(s, p + f"mlp.experts.{int(idx[n, j])}.", x2[n])
    if c.get("num_shared_experts"):
        y = y + _mlp(s, p + "mlp.shared_experts.", x2)
    return y.view(B, T, D)


@torch.no_grad()
def logits(c: dict, state: dict[str, torch.Tensor], ids: torch.Tensor, mask: torch.Tensor | None = None,
           positions: torch.Tensor | None = None) -> torch.Tensor:
    """Logits (B, T, V) float32 of ids (B, T); mask (T, T) bool, True = visible (None: causal);
    positions (T,) (None: 0..T-1)."""
    s = {k: v.double() for k, v in state.items()}
    B, T = ids.shape
    H, Hkv, hd = c["num_attention_heads"], c["num_key_value_heads"], _hd(c)
    eps, r = c.get("rms_norm_eps", 1e-5), int(hd * c.get("partial_rotary_factor", 0.5))
    pos = torch.arange(T) if positions is None else positions
    vis = torch.ones(T, T, dtype=torch.bool).tril() if mask is None else mask
    h = s["model.word_embeddings.weight"][ids]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = _rms(h, s[p + "input_layernorm.weight"], eps)
        qkv = F.linear(a, s[p + "attention.query_key_value.weight"], s.get(p + "attention.query_key_value.bias"))
        q, k, v = qkv.view(B, T, H + 2 * Hkv, hd).split([H, Hkv, Hkv], dim=2)
        if c.get("use_qk_norm", True):
            q = _rms(q, s[p + "attention.query_layernorm.weight"], eps)
            k = _rms(k, s[p + "attention.key_layernorm.weight"], eps)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, heads, T, hd)
        q, k = _rope(q, pos, r, c.get("rope_theta", 10_000.0)), _rope(k, pos, r, c.get("rope_theta", 10_000.0))
        k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        att = att.masked_fill(~vis, float("-inf")).softmax(-1)
        o = (att @ v).transpose(1, 2).reshape(B, T, H * hd)
        h = h + F.linear(o, s[p + "attention.dense.weight"])
        b = _rms(h, s[p + "post_attention_layernorm.weight"], eps)
        moe = c.get("num_experts") and i >= c.get("first_k_dense_replace", 0)
        h = h + (_moe(s, p, b, c) if moe else _mlp(s, p + "mlp.", b))
    h = _rms(h, s["model.norm.weight"], eps)
    head = s["model.word_embeddings.weight"] if c.get("tie_word_embeddings") else s["lm_head.weight"]
    return F.linear(h, head).float()
