"""Recipes for the embedded task suite (orl/tasks/suite.py): the SFT of each family's base, and ORL on it.

``suite_sft_<family>`` is the demo's ``arith_sft`` (same `small` model, two stages of 600 + 400 steps,
batch 64, character tokenizer: a few minutes on a laptop CPU) on that family's task, and
``orl_suite_<family>`` is ``orl_arith`` on it; only the task and the decoders' token budget change.
The two trained baselines ORL is compared with at equal training compute (benchmarks/suite_runs.py):
``rft_suite_<family>`` (rejection-sampling fine-tuning, `orl.train.rft`: ORL's steps, prompts, group
size, decoders, sampling and LR schedule, from the base itself) and ``more_sft_suite_<family>`` (the
base's SFT continued for ORL's number of optimizer steps, batch 64, at the LR the SFT ended with, on
a fresh part of the train stream: task seed 1, whose problems are still never held out).
The task knobs are pinned here (as ``arith_sft`` pins its own), so a change of a task's defaults
does not silently change a recipe. Whether a family's base lands where the release's bases sit is
measured by benchmarks/suite_calibrate.py, not by these functions.
"""
from typing import NamedTuple

from orl.recipes.arith import arith_sft
from orl.recipes.orl_arith import orl_arith
from orl.train.loop import ORLConfig
from orl.train.rft import RFTConfig, rft_from_orl
from orl.train.sft import SFTConfig, more_sft_from

# family -> (task kwargs the recipes pin, decoder max_new_tokens: the longest response + EOS, rounded
# up to whole 16-token blocks)
# Calibration (benchmarks/suite_calibrate.py, SFT seed 0, n = 300, threshold decoder; target at 0.9: TPF
# 1.5-3, strict 60-95 %, >= 10 points lost at 2x TPF), 2026-12-01, 2-core CPU. K = 16, 1000 SFT steps:
#   carry_mul digits=3                strict 86.3 %, TPF 5.56: TPF too high; 2x TPF out of reach (max 6.69, the
#                                     one-step-per-block ceiling), 21.3 points lost there
#   string length=9 perm / sum        strict 0.0 % (every state after the first wrong), TPF 2.50 / 2.34
#   chain steps=5 max_value=99        strict 0.3 % (final-only 15 %: line values wrong), TPF 2.35
#   chain steps=5 max_value=20        strict 35.0 %, TPF 3.12; 2x TPF costs 15.7 points (bends), accuracy too low
#   chain steps=3 max_value=20        strict 57.3 %, TPF 3.61; flat: 59.3 % at threshold 0.3 (TPF 6.29), no bend
#   carry_add terms=2 digits=4        strict 43.0 %, TPF 4.38
# Longer SFT (3000 steps): a learned task decodes in parallel unless a block holds more dependent steps
# than the 4-layer model resolves at once:
#   chain steps=5 max_value=20, K=16  strict 97.3 %, TPF 6.22 (1.09 steps a block): parallel
#   carry_add terms=2 digits=4, K=32  strict 99.3 %, TPF 10.04 (1.02 steps a block): parallel
#   chain steps=5 max_value=20, K=32  strict 53.3 %, TPF 4.94 (2.94 steps a block); 27.3 % at TPF 9.36:
#                                     bends (-26 points), but below the accuracy band and above the TPF band
#   arith (the demo's task, strict), 1000 steps, K=16: strict 72.2 % (final-only 95.2 %), TPF 2.31: in range;
#                                     flat: 78.0 % at TPF 5.51 (threshold 0.5), 69.0 % / 6.48 at 0.1 (the cap)
#   arith strict, 1000 steps, K=32    strict 45.0 % (final-only 90.2 %), TPF 2.04; flat (44.7 % at 2x TPF)
# The recipes below pin the chain setting that bends (K = 32, 3000 steps), arith at K = 16 (in range;
# the demo's SFT), the others as first calibrated.
class Family(NamedTuple):
    """What a family's recipes pin: the task's knobs, the decoders' token budget (the longest response +
    EOS, rounded up to whole blocks), the block size of SFT and of both decoders, and the steps of the
    SFT's two stages (diffusion, self-conditioning), and the registered task it draws from (None: the
    family's own name; a variant of a task at another block size names its task here)."""
    task_kwargs: dict
    max_new_tokens: int
    block_size: int = 16
    sft_steps: tuple[int, int] = (600, 400)
    task: str | None = None
    rollout_temperature: float | None = None   # None: orl_arith's 0.3. The phrasing families roll out at 1.0: at 0.3
                                               # the tempered confidences pass the threshold at positions whose
                                               # phrasing is still open, and the block commits incoherent text
                                               # (the `xl` base: reward 0.0 at 0.3, 0.88 at 1.0; RESULTS.md)


FAMILIES: dict[str, Family] = {
    "arith": Family(dict(terms=4, digits=1, shuffle=0.25, strict=True), 48),   # the demo task, work graded
    "carry_add": Family(dict(terms=2, digits=4), 48),
    "carry_mul": Family(dict(digits=3), 48),
    "chain": Family(dict(steps=5, max_value=20), 64, block_size=32, sft_steps=(1800, 1200)),
    "string": Family(dict(length=9, rule="perm", table_seed=0), 48),
    # the demo task at K = 32, whose responses (<= 47 tokens) fit two blocks so the frontier is not pinned
    # at 16-token blocks' TPF cap; its SFT runs as long as chain's (1000 steps left the base at 45 %)
    "arith32": Family(dict(terms=4, digits=1, shuffle=0.25, strict=True), 64, block_size=32,
                      sft_steps=(1800, 1200), task="arith"),
    # multi-block answers with many valid phrasings (issue 30): 8 chained steps, responses of 99-225
    # characters (mean 158: five 32-token blocks), each step in one of 3-4 forms drawn at random; the
    # GPU-scale family (benchmarks/suite_gpu.sh, size `xl`)
    "wordchain": Family(dict(steps=8, max_value=50), 256, block_size=32, sft_steps=(1800, 1200),
                        rollout_temperature=1.0),
    # the same at the demo's scale: 3 steps, responses of 27-99 characters (mean 63: four 16-token blocks)
    "wordchain3": Family(dict(steps=3, max_value=20), 112, block_size=16, sft_steps=(600, 400), task="wordchain",
                         rollout_temperature=1.0),
    # a running sum in many phrasings (additions only, which the 1M model learns in the demo's SFT): responses of
    # 30-93 characters (mean 61: four 16-token blocks)
    "wordadd": Family(dict(steps=3, max_value=50, ops="+"), 96, block_size=16, sft_steps=(600, 400), task="wordchain",
                      rollout_temperature=1.0),
}


def task_of(family: str) -> str:
    """The registered task a suite family draws its problems from (`orl.tasks.registry.get_task`)."""
    return FAMILIES[family].task or family


def _sft(family: str, out: str) -> SFTConfig:
    cfg, fam = arith_sft(out), FAMILIES[family]
    cfg.task, cfg.task_kwargs = task_of(family), dict(fam.task_kwargs)
    for stage, steps in zip(cfg.stages, fam.sft_steps, strict=True):
        stage.steps = steps
        stage.block_size = None if fam.block_size == 16 else fam.block_size   # 16: the small model's own
    return cfg


def _orl(family: str, init: str, out: str) -> ORLConfig:
    cfg, fam = orl_arith(init, out), FAMILIES[family]
    cfg.task, cfg.task_kwargs = task_of(family), dict(fam.task_kwargs)
    cfg.decode.max_new_tokens = cfg.eval_decode.max_new_tokens = fam.max_new_tokens
    cfg.decode.block_size = cfg.eval_decode.block_size = fam.block_size
    if fam.rollout_temperature is not None:
        cfg.decode.temperature = fam.rollout_temperature
    cfg.max_row_tokens = max(cfg.max_row_tokens, 2 * fam.max_new_tokens)   # a long response and its states in one row
    return cfg


def _rft(family: str, init: str, out: str) -> RFTConfig:
    cfg = rft_from_orl(_orl(family, init, out), init, out)
    cfg.eval_every = 0      # the suite sweeps every model afterwards
    return cfg


def _more_sft(family: str, init: str, out: str) -> SFTConfig:
    return more_sft_from(_orl(family, init, out), _sft(family, out), init, out)


def suite_sft_arith(out: str = "runs/suite/arith/sft") -> SFTConfig:
    return _sft("arith", out)


def suite_sft_carry_add(out: str = "runs/suite/carry_add/sft") -> SFTConfig:
    return _sft("carry_add", out)


def suite_sft_carry_mul(out: str = "runs/suite/carry_mul/sft") -> SFTConfig:
    return _sft("carry_mul", out)


def suite_sft_chain(out: str = "runs/suite/chain/sft") -> SFTConfig:
    return _sft("chain", out)


def suite_sft_string(out: str = "runs/suite/string/sft") -> SFTConfig:
    return _sft("string", out)


def suite_sft_arith32(out: str = "runs/suite/arith32/sft") -> SFTConfig:
    return _sft("arith32", out)


def orl_suite_arith(init: str = "runs/suite/arith/start", out: str = "runs/suite/arith/orl") -> ORLConfig:
    return _orl("arith", init, out)


def orl_suite_carry_add(init: str = "runs/suite/carry_add/start", out: str = "runs/suite/carry_add/orl") -> ORLConfig:
    return _orl("carry_add", init, out)


def orl_suite_carry_mul(init: str = "runs/suite/carry_mul/start", out: str = "runs/suite/carry_mul/orl") -> ORLConfig:
    return _orl("carry_mul", init, out)


def orl_suite_chain(init: str = "runs/suite/chain/start", out: str = "runs/suite/chain/orl") -> ORLConfig:
    return _orl("chain", init, out)


def orl_suite_string(init: str = "runs/suite/string/start", out: str = "runs/suite/string/orl") -> ORLConfig:
    return _orl("string", init, out)


def orl_suite_arith32(init: str = "runs/suite/arith32/start", out: str = "runs/suite/arith32/orl") -> ORLConfig:
    return _orl("arith32", init, out)


def rft_suite_arith(init: str = "runs/suite/arith/sft/final", out: str = "runs/suite/arith/rft") -> RFTConfig:
    return _rft("arith", init, out)


def more_sft_suite_arith(init: str = "runs/suite/arith/sft/final", out: str = "runs/suite/arith/more_sft") -> SFTConfig:
    return _more_sft("arith", init, out)


def rft_suite_arith32(init: str = "runs/suite/arith32/sft/final", out: str = "runs/suite/arith32/rft") -> RFTConfig:
    return _rft("arith32", init, out)


def more_sft_suite_arith32(init: str = "runs/suite/arith32/sft/final",
                           out: str = "runs/suite/arith32/more_sft") -> SFTConfig:
    return _more_sft("arith32", init, out)


def rft_suite_carry_add(init: str = "runs/suite/carry_add/sft/final", out: str = "runs/suite/carry_add/rft") -> RFTConfig:
    return _rft("carry_add", init, out)


def more_sft_suite_carry_add(init: str = "runs/suite/carry_add/sft/final", out: str = "runs/suite/carry_add/more_sft") -> SFTConfig:
    return _more_sft("carry_add", init, out)


def rft_suite_carry_mul(init: str = "runs/suite/carry_mul/sft/final", out: str = "runs/suite/carry_mul/rft") -> RFTConfig:
    return _rft("carry_mul", init, out)


def more_sft_suite_carry_mul(init: str = "runs/suite/carry_mul/sft/final", out: str = "runs/suite/carry_mul/more_sft") -> SFTConfig:
    return _more_sft("carry_mul", init, out)


def rft_suite_chain(init: str = "runs/suite/chain/sft/final", out: str = "runs/suite/chain/rft") -> RFTConfig:
    return _rft("chain", init, out)


def more_sft_suite_chain(init: str = "runs/suite/chain/sft/final", out: str = "runs/suite/chain/more_sft") -> SFTConfig:
    return _more_sft("chain", init, out)


def rft_suite_string(init: str = "runs/suite/string/sft/final", out: str = "runs/suite/string/rft") -> RFTConfig:
    return _rft("string", init, out)


def more_sft_suite_string(init: str = "runs/suite/string/sft/final", out: str = "runs/suite/string/more_sft") -> SFTConfig:
    return _more_sft("string", init, out)


def suite_sft_wordchain(out: str = "runs/suite/wordchain/sft") -> SFTConfig:
    return _sft("wordchain", out)


def orl_suite_wordchain(init: str = "runs/suite/wordchain/start", out: str = "runs/suite/wordchain/orl") -> ORLConfig:
    return _orl("wordchain", init, out)


def rft_suite_wordchain(init: str = "runs/suite/wordchain/sft/final", out: str = "runs/suite/wordchain/rft") -> RFTConfig:
    return _rft("wordchain", init, out)


def more_sft_suite_wordchain(init: str = "runs/suite/wordchain/sft/final", out: str = "runs/suite/wordchain/more_sft") -> SFTConfig:
    return _more_sft("wordchain", init, out)

def suite_sft_wordchain3(out: str = "runs/suite/wordchain3/sft") -> SFTConfig:
    return _sft("wordchain3", out)


def orl_suite_wordchain3(init: str = "runs/suite/wordchain3/start", out: str = "runs/suite/wordchain3/orl") -> ORLConfig:
    return _orl("wordchain3", init, out)


def rft_suite_wordchain3(init: str = "runs/suite/wordchain3/sft/final", out: str = "runs/suite/wordchain3/rft") -> RFTConfig:
    return _rft("wordchain3", init, out)


def more_sft_suite_wordchain3(init: str = "runs/suite/wordchain3/sft/final", out: str = "runs/suite/wordchain3/more_sft") -> SFTConfig:
    return _more_sft("wordchain3", init, out)


def suite_sft_wordadd(out: str = "runs/suite/wordadd/sft") -> SFTConfig:
    return _sft("wordadd", out)


def orl_suite_wordadd(init: str = "runs/suite/wordadd/start", out: str = "runs/suite/wordadd/orl") -> ORLConfig:
    return _orl("wordadd", init, out)


def rft_suite_wordadd(init: str = "runs/suite/wordadd/sft/final", out: str = "runs/suite/wordadd/rft") -> RFTConfig:
    return _rft("wordadd", init, out)


def more_sft_suite_wordadd(init: str = "runs/suite/wordadd/sft/final", out: str = "runs/suite/wordadd/more_sft") -> SFTConfig:
    return _more_sft("wordadd", init, out)
