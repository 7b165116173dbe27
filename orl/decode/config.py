"""Decoding protocols: one dataclass, and the named protocol of each family and role.

Owns the numbers a decode depends on (rule, block size, thresholds, steps, temperature, token
budget) so that every output file can print them in its header. ``role="base"`` selects the
family's published base protocol, ``role="orl"`` the protocol ORL models are evaluated with
(docs/method.md 1.4, 3.7: same native sampler, pathway active).
Does not own: the decode loop (`orl.decode.block`) or the acceptance rules (`orl.decode.samplers`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

RULES = ("threshold", "topk", "entropy", "llada", "dgemma")
ROLES = ("base", "orl")


@dataclass
class DecodeConfig:
    rule: str = "threshold"          # see RULES
    block_size: int = 32             # K (canvas length)
    steps: int | None = None         # max denoising steps per block; quota = K / steps (None: K)
    threshold: float = 0.9           # threshold / llada mask->token threshold
    edit_threshold: float = 0.9      # llada token->token editing
    max_post_steps: int = 16         # llada editing-only steps after the block is filled
    entropy_bound: float = 0.35      # "entropy" rule: cumulative entropy bound; dgemma: 0.1
    temperature: float = 0.0         # 0 = greedy
    top_p: float = 1.0               # nucleus sampling (temperature > 0, mask rules): 1.0 = the whole distribution
    t_min: float = 0.4               # dgemma temperature schedule
    t_max: float = 0.8
    stability_threshold: int = 1     # dgemma early stop: argmax canvas unchanged this many steps
    confidence_threshold: float = 0.005  # ... and mean normalised entropy below this
    max_new_tokens: int = 256
    residual: bool = True            # feed the residual pathway (when the model has one)
    residual_temperature: float = 1.0  # distribution used for z (1.0: the raw softmax)
    use_cache: bool = True
    stop_at_eos: bool = True

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise ValueError(f"unknown decode rule {self.rule!r}; choose one of {RULES}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"steps must be >= 1 or None, got {self.steps}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_p < 1 and self.rule == "dgemma":
            raise ValueError("top_p applies to the mask rules' sampling; DiffusionGemma's rule samples its own "
                             "temperature schedule (leave top_p at 1.0)")

    @property
    def max_steps(self) -> int:
        if self.steps is not None:
            return self.steps
        return 48 if self.rule == "dgemma" else self.block_size

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# Published protocols (docs/method.md 1.4): SDAR dynamic threshold 0.9 with steps = K; LLaDA-2.1
# threshold 0.95 + editing 0.9 at block 32 (dllm defaults); DiffusionGemma EB bound 0.1, 48 steps,
# T 0.8 -> 0.4, canvas 256. ORL keeps each family's sampler (3.7).
_PROTOCOLS: dict[tuple[str, str], dict] = {
    ("sdar", "base"): dict(rule="threshold", block_size=32, threshold=0.9),
    ("sdar", "orl"): dict(rule="threshold", block_size=32, threshold=0.9),
    ("llada", "base"): dict(rule="llada", block_size=32, threshold=0.95, edit_threshold=0.9),
    ("llada", "orl"): dict(rule="llada", block_size=32, threshold=0.95, edit_threshold=0.9),
    ("dgemma", "base"): dict(rule="dgemma", block_size=256, entropy_bound=0.1, temperature=0.8),
    ("dgemma", "orl"): dict(rule="dgemma", block_size=256, entropy_bound=0.1, temperature=0.8),
}


def protocol(family: str, role: str = "base", **overrides) -> DecodeConfig:
    """The named protocol of ``family`` and ``role``, with field overrides."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; choose one of {ROLES}")
    key = (family, role)
    if key not in _PROTOCOLS:
        raise ValueError(f"no decoding protocol for family {family!r}; families: "
                         f"{sorted({f for f, _ in _PROTOCOLS})}")
    fields = {**_PROTOCOLS[key], **overrides}
    unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(DecodeConfig)})
    if unknown:
        raise ValueError(f"unknown decode fields {unknown}")
    return DecodeConfig(**fields)
