"""Recipes for the embedded task suite (orl/tasks/suite.py): the SFT of each family's base, and ORL on it.

``suite_sft_<family>`` is the demo's ``arith_sft`` (same `small` model, two stages of 600 + 400 steps,
batch 64, character tokenizer: a few minutes on a laptop CPU) on that family's task, and
``orl_suite_<family>`` is ``orl_arith`` on it; only the task and the decoders' token budget change.
The task knobs are pinned here (as ``arith_sft`` pins its own), so a change of a task's defaults
does not silently change a recipe. Whether a family's base lands where the release's bases sit is
measured by benchmarks/suite_calibrate.py, not by these functions.
"""
from orl.recipes.arith import arith_sft
from orl.recipes.orl_arith import orl_arith
from orl.train.loop import ORLConfig
from orl.train.sft import SFTConfig

# family -> (task kwargs the recipes pin, decoder max_new_tokens: the longest response + EOS, rounded
# up to whole 16-token blocks)
FAMILIES: dict[str, tuple[dict, int]] = {
    "carry_add": (dict(terms=2, digits=4), 48),
    "carry_mul": (dict(digits=3), 48),
    "chain": (dict(steps=5, max_value=99), 48),
    "string": (dict(length=9, rule="perm", table_seed=0), 48),
}


def _sft(family: str, out: str) -> SFTConfig:
    cfg = arith_sft(out)
    cfg.task, cfg.task_kwargs = family, dict(FAMILIES[family][0])
    return cfg


def _orl(family: str, init: str, out: str) -> ORLConfig:
    cfg = orl_arith(init, out)
    cfg.task, cfg.task_kwargs = family, dict(FAMILIES[family][0])
    cfg.decode.max_new_tokens = cfg.eval_decode.max_new_tokens = FAMILIES[family][1]
    return cfg


def suite_sft_carry_add(out: str = "runs/suite/carry_add/sft") -> SFTConfig:
    return _sft("carry_add", out)


def suite_sft_carry_mul(out: str = "runs/suite/carry_mul/sft") -> SFTConfig:
    return _sft("carry_mul", out)


def suite_sft_chain(out: str = "runs/suite/chain/sft") -> SFTConfig:
    return _sft("chain", out)


def suite_sft_string(out: str = "runs/suite/string/sft") -> SFTConfig:
    return _sft("string", out)


def orl_suite_carry_add(init: str = "runs/suite/carry_add/start", out: str = "runs/suite/carry_add/orl") -> ORLConfig:
    return _orl("carry_add", init, out)


def orl_suite_carry_mul(init: str = "runs/suite/carry_mul/start", out: str = "runs/suite/carry_mul/orl") -> ORLConfig:
    return _orl("carry_mul", init, out)


def orl_suite_chain(init: str = "runs/suite/chain/start", out: str = "runs/suite/chain/orl") -> ORLConfig:
    return _orl("chain", init, out)


def orl_suite_string(init: str = "runs/suite/string/start", out: str = "runs/suite/string/orl") -> ORLConfig:
    return _orl("string", init, out)
