"""Up-front checks of a run's config: every field's type, range and allowed values, named by its path.

`validate(cfg)` walks a config dataclass (`ORLConfig`, `SFTConfig`, `RFTConfig` and the ones inside
them: `LossConfig`, `DecodeConfig`, `SFTStage`) and raises one ValueError listing every field
that is of the wrong type ("batch_size must be an int (got 'abc')"), out of range ("save_every
must be >= 1 (got 0)") or not one of its allowed values ("loss.gate must be one of 'hard',
'soft', 'none' (got 'bogus')"), before any model is built. `apply_overrides` calls it, so every
`orl` command that takes a recipe checks the config it will run before it starts work; tests
check that every recipe passes.

The ranges are the ones the loops assume (a division by ``save_every``, ``max()`` over a batch of
``batch_size`` rows, ``group_size`` rollouts per prompt); they live in one table here, beside the
allowed values the loops switch on, so all limits read at a glance.
Does not own: what the fields mean (the configs' own modules), parsing ``--set`` strings
(`orl.recipes.overrides`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .overrides import check_type, describe, field_types, set_fields, task_options


def apply_overrides(cfg, sets: list[str], validate_config: bool = True):
    """Apply ``key.path=value`` strings to ``cfg`` in place (`orl.recipes.overrides.set_fields`),
    then check the whole config (`validate`, unless ``validate_config=False``); returns cfg.
    Unknown keys, values of the wrong type and values out of range raise ValueError naming the field."""
    set_fields(cfg, sets)
    if validate_config:
        validate(cfg)
    return cfg


@dataclass(frozen=True)
class Range:
    """lo <= x <= hi (``open_lo``: lo < x); None is unbounded."""

    lo: float | None = None
    hi: float | None = None
    open_lo: bool = False

    def holds(self, x) -> bool:
        if self.lo is not None and (x <= self.lo if self.open_lo else x < self.lo):
            return False
        return self.hi is None or x <= self.hi

    def __str__(self) -> str:
        if self.hi is None:
            return f"{'>' if self.open_lo else '>='} {self.lo:g}"
        return f"in {'(' if self.open_lo else '['}{self.lo:g}, {self.hi:g}]"


AT_LEAST_1, AT_LEAST_0, POSITIVE, FRACTION = Range(1), Range(0), Range(0, open_lo=True), Range(0, 1)
SCHEDULES = ("constant", "linear")          # orl.train.loop.lr_factor
WEIGHTINGS = ("elbo", "flat")               # orl.train.noise.sft_loss


def _rules() -> dict[type, dict[str, Range | tuple]]:
    """Config type -> field -> a Range or the tuple of allowed values (None allowed where the field is
    Optional: the type check covers it)."""
    from ..decode.config import RULES, DecodeConfig  # noqa: PLC0415
    from ..model.config import FAMILIES  # noqa: PLC0415
    from ..train.loop import ORLConfig  # noqa: PLC0415
    from ..train.losses import LossConfig  # noqa: PLC0415
    from ..train.rft import RFTConfig  # noqa: PLC0415
    from ..train.sft import SFTConfig, SFTStage  # noqa: PLC0415
    run = {"steps": AT_LEAST_1, "prompts_per_step": AT_LEAST_1, "group_size": AT_LEAST_1, "lr": POSITIVE,
           "warmup": AT_LEAST_0, "lr_schedule": SCHEDULES, "lr_final": AT_LEAST_0, "weight_decay": AT_LEAST_0,
           "grad_clip": POSITIVE, "eval_every": AT_LEAST_0, "eval_n": AT_LEAST_1, "save_every": AT_LEAST_1}
    return {
        ORLConfig: {**run, "states_per_response": AT_LEAST_1, "max_row_tokens": AT_LEAST_1,
                    "topk_stats": AT_LEAST_1, "stale_every": AT_LEAST_1, "max_prompt_tokens": AT_LEAST_1,
                    "micro_batch_tokens": AT_LEAST_0, "log_every": AT_LEAST_1,
                    "pack_mode": ("packed", "per_response", "per_state"),      # orl.train.pack.pack
                    "rollout_engine": ("auto", "runtime", "reference"), "rollout_sampler": ("auto", "torch", "triton"),
                    "rollout_rng": ("torch", "counter"), "rollout_dtype": ("float32", "bfloat16", "float16"),
                    "precision": ("fp32", "bf16"), "anchor_dtype": ("float32", "bfloat16"),
                    "replay_attention": ("dense", "flex", "triton"), "replay_head": ("all", "states")},
        RFTConfig: {**run, "weighting": WEIGHTINGS},
        SFTConfig: {"batch_size": AT_LEAST_1, "weight_decay": AT_LEAST_0, "grad_clip": POSITIVE,
                    "save_every": AT_LEAST_1, "log_every": AT_LEAST_1, "threads": AT_LEAST_1,
                    "weighting": WEIGHTINGS, "family": FAMILIES, "eval_n": AT_LEAST_0, "eval_every": AT_LEAST_0},
        SFTStage: {"steps": AT_LEAST_1, "lr": POSITIVE, "block_size": AT_LEAST_1, "selfcond": FRACTION,
                   "warmup": AT_LEAST_0, "min_lr_ratio": FRACTION},
        LossConfig: {"supervise": ("unresolved", "committed"), "gate": ("hard", "soft", "none"),
                     "gate_tau": FRACTION, "rho": FRACTION, "lambda_aec": AT_LEAST_0,
                     "anchor": ("frozen", "rollout", "none"), "lambda_kl": AT_LEAST_0, "kl_cap": POSITIVE,
                     "kl_gate_tau": FRACTION},
        DecodeConfig: {"rule": RULES, "block_size": AT_LEAST_1, "steps": AT_LEAST_1, "max_new_tokens": AT_LEAST_1,
                       "temperature": AT_LEAST_0, "top_p": Range(0, 1, open_lo=True),
                       "threshold": FRACTION, "edit_threshold": FRACTION,
                       "max_post_steps": AT_LEAST_0, "entropy_bound": AT_LEAST_0, "t_min": AT_LEAST_0,
                       "t_max": AT_LEAST_0, "stability_threshold": AT_LEAST_1, "confidence_threshold": AT_LEAST_0,
                       "residual_temperature": POSITIVE},
    }


def problems(cfg, path: str = "") -> list[str]:
    """Every problem of ``cfg`` (a config dataclass) and the dataclasses inside it, one line each."""
    if not dataclasses.is_dataclass(cfg):
        return []
    rules = _rules().get(type(cfg), {})
    out = []
    for name, tp in field_types(type(cfg)).items():
        where, value = f"{path}{name}", getattr(cfg, name)
        if not check_type(value, tp):
            out.append(f"{where} must be {describe(tp)} (got {value!r})")
            continue
        rule = rules.get(name)
        if value is not None and isinstance(rule, Range) and not rule.holds(value):
            out.append(f"{where} must be {rule} (got {value!r})")
        elif value is not None and isinstance(rule, tuple) and value not in rule:
            out.append(f"{where} must be one of {', '.join(map(repr, rule))} (got {value!r})")
        if dataclasses.is_dataclass(value):
            out += problems(value, f"{where}.")
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if dataclasses.is_dataclass(item):
                    out += problems(item, f"{where}.{i}.")
    return out + _cross_checks(cfg, path, fields_ok=not out)


def _cross_checks(cfg, path: str, fields_ok: bool) -> list[str]:
    """What one field alone cannot say: DecodeConfig's own __post_init__ rules (which setattr skips;
    run once its fields passed, e.g. top_p < 1 with the dgemma rule), a staged run needs a stage,
    task options the task takes, a named size that exists."""
    from ..decode.config import DecodeConfig  # noqa: PLC0415
    from ..model.config import SIZES  # noqa: PLC0415
    out = []
    if isinstance(cfg, DecodeConfig) and fields_ok:
        try:
            dataclasses.replace(cfg)
        except (ValueError, TypeError) as e:
            out.append(f"{path.rstrip('.') or 'decode'}: {e}")
    if isinstance(getattr(cfg, "stages", None), list) and not cfg.stages:
        out.append(f"{path}stages must hold at least one stage (got [])")
    family, size = getattr(cfg, "family", None), getattr(cfg, "size", None)
    if isinstance(size, str) and family in SIZES and not getattr(cfg, "init", None) and size not in SIZES[family]:
        out.append(f"{path}size must be one of {', '.join(map(repr, sorted(SIZES[family])))} for family "
                   f"{family!r} (got {size!r})")
    task, kwargs = getattr(cfg, "task", None), getattr(cfg, "task_kwargs", None)
    options = task_options(task) if isinstance(task, str) and isinstance(kwargs, dict) else None
    if options is not None:
        for key, value in kwargs.items():
            if key not in options:
                out.append(f"{path}task_kwargs.{key}: task {task!r} takes no option {key!r}; it takes: "
                           f"{', '.join(sorted(options))}")
            elif not check_type(value, options[key]):
                out.append(f"{path}task_kwargs.{key} must be {describe(options[key])} (got {value!r})")
    return out


def validate(cfg):
    """Raise ValueError listing every problem of ``cfg``; return ``cfg`` when there is none."""
    found = problems(cfg)
    if found:
        kind = type(cfg).__name__
        raise ValueError(f"invalid {kind}: " + found[0] if len(found) == 1 else
                         f"invalid {kind} ({len(found)} problems):\n  " + "\n  ".join(found))
    return cfg
