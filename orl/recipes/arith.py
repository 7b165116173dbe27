"""Recipes for the embedded default task (multi-term addition with worked steps).

Each recipe is a function returning a config dataclass; variants call a base recipe and change
fields. ``arith_sft`` is the base model of the demo: two stages in the spirit of the release's
staged offline training (plain block diffusion, then self-conditioning that trains the pathway).
"""
from orl.train.sft import SFTConfig, SFTStage


def arith_sft(out: str = "runs/arith-sft") -> SFTConfig:
    return SFTConfig(
        family="sdar", size="small", tokenizer="char", task="arith",
        task_kwargs=dict(terms=4, digits=1),
        stages=[SFTStage("diffusion", steps=600, lr=2e-3, selfcond=0.0, warmup=50),
                SFTStage("selfcond", steps=400, lr=1e-3, selfcond=0.5, warmup=20)],
        batch_size=64, weighting="flat", out=out, save_every=300, eval_every=200)  # eval: the bar's heldout_acc


def arith_sft_smoke(out: str = "runs/arith-sft-smoke") -> SFTConfig:
    """A few steps of the same recipe: every code path, in seconds (tests)."""
    cfg = arith_sft(out)
    cfg.size = "tiny"
    cfg.stages = [SFTStage("diffusion", steps=4, selfcond=0.0, warmup=2), SFTStage("selfcond", steps=4, warmup=2)]
    cfg.batch_size, cfg.save_every, cfg.log_every = 8, 3, 2
    cfg.eval_every, cfg.eval_n = 0, 8
    return cfg
