"""The held-out accuracy guard of an ORL run (docs/method.md 3.10): check, keep the last good weights, restore.

`GuardMixin` is a part of `orl.train.loop.ORLTrainer` (it uses the trainer's ``cfg``, ``model``, ``opt``,
``task``, ``tok``, ``verifier``, ``step_i``, ``world``, ``train_problems``, ``device`` and ``eval_model``);
the loop calls `guard_check` every ``guard_every`` steps and `save` stores ``self.guard`` in each
checkpoint. Does not own: when the loop checks (`orl.train.loop._orl_loop`), the LR schedule.
"""
from __future__ import annotations

import copy
import dataclasses

import torch

GUARD_OFFSET = 1 << 40  # the guard's problems: train-stream indices from here on (a run samples from 0 up)


class GuardMixin:
    def _guard_init(self, st: dict) -> None:
        """The guard's state: from the checkpoint, or (a fresh run) the start model's accuracy on the
        guard's problems and a copy of its weights and AdamW state as the last weights that passed."""
        self.guard = {"ref": None, "start": None, "good_step": 0, "good_acc": None, "trips": 0, "lr_scale": 1.0,
                      "stopped": False}
        self._good, self._good_is_current = None, False
        if not self.cfg.guard_every:
            return
        if self.world > 1:
            raise ValueError("guard_every > 0 needs one process (its copy of the last good weights is not sharded); "
                             "run without torchrun or set guard_every=0")
        saved = st.get("guard")
        if saved is None:  # a fresh run (or a guard switched on at a resume): the reference is these weights
            acc = self.guard_accuracy()
            self.guard.update(ref=acc, start=acc, good_step=self.step_i, good_acc=acc)
            self._good = self._snapshot()
            return
        good = saved.pop("good")
        self.guard.update(saved)
        self._good = self._snapshot() if good == "current" else good
        self._good_is_current = good == "current"

    def _snapshot(self) -> tuple[dict, dict]:
        self._good_is_current = True
        return ({k: v.detach().clone() for k, v in self.model.state_dict().items()},
                copy.deepcopy(self.opt.state_dict()))

    def guard_problems(self) -> list:
        """The guard's problems: ``guard_n`` of the train stream far beyond any index a run samples
        (`GUARD_OFFSET`), so never trained on and never the task's held-out split; a task without
        ``sample``: the last ``guard_n`` of its held-out split (keep ``eval_n`` below the rest)."""
        if self.train_problems:
            return [self.task.sample("train", GUARD_OFFSET + j) for j in range(self.cfg.guard_n)]
        return self.task.problems("test")[-self.cfg.guard_n:]

    def guard_accuracy(self) -> float:
        """This step's weights' accuracy on the guard's problems, decoded with the eval decoder (greedy
        unless ``eval_decode`` says otherwise), under a forked RNG: the run's randomness is untouched."""
        from ..eval.heldout import evaluate  # noqa: PLC0415
        cfg = self.cfg
        if not hasattr(self, "_guard_set"):
            self._guard_set = self.guard_problems()
        model = self.eval_model()
        was = model.training
        model.eval()
        cuda = str(self.device).startswith("cuda")
        with torch.random.fork_rng(devices=[torch.device(self.device).index or torch.cuda.current_device()] if cuda
                                   else []):
            ev = evaluate(model, self.tok, self.task, self._guard_set,
                          cfg.eval_decode or dataclasses.replace(cfg.decode, temperature=0.0), chat=cfg.chat,
                          reward_errors=cfg.reward_errors, verifier=self.verifier)
        model.train(was)
        return float(ev["accuracy"])

    def guard_check(self) -> dict:
        """Evaluate the guard now (after this step's update). Passing (accuracy >= reference -
        ``guard_drop``): these weights become the last good ones (with ``guard_ref="best"`` a new best
        raises the reference). Failing: the last good weights and their AdamW state come back, the LR
        scale is multiplied by ``guard_lr_factor``, and after ``guard_max_trips`` failures the run
        stops (``self.guard["stopped"]``). Returns the metrics of the check."""
        cfg, g = self.cfg, self.guard
        acc = self.guard_accuracy()
        ok = acc >= g["ref"] - cfg.guard_drop - 1e-12
        if ok:
            g.update(good_step=self.step_i, good_acc=acc)
            if cfg.guard_ref == "best":
                g["ref"] = max(g["ref"], acc)
            self._good = self._snapshot()
        else:
            self.model.load_state_dict(self._good[0])
            self.opt.load_state_dict(copy.deepcopy(self._good[1]))
            self._good_is_current = True
            g["trips"] += 1
            g["lr_scale"] *= cfg.guard_lr_factor
            g["stopped"] = g["trips"] >= cfg.guard_max_trips
        return {"guard_accuracy": acc, "guard_ok": float(ok), "guard_trips": g["trips"],
                "guard_lr_scale": g["lr_scale"], "guard_good_step": g["good_step"]}
