"""The ORL loop (docs/method.md 3.2): fresh rollouts -> verify -> select + pack -> one update -> repeat.

One readable on-policy step per iteration. Rollouts use the current weights (strictly on-policy;
``stale_every`` > 1 reuses an older rollout policy for the off-policy ablation). Only verified
rollouts supervise. Data and rollout randomness are functions of (seed, step), so a resumed run
ends in the same state as an uninterrupted one (tested). Under ``torchrun`` each rank rolls out a
slice of the prompts with a full copy of the weights, the trained model is sharded with FSDP2,
losses are normalised over the global number of responses and gradients summed across ranks
(`orl.train.distributed`); checkpoints go through DCP and resume on any number of ranks.
Two safeguards for a weak base (docs/method.md 3.10): a verified-batch floor (``min_verified``: more
rounds of fresh prompts with the same weights until the step holds that many verified responses, else
a proportionally smaller step) and a held-out accuracy guard (``guard_every``: restore the last good
weights and optimizer state when accuracy falls ``guard_drop`` below the start's; its state is in
the checkpoint). Each step also logs the relative update of the pathway and of the rest of the model.
A step whose rollouts hold no verified one updates nothing: the bar shows its loss as ``-`` and
``no_verified``, the share of the run's steps so far without one (in ``metrics.jsonl`` under
``run.no_verified_share``, with ``run.lr``; the loggers get both), and a warning says so once that
share passes `NO_VERIFIED_WARN`, and again at the end.
Does not own: decoding (`orl.decode`), capture (`rollout`), packing (`pack`), losses (`losses`),
the loggers (`orl.train.loggers`).
"""
from __future__ import annotations

import copy
import dataclasses
import os
import random
import sys
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ..decode import DecodeConfig
from ..decode.rng import CounterRNG
from ..decode.tpf import summary as tpf_summary
from ..model import load_pretrained, save_pretrained
from . import distributed as D
from .checkpoint import open_run
from .diagnostics import _is_pathway, _params_before, _supervision_shares, _update_sizes
from .guard import GuardMixin
from .losses import LossConfig, orl_loss
from .pack import pack, select_states
from .rollout import rollout_group


@dataclass
class ORLConfig:
    init: str = ""                    # start model directory (e.g. `orl convert scrp` output)
    task: str = "arith"
    task_kwargs: dict = field(default_factory=dict)
    chat: bool = False
    steps: int = 100
    prompts_per_step: int = 8
    group_size: int = 8               # G rollouts per prompt
    lr: float = 1e-4
    warmup: int = 5                   # linear LR warm-up steps (Adam's first steps are sign-like)
    lr_schedule: str = "constant"     # after warm-up: "constant", or "linear" decay to lr_final * lr at the end
    lr_final: float = 0.1
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    states_per_response: int = 8      # selection budget                                          [G]
    pack_mode: str = "packed"
    max_row_tokens: int = 2048
    loss: LossConfig = field(default_factory=LossConfig)
    decode: DecodeConfig = field(default_factory=lambda: DecodeConfig(rule="threshold", block_size=16,
                                                                      max_new_tokens=64, temperature=1.0))
    topk_stats: int = 16              # rollout statistics kept per position (anchor="rollout")
    stale_every: int = 1              # 1 = on-policy; n > 1 = rollouts from a policy up to n-1 steps old
    eval_every: int = 0               # 0 = no in-loop evaluation
    eval_n: int = 200
    eval_decode: DecodeConfig | None = None
    seed: int = 0
    prompt_seed: int = 0              # which prompts: step s draws problems PROMPT_STRIDE * prompt_seed + s * prompts_per_step + j
                                      # of the train stream (0: the same stream whatever `seed`; set it per seed for
                                      # seeds that see different prompts)
    device: str = "cpu"               # "cuda" on a GPU machine (each rank uses its local GPU under torchrun)
    rollout_engine: str = "auto"      # "runtime": G rows per launch through orl.engine (CUDA graphs, capture
                                      # in the graph); "reference": orl.decode.decode; "auto": runtime on CUDA
    rollout_dtype: str | None = None  # the runtime's weights/activations ("bfloat16", ...); None: the model's
    rollout_sampler: str = "auto"     # the runtime's per-round pass over the logits: "torch" ("auto" for the mask
                                      # rules: the reference decoder's numerics) or "triton" (one fused read:
                                      # capture <= 10 % of rollout time on the H200, benchmarks/RESULTS.md)
    reward_errors: str = "raise"      # a verifier that raises, hangs or returns a value outside [0, 1]: "raise"
                                      # stops naming the task, problem and value; "zero": reward 0, counted
    rollout_rng: str = "torch"        # the reference decoder's stream: "torch" (a torch.Generator per prompt)
                                      # or "counter" (the runtime's: both decoders then take the same rollouts)
    max_prompt_tokens: int = 1024     # the runtime's KV cache holds this + max_new_tokens + two blocks per row
    precision: str = "fp32"           # "bf16": replay forward + backward under bf16 autocast; the master weights and
                                      # AdamW state stay float32 (docs/method.md 3.2); "fp32": everything float32
    checkpoint_layers: bool = False   # activation checkpointing per decoder layer in the replay (memory for compute)
    anchor_dtype: str = "float32"     # the frozen anchor copy (loss.anchor="frozen"): "bfloat16" halves its memory
    replay_attention: str = "dense"   # packed replay's mask: "dense" (B, T, T) for SDPA, "flex" (a FlexAttention
                                      # BlockMask that skips invisible tiles; CUDA: no FlexAttention backward on CPU)
                                      # or "triton" (orl.kernels.staircase: the same tiles skipped, its own kernels)
    micro_batch_tokens: int = 0       # replay in micro-batches of whole responses of about this many packed tokens,
                                      # gradients accumulated (the same loss: it sums over responses); 0: one batch
    balance: bool = False             # fill replay rows by estimated cost (orl.train.balance) instead of in order
    balance_ranks: bool = True        # under torchrun: split the verified responses across ranks by estimated
                                      # replay cost (Karmarkar-Karp) instead of replaying each rank's own
    replay_head: str = "all"          # "all": LM head over every replayed token, then the states' gathered (the
                                      # CPU recipes' numerics); "states": the head at the states' tokens only
                                      # ((S, K, V) logits instead of (B, T, V); equal up to float rounding)
    pathway_lr: float = 1.0           # LR multiplier of the residual pathway's parameters (0: frozen; 3.3.4)
    # verified-batch floor (docs/method.md 3.10, our choice; 0 = off): a step whose rollouts hold fewer than
    # ``min_verified`` verified responses rolls out ``prompts_per_step`` more prompts with the same weights, up to
    # ``max_rollout_rounds`` rounds in all; still short, it updates with its LR x (verified / min_verified)
    min_verified: int = 0
    max_rollout_rounds: int = 4
    # held-out accuracy guard (docs/method.md 3.10, our choice; 0 = off): every ``guard_every`` steps, decode
    # ``guard_n`` problems the run never trains on with the eval decoder; an accuracy more than ``guard_drop``
    # (absolute) below the start model's restores the last weights that passed, with their AdamW state, and
    # multiplies the LR by ``guard_lr_factor``; after ``guard_max_trips`` trips the run stops. The run's last
    # weights are checked too, so the final model is never one that failed the guard.
    guard_every: int = 0
    guard_n: int = 128
    guard_drop: float = 0.05
    guard_lr_factor: float = 0.5
    guard_max_trips: int = 3
    guard_ref: str = "start"          # the accuracy a check must stay within guard_drop of: "start", or "best" so far
    log_update_max_params: int = 200_000_000  # metrics: the relative update of the whole model is logged when it
                                              # has at most this many parameters (a copy per step); the pathway's always
    out: str = "runs/orl"
    save_every: int = 25
    log_every: int = 1


PROMPT_STRIDE = 1_000_003  # train-stream indices between two prompt seeds' streams (ORLConfig.prompt_seed)


def lr_factor(step: int, cfg: ORLConfig) -> float:
    """LR multiplier of optimizer step ``step`` (0-based): linear warm-up over ``cfg.warmup`` steps,
    then constant or a linear decay reaching ``cfg.lr_final`` at the last step. A function of the
    step alone, so a resumed run follows the same schedule."""
    if cfg.lr_schedule not in ("constant", "linear"):
        raise ValueError(f"lr_schedule must be 'constant' or 'linear', got {cfg.lr_schedule!r}")
    f = min(1.0, (step + 1) / max(cfg.warmup, 1))
    if cfg.lr_schedule == "linear" and step >= cfg.warmup:
        span = max(cfg.steps - 1 - cfg.warmup, 1)
        f *= 1.0 - (1.0 - cfg.lr_final) * min(1.0, (step - cfg.warmup) / span)
    return f


def _world():
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _oom(phase: str, step: int, cfg: ORLConfig, shape) -> RuntimeError:
    """The out-of-memory error of a step, naming the knobs that shrink it."""
    rows = "" if shape is None else f" (replay batch {tuple(shape)})"
    return RuntimeError(
        f"out of memory in {phase} of ORL step {step}{rows}. Lower the rollouts per step (prompts_per_step="
        f"{cfg.prompts_per_step} x group_size={cfg.group_size}), the replay row length (max_row_tokens="
        f"{cfg.max_row_tokens}), the states per response (states_per_response={cfg.states_per_response}) or "
        f"decode.max_new_tokens={cfg.decode.max_new_tokens}; or turn on checkpoint_layers=True, precision='bf16', "
        f"anchor_dtype='bfloat16' / loss.anchor='rollout' (no frozen copy), rollout_dtype='bfloat16'.")


def _rollouts(cfg: ORLConfig, policy, tok, task, pool, train_problems: bool, mine, runtime, verifier) -> list:
    """This rank's groups of the step: G rollouts of each of its prompts, captured and verified (in
    ``verifier``, the run's `orl.eval.pool.VerifierPool`: the path evaluation scores through)."""
    rolls = []
    for i in mine:
        j = i + PROMPT_STRIDE * cfg.prompt_seed   # the stream index (the generators stay keyed by i)
        prob = task.sample("train", j) if train_problems else pool[j % len(pool)]
        g = torch.Generator().manual_seed(cfg.seed * 7_919 + i)
        seed = (cfg.seed * 7_919 + i) * cfg.group_size  # the group's counter streams: rows seed .. seed + G - 1
        rolls += rollout_group(policy, tok, task, prob, cfg.group_size, cfg.decode, generator=g,
                               topk=cfg.topk_stats if cfg.loss.anchor == "rollout" else 0, chat=cfg.chat,
                               runtime=runtime, seed=seed, verifier=verifier, reward_errors=cfg.reward_errors,
                               rng=CounterRNG(seed) if cfg.rollout_rng == "counter" else None)
    return rolls


EXTRA_ROUNDS = 1 << 36  # train-stream indices of the extra rollout rounds (min_verified) start here


def _round_ids(step: int, rnd: int, cfg: ORLConfig) -> range:
    """The prompt indices of rollout round ``rnd`` of step ``step``: the step's own ``prompts_per_step``
    (round 0), or a block of the extra rounds' region, disjoint from every other step's and round's."""
    P = cfg.prompts_per_step
    first = step * P if rnd == 0 else EXTRA_ROUNDS + (step * cfg.max_rollout_rounds + rnd) * P
    return range(first, first + P)


def _uses_runtime(cfg: ORLConfig, device) -> bool:
    """The rollouts go through the runtime: asked for, or "auto" on CUDA."""
    return cfg.rollout_engine == "runtime" or (cfg.rollout_engine == "auto" and str(device).startswith("cuda"))


def _rollout_runtime(cfg: ORLConfig, policy, device: str):
    """The runtime that decodes a group's G rows per launch, every family's steps captured (None:
    the reference decoder)."""
    if cfg.rollout_engine not in ("auto", "runtime", "reference"):
        raise ValueError(f"rollout_engine must be 'auto', 'runtime' or 'reference', got {cfg.rollout_engine!r}")
    if not _uses_runtime(cfg, device):
        return None
    from ..engine.runtime import Runtime  # noqa: PLC0415
    n = cfg.max_prompt_tokens + cfg.decode.max_new_tokens + 2 * cfg.decode.block_size
    return Runtime(policy, cfg.decode.block_size, batch=cfg.group_size, dtype=cfg.rollout_dtype,
                   max_len=min(n, policy.config.max_position), sampler=cfg.rollout_sampler)


class ORLTrainer(GuardMixin):
    """One ORL run's state and its step: ``ORLTrainer(cfg).step()`` runs one iteration (rollouts ->
    verify -> select + pack -> one update) and returns its metrics, with the time split
    (``t_rollout``, ``t_replay``, ``t_optim`` seconds). `train_orl` is the loop around it; a
    benchmark may pass its own ``model`` / ``tokenizer`` / ``task`` (no start directory) and change
    ``self.cfg`` between steps (the runtime stays captured). It holds ``cfg.out`` open (locked,
    `orl.train.checkpoint.open_run`) until `close`; ``resume_from`` / ``allow_config_change``: as
    `orl.train.sft.train_sft`."""

    def __init__(self, cfg: ORLConfig, resume: bool = True, model=None, tokenizer=None, task=None,
                 resume_from: str | None = None, allow_config_change: bool = False):
        from ..tasks.base import check_task  # noqa: PLC0415
        from ..tasks.registry import get_task  # noqa: PLC0415
        from ..tokenizer import load_tokenizer  # noqa: PLC0415

        _check(cfg)
        self.cfg = cfg
        self.rank, self.world = rank, world = _world()
        if model is None and (not cfg.init or not os.path.exists(os.path.join(cfg.init, "config.json"))):
            raise FileNotFoundError(f"ORL start model {cfg.init!r} not found; train a base with `orl sft` and make "
                                    "the start model with `orl convert scrp --in BASE --out START --gamma 8`")
        self.task = task = check_task(task if task is not None else get_task(cfg.task, **cfg.task_kwargs))
        self.train_problems = hasattr(task, "sample")
        self.pool = None if self.train_problems else task.problems("train")
        self.tok = tokenizer if tokenizer is not None else load_tokenizer(cfg.init)
        device = cfg.device
        if device == "cuda" and world > 1:
            device = f"cuda:{int(os.environ.get('LOCAL_RANK', rank))}"
            torch.cuda.set_device(device)
        self.device = device
        self.run = open_run(cfg.out, "orl", cfg, cfg.steps, resume=resume, resume_from=resume_from,
                            allow_config_change=allow_config_change)
        if rank == 0:
            from .loggers import write_resolved_config  # noqa: PLC0415
            write_resolved_config(cfg.out, "orl", cfg)
        from ..eval.pool import VerifierPool  # noqa: PLC0415
        # forked before the model loads: the workers share none of its pages (orl.eval.pool.VerifierPool.start)
        self.verifier = VerifierPool(task, workers=min(cfg.group_size, os.cpu_count() or 1)).start()
        try:
            self._build(model)
        except BaseException:
            self.close()
            raise

    def _build(self, model) -> None:
        cfg, world, device = self.cfg, self.world, self.device
        self.model = model = model if model is not None else load_pretrained(cfg.init, device=device)
        model.checkpoint_layers = cfg.checkpoint_layers
        self.frozen = None
        if cfg.loss.anchor == "frozen":  # no gradients, and optionally in bf16: not a second full-precision model
            self.frozen = copy.deepcopy(model).to(_DTYPES[cfg.anchor_dtype]).eval().requires_grad_(False)
            self.frozen.checkpoint_layers = False
        self.behaviour = copy.deepcopy(model).eval().requires_grad_(False) if cfg.stale_every > 1 else None
        # under torchrun: FSDP2 shards the trained model; the rollouts decode with a full copy (orl.train.distributed)
        self.sharded = world > 1
        self.replica = None
        if self.sharded:
            rdt = _DTYPES.get(cfg.rollout_dtype) if _uses_runtime(cfg, device) and cfg.rollout_dtype else None
            self.replica = D.make_replica(model, rdt) if self.behaviour is None else None
            D.shard(model, torch.bfloat16 if cfg.precision == "bf16" else None)
        params = list(model.parameters())
        if cfg.pathway_lr != 1.0:  # two groups only then: the one-group optimizer (and its checkpoints) otherwise
            pw = [p for n, p in model.named_parameters() if _is_pathway(n)]
            params = [{"params": [p for n, p in model.named_parameters() if not _is_pathway(n)], "lr_mult": 1.0},
                      {"params": pw, "lr_mult": cfg.pathway_lr}]
        self.opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.99))
        st = self.run.load(model, self.opt)
        self.step_i = st["step"]
        if self.behaviour is not None and self.step_i:  # the stale policy: the weights at the last refresh step,
            # stored with the checkpoint unless that step is this one
            self.behaviour.load_state_dict(st["behaviour"] if "behaviour" in st else self._state())
        self.runtime = _rollout_runtime(cfg, self.policy(refresh=True), device)
        self._guard_init(st)
        trained = model.config.block_size
        if self.rank == 0 and cfg.decode.block_size != trained:  # a recipe written for another model, most often
            print(f"note: decode.block_size {cfg.decode.block_size} is not the start model's block size {trained} "
                  f"(the one it was trained with); --set decode.block_size={trained} --set eval_decode.block_size="
                  f"{trained} rolls out as it was trained", file=sys.stderr, flush=True)

    def _state(self) -> dict:
        """The trained model's full state dict (a collective when sharded)."""
        return D.full_state(self.model) if self.sharded else self.model.state_dict()

    def policy(self, refresh: bool = False):
        """The model the rollouts decode with: the stale behaviour copy, the full replica of a
        sharded model (``refresh``: its weights from the shards now; every rank calls), or the model."""
        if self.behaviour is not None:
            return self.behaviour
        if self.replica is not None:
            if refresh:
                self.replica.load_state_dict(self._state())
            return self.replica
        return self.model

    def _global_sum(self, n: int) -> int:
        """``n`` summed over the ranks (every rank calls it)."""
        if self.world == 1:
            return n
        t = torch.tensor([n], dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return int(t.item())

    def _sync(self) -> float:
        if str(self.device).startswith("cuda"):
            torch.cuda.synchronize(self.device)
        return time.time()

    def step(self) -> dict:
        cfg, model, opt, device, step = self.cfg, self.model, self.opt, self.device, self.step_i
        _check(cfg)
        K = cfg.decode.block_size
        t0 = self._sync()
        for g_ in opt.param_groups:
            g_["lr"] = cfg.lr * lr_factor(step, cfg) * self.guard["lr_scale"] * g_.get("lr_mult", 1.0)
        if self.behaviour is not None and step % cfg.stale_every == 0:
            self.behaviour.load_state_dict(self._state())
        policy = self.policy(refresh=True)
        policy.eval()
        runtime = self.runtime if cfg.rollout_engine != "reference" else None
        if runtime is not None:
            runtime.load_weights(policy)
        # ---- 1. on-policy rollouts with capture (this rank's slice of the prompts); with ``min_verified``, further
        # rounds of fresh prompts with the same weights (still on-policy) until the step holds that many verified
        # responses or ``max_rollout_rounds`` rounds ran (docs/method.md 3.10)
        rolls, rounds = [], 0
        while True:
            mine = [i for j, i in enumerate(_round_ids(step, rounds, cfg)) if j % self.world == self.rank]
            try:
                rolls += _rollouts(cfg, policy, self.tok, self.task, self.pool, self.train_problems, mine, runtime,
                                   self.verifier)
            except torch.OutOfMemoryError as e:
                raise _oom("the rollouts", step, cfg, None) from e
            rounds += 1
            if not cfg.min_verified or rounds >= cfg.max_rollout_rounds or \
                    self._global_sum(sum(r.reward >= 1.0 for r in rolls)) >= cfg.min_verified:
                break
        t1 = self._sync()
        # ---- 2. verify: only rewarded rollouts supervise
        verified = [r for r in rolls if r.reward >= 1.0]
        # ---- 3. select + pack
        sels = [select_states(r, cfg.states_per_response, random.Random(f"{cfg.seed}:{step}:{r.problem_id}:{r.index}"))
                for r in verified]
        sels = [s for s in sels if s.states]
        if self.world > 1 and cfg.balance_ranks:
            sels = _balance_across_ranks(sels, K, model.config, self.rank, self.world)
        n_local = torch.tensor([len(sels)], dtype=torch.float64, device=device if self.world > 1 else "cpu")
        if self.world > 1:
            dist.all_reduce(n_local)
        n_global = float(n_local.item())
        model.train()
        opt.zero_grad(set_to_none=True)
        m: dict = {}
        n_train_tok = 0
        if n_global > 0:  # every rank takes part in as many micro-batches (FSDP2's collectives)
            n_train_tok = self._replay(sels, n_global, m)
            if self.world > 1:  # the loss metrics of all ranks' responses, as one process reports them
                w = len(sels) / n_global
                t = torch.tensor([m.get(k, 0.0) * w for k in _REDUCED], dtype=torch.float64, device=n_local.device)
                dist.all_reduce(t)
                m.update(zip(_REDUCED, t.tolist()))
        t2 = self._sync()
        if cfg.min_verified:  # a batch still below the floor takes a step in proportion to its size (3.10)
            m.update(rollout_rounds=rounds, verified_lr_scale=min(1.0, n_global / cfg.min_verified))
            for g_ in opt.param_groups:
                g_["lr"] *= m["verified_lr_scale"]
        if n_global > 0:
            gn = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            before = _params_before(model, cfg.log_update_max_params)
            opt.step()
            self._good_is_current = False
            m["grad_norm"] = D.grad_norm(gn)
            m.update(_update_sizes(model, before))
        t3 = self._sync()
        self.step_i = step + 1
        # ---- metrics
        n_tok = sum(r.n_generated for r in rolls)
        t = tpf_summary((r.n_generated, r.steps_per_block) for r in rolls)
        t_roll, t_train = t1 - t0, t3 - t1
        m.update(reward=sum(r.reward for r in rolls) / max(len(rolls), 1), tpf=t["tpf"],
                 tpf_no_commit=t["tpf_no_commit"], steps_per_block=t["steps_per_block"], verified=len(verified),
                 rollout_tokens_per_s=n_tok / max(t_roll, 1e-9), train_tokens_per_s=n_train_tok / max(t_train, 1e-9))
        m["accuracy"] = m["reward"]
        m.update(_supervision_shares(rolls, verified, sels, K))
        m["reward_errors"] = sum(1 for r in rolls if r.reward_error)  # counted with reward_errors="zero"; this rank's
        m["reward_error_rate"] = m["reward_errors"] / max(len(rolls), 1)
        self.timing = {"t_rollout": t_roll, "t_replay": t2 - t1, "t_optim": t3 - t2, "rollout_tokens": n_tok,
                       "train_tokens": n_train_tok}
        return m

    def _replay(self, sels, n_global: float, m: dict) -> int:
        """Forward + backward of the selected states, in micro-batches of whole responses (the loss is
        a sum over responses, so their gradients add up to the one batch's); fills ``m`` with the
        loss metrics (averaged over micro-batches by responses). Returns the packed tokens."""
        cfg, model, K = self.cfg, self.model, self.cfg.decode.block_size
        n_tok = 0
        groups = _micro_batches(sels, cfg.micro_batch_tokens, K) if sels else []
        idle = D.max_over_ranks(len(groups), self.device) - len(groups) if self.sharded else 0
        for sub in groups:
            batch = pack(sub, K, model.config.clean_attention, cfg.pack_mode, cfg.max_row_tokens,
                         pad_id=self.tok.pad_token_id or 0, cost_cfg=model.config if cfg.balance else None)
            batch = batch.to(self.device)
            n_tok += int(batch.tokens.numel())
            fw = dict(residual=batch.residual, residual_where=batch.residual_where,
                      residual_weight=batch.residual_weight)
            mask = {"dense": lambda: batch.mask, "flex": batch.block_mask,
                    "triton": batch.staircase_mask}[cfg.replay_attention]()
            try:
                with torch.autocast(torch.device(self.device).type, torch.bfloat16, enabled=cfg.precision == "bf16"):
                    logits = _state_logits(model, batch, mask, fw, cfg.replay_head)
                    ref = None
                    if self.frozen is not None:
                        with torch.no_grad():
                            fz = {k: (v.to(_DTYPES[cfg.anchor_dtype]) if v is not None and v.is_floating_point()
                                      else v) for k, v in fw.items()}
                            ref = _state_logits(self.frozen, batch, mask, fz, cfg.replay_head)
                loss, mm = orl_loss(logits.float(), batch.targets, batch.unresolved, batch.resp, batch.pairs,
                                    batch.n_responses, cfg.loss, ref_logits=None if ref is None else ref.float(),
                                    ref_ids=batch.ref_ids, ref_logp=batch.ref_logp, ref_entropy=batch.ref_entropy,
                                    committed=batch.committed)
                (loss * len(sub) / max(n_global, 1.0)).backward()
            except torch.OutOfMemoryError as e:
                raise _oom("the replay (forward + backward)", self.step_i, cfg, batch.tokens.shape) from e
            del logits, ref, loss
            w = len(sub) / len(sels)
            for k, v in mm.items():
                m[k] = m.get(k, 0.0) + w * v
        for _ in range(idle):
            D.idle_pass(model, self.device)
        return n_tok

    def save(self) -> None:
        """A checkpoint of this step (every rank calls it), with the stale policy's weights when they
        are not this step's (the off-policy ablation between two refreshes), and the guard's state
        (its last good weights and AdamW state unless they are this step's)."""
        full = self.policy(refresh=True) if self.replica is not None else None
        state = {}
        if self.behaviour is not None and self.step_i % self.cfg.stale_every and self.rank == 0:  # rank 0 writes it
            state["behaviour"] = {k: v.detach().cpu().clone() for k, v in self.behaviour.state_dict().items()}
        if self.cfg.guard_every:
            state["guard"] = {**self.guard, "good": "current" if self._good_is_current else self._good}
        self.run.save(self.step_i, self.model, self.opt, state, tokenizer=self.tok, full_model=full)

    def close(self) -> None:
        """Stop the verifier's processes and release the run directory (its lock)."""
        self.verifier.close()
        self.run.close()

    def eval_model(self):
        """The model with this step's weights, unsharded (every rank calls it; rank 0 evaluates)."""
        return self.policy(refresh=True) if self.replica is not None else self.model


# loss metrics averaged over every rank's responses (the others, e.g. entropy_contraction, stay this rank's)
_REDUCED = ("loss", "loss_pred", "loss_aec", "loss_anchor", "ce_unresolved", "entropy_unresolved", "gate_frac",
            "anchor_frac")


def _state_logits(model, batch, mask, fw: dict, head: str) -> torch.Tensor:
    """(S, K, V) logits of the replayed states: the head over every token then gathered ("all"), or
    the head at the states' tokens only ("states": the prompt and clean rows never reach it)."""
    if head == "states":
        return model.head(batch.gather(model(batch.tokens, batch.positions, mask, return_hidden=True, **fw)))
    return batch.gather(model(batch.tokens, batch.positions, mask, **fw))


def _check(cfg: ORLConfig) -> None:
    from ..eval.pool import check_reward_errors  # noqa: PLC0415
    check_reward_errors(cfg.reward_errors)
    if cfg.replay_head not in ("all", "states"):
        raise ValueError(f"replay_head must be 'all' or 'states', got {cfg.replay_head!r}")
    if cfg.replay_attention not in ("dense", "flex", "triton"):
        raise ValueError(f"replay_attention must be 'dense', 'flex' or 'triton', got {cfg.replay_attention!r}")
    if cfg.replay_attention == "flex" and not str(cfg.device).startswith("cuda"):
        raise ValueError("replay_attention='flex' needs device='cuda' (FlexAttention has no backward on the CPU); "
                         "use replay_attention='dense' on the CPU")
    if cfg.min_verified < 0 or cfg.max_rollout_rounds < 1:
        raise ValueError(f"min_verified must be >= 0 (0: off) and max_rollout_rounds >= 1, got {cfg.min_verified}, "
                         f"{cfg.max_rollout_rounds}")
    if cfg.guard_every < 0 or (cfg.guard_every and cfg.guard_n < 1):
        raise ValueError(f"guard_every must be >= 0 (0: no guard) and guard_n >= 1, got {cfg.guard_every}, "
                         f"{cfg.guard_n}")
    if cfg.guard_ref not in ("start", "best"):
        raise ValueError(f"guard_ref must be 'start' or 'best', got {cfg.guard_ref!r}")
    if not 0 < cfg.guard_lr_factor <= 1:
        raise ValueError(f"guard_lr_factor must be in (0, 1], got {cfg.guard_lr_factor}")
    if cfg.micro_batch_tokens < 0:
        raise ValueError(f"micro_batch_tokens must be >= 0 (0: one replay batch), got {cfg.micro_batch_tokens}")


def _balance_across_ranks(sels: list, K: int, mcfg, rank: int, world: int) -> list:
    """Every rank's selections (each rollout slimmed to its selected states) gathered on every rank,
    split into ``world`` sets of near-equal estimated replay cost (`orl.train.balance`: attention
    pairs of the response's packed row plus its MLP tokens; Karmarkar-Karp, as VERL balances
    sequence lengths), and this rank's set returned in a rank-independent order."""
    from .balance import estimate_cost, karmarkar_karp  # noqa: PLC0415
    from .pack import Selection, _row_pieces  # noqa: PLC0415
    mine = []
    for s in sels:
        slim = Selection(dataclasses.replace(s.rollout, states=[s.rollout.states[i] for i in s.states]),
                         list(range(len(s.states))), list(s.pairs))
        toks, lay = _row_pieces(slim, K, mcfg.clean_attention)[:2]
        mine.append((estimate_cost(len(toks), int(lay.mask().sum()), mcfg), slim))
    every: list = [None] * world
    dist.all_gather_object(every, mine)
    flat = [x for part in every for x in part]
    groups = karmarkar_karp([c for c, _ in flat], world)
    return [flat[i][1] for i in groups[rank]]


def _micro_batches(sels: list, budget: int, K: int) -> list[list]:
    """Selections in order, cut into groups of about ``budget`` packed tokens each (a response's
    row is its prompt, its clean response and K tokens per state); ``budget`` 0: one group."""
    if budget <= 0:
        return [sels]
    groups, cur, n = [], [], 0
    for s in sels:
        r = s.rollout
        size = len(r.prompt) + len(r.response) + K * len(s.states)
        if cur and n + size > budget:
            groups.append(cur)
            cur, n = [], 0
        cur.append(s)
        n += size
    return groups + [cur] if cur else groups


def train_orl(cfg: ORLConfig, resume: bool = True, stop_after: int | None = None, quiet: bool = False,
              on_eval=None, resume_from: str | None = None, allow_config_change: bool = False,
              loggers: tuple[str, ...] = ("tensorboard",)) -> str:
    """Run (or resume) ORL; returns the final model directory (``out/final``). ``resume_from``,
    ``allow_config_change``, ``loggers``: as `orl.train.sft.train_sft`."""
    tr = ORLTrainer(cfg, resume=resume, resume_from=resume_from, allow_config_change=allow_config_change)
    try:
        return _orl_loop(tr, cfg, stop_after, quiet, on_eval, loggers)
    finally:
        tr.close()



NO_VERIFIED_WARN = 0.25  # share of steps without a verified rollout above which the loop warns


def _steps_without_update(run_dir: str, step: int) -> int:
    """Of the steps <= ``step`` logged in ``run_dir/metrics.jsonl`` (a resumed run's earlier steps), those
    that did not update (no ``loss``: no verified rollout to replay)."""
    import json  # noqa: PLC0415
    path = os.path.join(run_dir, "metrics.jsonl")
    if not step or not os.path.exists(path):
        return 0
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return sum(1 for r in rows if r.get("step", 0) <= step and "loss" not in r)


def _no_verified_warning(n: int, steps: int, cfg: ORLConfig) -> str:
    return (f"warning: {n} of {steps} ORL steps ({100 * n / steps:.0f} %) had no verified rollout, so they did not "
            f"update the model: the start model rarely solves task {cfg.task!r}. Give it more SFT, more rollouts per "
            f"step (--set group_size={2 * cfg.group_size}), or check the verifier on its completions "
            f"(`orl eval heldout --model {cfg.init} --task {cfg.task} --show 5`)")


def _orl_loop(tr: ORLTrainer, cfg: ORLConfig, stop_after: int | None, quiet: bool, on_eval,
              loggers: tuple[str, ...] = ("tensorboard",)) -> str:
    from tqdm import tqdm  # noqa: PLC0415
    from ..eval.heldout import evaluate  # noqa: PLC0415
    from .loggers import Loggers, open_loggers  # noqa: PLC0415

    rank = tr.rank
    log = Loggers()
    if rank == 0:
        log = open_loggers(loggers, cfg.out, "orl", cfg, tr.step_i,
                           metrics=("orl/reward", "orl/tpf", "orl/eval_accuracy", "orl/eval_tpf"))
    no_update = _steps_without_update(cfg.out, tr.step_i) if rank == 0 else 0
    warned = False
    bar = tqdm(total=cfg.steps, initial=tr.step_i, desc="orl", disable=quiet or rank != 0, dynamic_ncols=True)
    while tr.step_i < cfg.steps and not tr.guard["stopped"]:
        lr = cfg.lr * lr_factor(tr.step_i, cfg) * tr.guard["lr_scale"]
        m = tr.step()
        step = tr.step_i
        no_update += "loss" not in m
        share = no_update / step
        # the guard before the eval, so the eval scores the weights that go on
        if cfg.guard_every and (step % cfg.guard_every == 0 or step == cfg.steps):
            m.update(tr.guard_check())
            if not m["guard_ok"] and rank == 0:
                g = tr.guard
                bar.write(f"guard: step {step} accuracy {100 * m['guard_accuracy']:.1f} % on {cfg.guard_n} problems is "
                          f"more than {100 * cfg.guard_drop:.1f} points below {100 * g['ref']:.1f} %: restored the "
                          f"weights of step {g['good_step']}" + (f", stopping after {g['trips']} trips" if g["stopped"]
                                                                 else f", LR x {g['lr_scale']:g}"), file=sys.stderr)
        if cfg.eval_every and (step % cfg.eval_every == 0 or step == cfg.steps):
            em = tr.eval_model()  # every rank: unsharding is a collective; rank 0 evaluates
            if rank == 0:
                em.eval()
                ev = evaluate(em, tr.tok, tr.task, tr.task.problems("test")[:cfg.eval_n], cfg.eval_decode or
                              dataclasses.replace(cfg.decode, temperature=0.0), chat=cfg.chat,
                              reward_errors=cfg.reward_errors, verifier=tr.verifier)
                m.update({f"eval_{k}": v for k, v in ev.items() if k in ("accuracy", "tpf", "tpf_no_commit",
                                                                          "steps_per_block", "n_errors")})
                if on_eval:
                    on_eval(step, ev)
        if rank == 0:  # one record per step: the log was cut back to the resumed step
            run_state = {"lr": lr, "no_verified_share": share, "steps_without_update": no_update}
            tr.run.log({"step": step, **m, "run": run_state})
            bar.update(1)
            bar.set_postfix(reward=f"{m['reward']:.2f}", tpf=f"{m['tpf']:.2f}",
                            loss=f"{m['loss']:.3f}" if "loss" in m else "-", no_verified=f"{100 * share:.0f}%",
                            verify_err=m["reward_errors"])
            if step % cfg.log_every == 0:
                log.log("orl", {**m, "lr": lr, "no_verified_share": share}, step)
            if not warned and share > NO_VERIFIED_WARN and 10 <= step < cfg.steps:  # (the end says it again)
                warned = True
                bar.write(_no_verified_warning(no_update, step, cfg), file=sys.stderr)
        if step % cfg.save_every == 0 or step == cfg.steps or tr.guard["stopped"]:
            tr.save()
        if stop_after is not None and step >= stop_after:
            break
    bar.close()
    log.close()
    if rank == 0 and tr.step_i and no_update / tr.step_i > NO_VERIFIED_WARN:
        print(_no_verified_warning(no_update, tr.step_i, cfg), file=sys.stderr, flush=True)
    final = os.path.join(cfg.out, "final")
    if tr.step_i >= cfg.steps or tr.guard["stopped"]:
        fm = tr.eval_model()
        if rank == 0:
            save_pretrained(fm, final, tokenizer=tr.tok)
    return final
