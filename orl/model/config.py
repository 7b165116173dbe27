"""Model configuration: one dataclass for every family, plus the named sizes.

Owns: `ModelConfig` (architecture, noise kind, residual pathway), the table of named sizes
(`tiny` for each family and the real shapes), and lookup with errors a user can act on.
Does not own: weights, HF key mapping (`orl.model.checkpoint`), decoding protocols (`orl.decode.config`).

Families (docs/method.md 1.2, 1.4, 2.2):
  sdar   -- Qwen3 backbone, mask-token block diffusion (QwenDLM / SDAR style).
  llada  -- LLaDA-2.1-mini style MoE (top-k + shared expert; the named sizes route by softmax, a
            loaded LLaDA-2.x checkpoint by its sigmoid / expert-bias / group-limited gate: the
            ``router_*`` fields), mask-token block diffusion, threshold + editing decoder.
  dgemma -- DiffusionGemma style (Gemma options), uniform-state diffusion on a canvas,
            entropy-bounded sampler, self-conditioning pathway with post-norm.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

FAMILIES = ("sdar", "llada", "dgemma")


@dataclass
class ModelConfig:
    family: str = "sdar"
    vocab_size: int = 151_936
    hidden_size: int = 2560
    num_layers: int = 36
    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    intermediate_size: int = 9728
    rope_theta: float = 1_000_000.0
    rms_eps: float = 1e-6
    max_position: int = 40_960
    tie_embeddings: bool = True
    qk_norm: bool = True
    attention_bias: bool = False
    hidden_act: str = "silu"                 # "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
    # --- Gemma-style options ---
    embed_scale: float = 1.0                 # Gemma multiplies embeddings by sqrt(D)
    norm_offset: float = 0.0                 # RMSNorm weight used as (offset + w); Gemma<=3: 1.0
    sandwich_norm: bool = False              # post-attention / post-MLP norms (Gemma)
    v_norm: bool = False                     # scale-free RMSNorm on values (Gemma 4)
    attn_scale: float | None = None          # None: head_dim ** -0.5 (DiffusionGemma: 1.0)
    final_logit_softcap: float | None = None  # logits = c tanh(logits / c), computed in float32
    layer_scalar: bool = False               # Gemma 4: a (1,) buffer scales the whole stream after each layer
    sliding_window: int | None = None        # W; see `layer_types` and `Transformer.forward` for the rule
    layer_types: list[str] | None = None     # per layer: "full" or "sliding"
    # --- per-layer-type attention (Gemma 4): "full" layers may differ from "sliding" ones ---
    # head_dim / num_kv_heads / rope_theta above describe every layer unless overridden here for
    # the "full" layers. None = same as above.
    full_head_dim: int | None = None         # DiffusionGemma global_head_dim
    full_num_kv_heads: int | None = None     # DiffusionGemma num_global_key_value_heads
    full_rope_theta: float | None = None
    full_rotary_fraction: float = 1.0        # "proportional" RoPE: int(f * hd // 2) frequency pairs
                                             # rotate (dims [0,n) and [hd/2, hd/2+n)), freqs over hd
    full_k_eq_v: bool = False                # full layers have no v_proj: V = (raw) k_proj(x)
    # --- mixture of experts (0 experts = dense) ---
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    first_dense_layers: int = 0
    router_norm_topk: bool = True
    # The router's rule (`orl.model.layers.MoE.route`). The defaults are the plain router: softmax
    # scores, the top-k of them, renormalised if router_norm_topk. LLaDA-2.x's published gate
    # (DeepSeek-V3's "noaux_tc" rule): sigmoid scores, a (E,) expert bias added for the choice only,
    # the choice limited to the best router_topk_groups of router_groups equal groups of experts (a
    # group scores the sum of its two best), weights = the chosen scores without the bias,
    # renormalised if router_norm_topk, times router_scaling.
    router_score: str = "softmax"            # "softmax" | "sigmoid"
    router_bias: bool = False                # a learned expert_bias (E,) buffer, for the choice only
    router_groups: int = 1                   # n_group: E / router_groups experts per group
    router_topk_groups: int = 1              # topk_group: groups kept (= router_groups: no limit)
    router_scaling: float = 1.0              # routed_scaling_factor, on the final weights
    # Gemma 4 / DiffusionGemma MoE: every MoE layer also runs the dense MLP (intermediate_size) in
    # parallel, each branch with its own pre/post norms, and the router reads the raw residual as
    # proj(rms0(x) * scale * D^-1/2), its renormalised top-k weights times a per-expert scale.
    parallel_dense_mlp: bool = False
    router_scale: bool = False
    # --- diffusion ---
    noise: str = "mask"                      # "mask" (SDAR, LLaDA) or "uniform" (DiffusionGemma)
    mask_token_id: int | None = 151_669
    block_size: int = 32                     # block / canvas length K
    clean_attention: str = "block"           # committed text attends "block"-causally or "causal"
    # --- residual pathway (docs/method.md 2.1-2.3) ---
    pathway: str = "none"                    # "none" | "mlp" (E[x] + alpha g(z)) | "rcd"
    pathway_alpha: float = 1.0
    pathway_gamma: float = 1.0               # output stored x gamma, used x 1/gamma (2.3 reading a)
    pathway_intermediate: int = 0            # 0: hidden_size
    pathway_post_norm: bool = False          # DiffusionGemma: RMSNorm_noscale(E[x] + u)
    pathway_where: str = "unresolved"        # "unresolved" or "canvas" (every block position)
    extra: dict = field(default_factory=dict)
    # --- where the weights came from (not part of the architecture: ignored by ==) ---
    # The family-format JSON files a checkpoint was loaded from ({"config.json": {...},
    # "generation_config.json": {...}}), so that saving writes the same format back with the fields
    # orl does not model (model_type, architectures, auto_map, token ids). None: the family's default
    # format (docs/formats.md; `orl.model.checkpoint`).
    source: dict | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"unknown family {self.family!r}; choose one of {FAMILIES}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} must be a multiple of num_kv_heads {self.num_kv_heads}")
        if self.noise not in ("mask", "uniform"):
            raise ValueError(f"noise must be 'mask' or 'uniform', got {self.noise!r}")
        if self.noise == "mask" and self.mask_token_id is None:
            raise ValueError("mask-token diffusion needs mask_token_id (take it from the tokenizer)")
        if self.pathway not in ("none", "mlp", "rcd"):
            raise ValueError(f"pathway must be 'none', 'mlp' or 'rcd', got {self.pathway!r}")
        if self.clean_attention not in ("block", "causal"):
            raise ValueError(f"clean_attention must be 'block' or 'causal', got {self.clean_attention!r}")
        if self.layer_types is None:
            self.layer_types = ["full"] * self.num_layers
        if len(self.layer_types) != self.num_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries for {self.num_layers} layers")
        bad = sorted(set(self.layer_types) - {"full", "sliding"})
        if bad:
            raise ValueError(f"layer_types may only contain 'full' and 'sliding', got {bad}")
        if "sliding" in self.layer_types and not self.sliding_window:
            raise ValueError("'sliding' layers need sliding_window (the window W in tokens)")
        for i in range(self.num_layers):
            if self.num_heads % self.layer_kv_heads(i):
                raise ValueError(f"layer {i}: num_heads {self.num_heads} must be a multiple of its "
                                 f"{self.layer_kv_heads(i)} KV heads")
        if self.parallel_dense_mlp and not (self.is_moe and self.sandwich_norm):
            raise ValueError("parallel_dense_mlp (Gemma 4) needs experts (num_experts > 0) and sandwich_norm=True")
        self._check_router()

    def _check_router(self) -> None:
        if self.router_score not in ("softmax", "sigmoid"):
            raise ValueError(f"router_score must be 'softmax' or 'sigmoid', got {self.router_score!r}")
        G, Gk = self.router_groups, self.router_topk_groups
        if not 1 <= Gk <= G:
            raise ValueError(f"router_topk_groups {Gk} must be in [1, router_groups {G}]")
        if not self.router_plain and not self.is_moe:
            raise ValueError("the router fields (router_score, router_bias, router_groups, router_topk_groups, "
                             "router_scaling) describe a MoE router: set num_experts > 0 or leave them at their "
                             "defaults")
        if not self.is_moe:
            return
        E, k = self.num_experts, self.num_experts_per_tok
        if E % G:
            raise ValueError(f"router_groups {G} must divide num_experts {E} (equal groups of experts)")
        if not 1 <= k <= Gk * (E // G):
            raise ValueError(f"num_experts_per_tok {k} must be in [1, {Gk * (E // G)}]: the {Gk} kept of "
                             f"{G} groups hold {Gk * (E // G)} experts")
        if self.router_scale and not self.router_plain:
            raise ValueError("router_scale (the Gemma 4 router) is softmax top-k: it does not combine with "
                             "router_score='sigmoid', router_bias, group-limited routing or router_scaling")

    @property
    def router_plain(self) -> bool:
        """The plain router (softmax top-k, no bias, no group limit, no scaling): the defaults."""
        return (self.router_score == "softmax" and not self.router_bias and self.router_scaling == 1.0
                and self.router_topk_groups == self.router_groups)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    # Per-layer attention shape: "full" layers may override head_dim / KV heads / RoPE (Gemma 4).
    def _full(self, i: int) -> bool:
        return self.layer_types[i] == "full"

    def layer_head_dim(self, i: int) -> int:
        return self.full_head_dim if self._full(i) and self.full_head_dim else self.head_dim

    def layer_kv_heads(self, i: int) -> int:
        return self.full_num_kv_heads if self._full(i) and self.full_num_kv_heads else self.num_kv_heads

    def layer_k_eq_v(self, i: int) -> bool:
        return self.full_k_eq_v and self._full(i)

    def layer_rope(self, kind: str) -> tuple[int, float, int]:
        """(head_dim, theta, rotary_dim) of layer type ``kind``; rotary_dim < head_dim means the
        proportional partial rotation of `layers.rope_cos_sin`."""
        if kind == "full":
            hd = self.full_head_dim or self.head_dim
            theta = self.full_rope_theta if self.full_rope_theta is not None else self.rope_theta
            return hd, theta, 2 * int(self.full_rotary_fraction * hd // 2)
        return self.head_dim, self.rope_theta, self.head_dim

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown model config fields {unknown}; known fields: {sorted(known)}")
        return cls(**d)

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=2)

    def param_count(self, active: bool = False) -> int:
        """Parameters (or parameters one token touches, ``active=True``), from shapes alone
        (projection matrices and embeddings; norms, scales and the residual pathway not counted)."""
        D = self.hidden_size
        attn = 0
        for i in range(self.num_layers):
            hd, kv = self.layer_head_dim(i), self.layer_kv_heads(i)
            attn += D * hd * (self.num_heads + (1 if self.layer_k_eq_v(i) else 2) * kv) + self.num_heads * hd * D
        dense_mlp = 3 * D * self.intermediate_size
        n_moe = self.num_layers - self.first_dense_layers if self.is_moe else 0
        e = self.num_experts_per_tok if active else self.num_experts
        moe_mlp = 3 * D * self.moe_intermediate_size * (e + self.num_shared_experts) + D * self.num_experts
        if self.parallel_dense_mlp:
            moe_mlp += dense_mlp
        body = attn + (self.num_layers - n_moe) * dense_mlp + n_moe * moe_mlp
        emb = self.vocab_size * D * (1 if self.tie_embeddings else 2)
        return body + emb


# DiffusionGemma (docs/diffusiongemma-spec.md): every Gemma-4 option on; sizes come on top.
DGEMMA_OPTIONS = dict(
    hidden_act="gelu_tanh", rope_theta=10_000.0, sandwich_norm=True, v_norm=True, attn_scale=1.0,
    final_logit_softcap=30.0, layer_scalar=True, full_rope_theta=1_000_000.0, full_rotary_fraction=0.25,
    full_k_eq_v=True, parallel_dense_mlp=True, router_scale=True, noise="uniform", mask_token_id=None,
    clean_attention="causal", pathway_post_norm=True, pathway_where="canvas")


def _tiny(family: str, **kw) -> ModelConfig:
    base = dict(family=family, vocab_size=64, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                head_dim=16, intermediate_size=128, max_position=512, block_size=8, mask_token_id=3,
                rope_theta=10_000.0, pathway="mlp", pathway_intermediate=64)
    base.update(kw)
    return ModelConfig(**base)


# Real shapes are from the public config.json files (Qwen3-4B / SDAR-4B; LLaDA2.x-mini = Ling-mini-2.0
# shape; DiffusionGemma 26B-A4B = Gemma-4 26B-A4B shape). Benchmarks build them with random weights.
SIZES: dict[str, dict[str, ModelConfig]] = {
    "sdar": {
        "tiny": _tiny("sdar"),
        # the embedded demo's model (~1M parameters): trains on a laptop CPU in minutes
        "small": _tiny("sdar", hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=32,
                       intermediate_size=384, block_size=16, pathway_intermediate=128),
        # the larger run of the same recipe on a GPU (~11M parameters)
        "medium": _tiny("sdar", hidden_size=384, num_layers=6, num_heads=6, num_kv_heads=2, head_dim=64,
                        intermediate_size=1152, block_size=16, pathway_intermediate=384),
        # the suite's GPU run (>= 50M parameters: 8 layers of hidden 768, ~55M with the pathway)
        "large": _tiny("sdar", hidden_size=768, num_layers=8, num_heads=12, num_kv_heads=4, head_dim=64,
                       intermediate_size=2304, block_size=16, pathway_intermediate=768),
        # the GPU-scale base of the multi-block family (~100M parameters with the character vocabulary)
        "xl": _tiny("sdar", hidden_size=1024, num_layers=8, num_heads=16, num_kv_heads=4, head_dim=64,
                    intermediate_size=3072, block_size=32, pathway_intermediate=1024),
        "qwen3-4b": ModelConfig(family="sdar", block_size=32, pathway="none"),
        "qwendlm-4b": ModelConfig(family="sdar", block_size=256, pathway="mlp", pathway_intermediate=2560),
    },
    "llada": {
        "tiny": _tiny("llada", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                      num_shared_experts=1, first_dense_layers=1, block_size=8),
        "llada2.1-mini": ModelConfig(
            family="llada", vocab_size=157_184, hidden_size=2048, num_layers=20, num_heads=16, num_kv_heads=4,
            head_dim=128, intermediate_size=5120, rope_theta=600_000.0, max_position=32_768,
            tie_embeddings=False, num_experts=256, num_experts_per_tok=8, moe_intermediate_size=512,
            num_shared_experts=1, first_dense_layers=1, mask_token_id=156_895, block_size=32),
    },
    "dgemma": {
        # the shape of tests/dg_reference.py's tiny HF DiffusionGemma: layers [S, F, S, F]; sliding
        # layers hd 16 / 2 KV heads / RoPE 1e4; full layers hd 32 / 1 KV head / K = V / proportional
        # RoPE 1e6 rotating 1/4; 4 experts top-2 beside a dense MLP; W = 8 < typical prompts.
        "tiny": _tiny("dgemma", **DGEMMA_OPTIONS, vocab_size=256, num_layers=4, layer_types=["sliding", "full"] * 2,
                      sliding_window=8, full_head_dim=32, full_num_kv_heads=1, embed_scale=8.0,
                      num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                      pathway_intermediate=128, block_size=16),
        # google/diffusiongemma-26B-A4B-it = the Gemma-4 26B-A4B shape (hidden 2816, 16 heads, 8 KV
        # heads of 256, dense MLP 2112, 128 experts of 704 top-8, W 1024, 30 layers 5:1, V 262144,
        # canvas 256); param_count() gives 25.2B total / 3.8B active. UNSURE (not read from the real
        # checkpoint): full_head_dim=512 (HF's default global_head_dim), full_num_kv_heads=2 (HF's
        # tensor-parallel comment on gemma-4-26B-A4B), max_position, rope thetas (HF defaults). Load
        # a real config.json with `orl.model.checkpoint.dgemma.config_from_dgemma` instead of trusting this.
        "diffusiongemma-26b-a4b": ModelConfig(
            family="dgemma", **DGEMMA_OPTIONS, vocab_size=262_144, hidden_size=2816, num_layers=30, num_heads=16,
            num_kv_heads=8, head_dim=256, intermediate_size=2112, max_position=131_072,
            embed_scale=2816 ** 0.5, sliding_window=1024,
            layer_types=["sliding" if (i + 1) % 6 else "full" for i in range(30)],
            full_head_dim=512, full_num_kv_heads=2, num_experts=128, num_experts_per_tok=8,
            moe_intermediate_size=704, block_size=256, pathway="mlp", pathway_intermediate=2112),
    },
}


def get_config(family: str, size: str = "tiny", **overrides) -> ModelConfig:
    """The named size of a family, with field overrides; errors list what exists."""
    if family not in SIZES:
        raise ValueError(f"unknown family {family!r}; choose one of {sorted(SIZES)}")
    if size not in SIZES[family]:
        raise ValueError(f"unknown size {size!r} for family {family!r}; choose one of {sorted(SIZES[family])}")
    cfg = dataclasses.replace(SIZES[family][size])
    if "num_layers" in overrides and "layer_types" not in overrides and len(set(cfg.layer_types)) == 1:
        overrides["layer_types"] = None  # a uniform stack stays uniform at the new depth
    return dataclasses.replace(cfg, **overrides) if overrides else cfg


def find_size(name: str) -> ModelConfig:
    """Look a size up by name alone (``qwen3-4b``) or as ``family/size`` (``dgemma/tiny``)."""
    if "/" in name:
        fam, size = name.split("/", 1)
        return get_config(fam, size)
    hits = [(f, name) for f in SIZES if name in SIZES[f]]
    if len(hits) != 1:
        allowed = sorted(f"{f}/{s}" for f in SIZES for s in SIZES[f])
        raise ValueError(f"unknown or ambiguous model size {name!r}; choose one of {allowed}")
    return get_config(*hits[0])
