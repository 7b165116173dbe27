"""ORL recipes on the embedded task, and the ablations of the release's Table 3a.

``orl_arith`` is the demo's ORL stage; the variants change one thing each:
  orl_arith_no_aec      lambda_aec = 0                (Table 3a "- AEC")
  orl_arith_no_anchor   anchor = none                 (Table 3a "- entropy-gated reverse KL")
  (pathway scaling)     the same recipe from a start model with gamma = 1 (benchmarks/ablations.py; the release's
                        "- residual pathway" row removes the pathway, see orl_arith_no_pathway)
  orl_arith_no_pathway  decode and train without the residual input
  orl_arith_offpolicy   rollouts from a policy refreshed only every 10 steps (stale)
Every recipe here keeps the weak-base safeguards of docs/method.md 3.10 on (the verified-batch floor and the
held-out accuracy guard), except the smoke recipe.
"""
from orl.decode import DecodeConfig
from orl.train.loop import ORLConfig
from orl.train.losses import LossConfig


def orl_arith(init: str = "runs/demo/start", out: str = "runs/orl-arith") -> ORLConfig:
    return ORLConfig(
        init=init, task="arith", task_kwargs=dict(terms=4, digits=1), steps=350, prompts_per_step=8,
        group_size=8, lr=5e-5, warmup=5, lr_schedule="linear", lr_final=0.1, states_per_response=4,
        max_row_tokens=384,
        loss=LossConfig(gate="hard", gate_tau=0.02, rho=0.25, lambda_aec=1.0, anchor="frozen",
                        lambda_kl=0.3, kl_cap=1.0, kl_gate_tau=0.3),
        # rollouts at temperature 0.3: the verified trajectories the CE replays are the policy's
        # sharpened joint choices; the LR decays linearly to 10 % so runs end calm (seeds 0-2 all
        # within a point of the base; sweeps in benchmarks/RESULTS.md)
        decode=DecodeConfig(rule="threshold", block_size=16, max_new_tokens=48, threshold=0.9, temperature=0.3),
        eval_decode=DecodeConfig(rule="threshold", block_size=16, max_new_tokens=48, threshold=0.9),
        eval_every=50, eval_n=200, out=out, save_every=50,
        # a weak base (docs/method.md 3.10, benchmarks/RESULTS.md issue 30): a step with fewer than 32 verified
        # responses rolls out more prompts (up to 4 rounds), and a held-out guard restores the last good weights
        # if accuracy falls 5 points below the start's; a base verifying 32 of 64 rollouts never meets the floor
        min_verified=32, max_rollout_rounds=4, guard_every=50, guard_n=128, guard_drop=0.05)


def orl_arith_no_aec(init: str = "runs/demo/start", out: str = "runs/orl-arith-no-aec") -> ORLConfig:
    cfg = orl_arith(init, out)
    cfg.loss.lambda_aec = 0.0
    return cfg


def orl_arith_no_anchor(init: str = "runs/demo/start", out: str = "runs/orl-arith-no-anchor") -> ORLConfig:
    cfg = orl_arith(init, out)
    cfg.loss.anchor = "none"
    return cfg


def orl_arith_no_pathway(init: str = "runs/demo/start", out: str = "runs/orl-arith-no-pathway") -> ORLConfig:
    cfg = orl_arith(init, out)
    cfg.decode.residual = False
    cfg.eval_decode.residual = False
    return cfg


def orl_arith_offpolicy(init: str = "runs/demo/start", out: str = "runs/orl-arith-offpolicy") -> ORLConfig:
    cfg = orl_arith(init, out)
    cfg.stale_every = 10
    return cfg


def orl_arith_smoke(init: str = "runs/demo/start", out: str = "runs/orl-smoke") -> ORLConfig:
    """Every code path in seconds (tests)."""
    cfg = orl_arith(init, out)
    cfg.steps, cfg.prompts_per_step, cfg.group_size, cfg.save_every = 3, 2, 3, 2
    cfg.eval_every, cfg.eval_n = 0, 8
    cfg.min_verified, cfg.guard_every = 0, 0   # 6 rollouts a step: the floor would always act; no guard decode
    return cfg
