"""Where a training run's numbers go besides its progress bar: TensorBoard, optionally Weights & Biases,
and the run's resolved config.

`open_loggers` opens the loggers a run asked for (``--logger tensorboard,wandb``; rank 0 only):

* ``tensorboard``: event files in ``OUT/tb`` (``purge_step``: the steps a resumed run re-runs are
  hidden), the run's config as TensorBoard hparams (flattened: ``loss.rho``, ``stages.0.lr``), tied
  to the metrics the loop names, so the HParams tab lists runs side by side;
* ``wandb``: ``wandb.init(project=$WANDB_PROJECT or "orl", name=basename(OUT), dir=OUT, config=the
  run's config, id=..., resume="allow")``; the id is kept in ``OUT/wandb_id`` so a resumed run goes
  on in the same W&B run. ``WANDB_MODE=offline`` writes under ``OUT/wandb`` with no network
  (``wandb sync`` uploads it later). An optional extra: ``pip install 'orl[wandb]'``.

`write_resolved_config` writes ``OUT/resolved_config.json``: the config the run actually uses
(recipe + ``--set`` + ``--task``), with the process's command line (``argv``), the orl version and
the time -- what to read to repeat a run. Each start of a run rewrites it; checkpoints keep the
config they were written with in their own ``meta.json``.

Metric values that are not finite numbers (a stage name, a nested block) are skipped by the loggers.
Does not own: what the metrics are (the loops), ``metrics.jsonl`` (`orl.train.checkpoint.RunDir.log`).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import secrets
import sys
import time

LOGGERS = ("tensorboard", "wandb", "none")


def parse_loggers(spec: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """``"tensorboard,wandb"`` -> ("tensorboard", "wandb"), checked before any work: an unknown name,
    or ``wandb`` without the package, is a ValueError that names the fix. ``none``: no logger."""
    names = [n.strip() for n in (spec.split(",") if isinstance(spec, str) else spec) if n.strip()]
    bad = [n for n in names if n not in LOGGERS]
    if bad:
        raise ValueError(f"--logger {','.join(bad)}: unknown; choose from {', '.join(LOGGERS)} (comma-separated)")
    if "wandb" in names:
        import importlib.util  # noqa: PLC0415
        if "wandb" not in sys.modules and importlib.util.find_spec("wandb") is None:
            raise ValueError("--logger wandb, but the wandb package is not installed: pip install 'orl[wandb]' "
                             "(or pip install wandb); WANDB_MODE=offline logs without an account")
    return tuple(n for n in dict.fromkeys(names) if n != "none")


def flat_config(cfg) -> dict:
    """A config dataclass as one level of ``dotted.key -> value`` (numbers, strings, bools; lists of
    plain values and None as their JSON text), the form TensorBoard hparams take."""
    out = {}

    def walk(x, key: str) -> None:
        if isinstance(x, dict):
            for k, v in x.items():
                walk(v, f"{key}.{k}" if key else str(k))
        elif isinstance(x, list) and any(isinstance(v, dict | list) for v in x):
            for i, v in enumerate(x):
                walk(v, f"{key}.{i}")
        elif isinstance(x, bool | int | float | str):
            out[key] = x
        else:
            out[key] = json.dumps(x, default=str)

    walk(_plain(cfg), "")
    return out


def _plain(cfg) -> dict:
    d = dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else dict(cfg)
    return json.loads(json.dumps(d, default=str))


def write_resolved_config(out: str, kind: str, cfg) -> str:
    """Write ``OUT/resolved_config.json`` (atomically); returns its path."""
    from ..cli import version  # noqa: PLC0415
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "resolved_config.json")
    record = {"kind": kind, "config": _plain(cfg), "argv": list(sys.argv), "orl_version": version(),
              "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
    return path


class Loggers:
    """The open loggers of one run: `log` a step's metrics under a prefix, `close` at the end."""

    def __init__(self, tensorboard=None, wandb_run=None):
        self.tensorboard, self.wandb_run = tensorboard, wandb_run

    def log(self, prefix: str, metrics: dict, step: int) -> None:
        values = {f"{prefix}/{k}": float(v) for k, v in metrics.items()
                  if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)}
        if self.tensorboard is not None:
            for k, v in values.items():
                self.tensorboard.add_scalar(k, v, step)
        if self.wandb_run is not None and values:
            self.wandb_run.log(values, step=step)

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()
        self.tensorboard = self.wandb_run = None


def open_loggers(names: tuple[str, ...] | list[str], out: str, kind: str, cfg, step: int,
                 metrics: tuple[str, ...] = ()) -> Loggers:
    """The loggers ``names`` for run directory ``out`` (a ``kind`` run: "sft", "orl"), resuming at
    ``step``; ``metrics``: the tags the hparams view shows beside the config (e.g. "orl/reward")."""
    names = parse_loggers(list(names))
    tb = run = None
    if "tensorboard" in names:
        try:
            from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415
        except ImportError as e:  # tensorboard missing: the bar (and metrics.jsonl) still have every number
            print(f"warning: no TensorBoard logs ({e}); pip install tensorboard", file=sys.stderr)
        else:
            tb = SummaryWriter(os.path.join(out, "tb"), purge_step=step + 1)  # hides steps re-run
            _write_hparams(tb, flat_config(cfg), metrics)
    if "wandb" in names:
        import wandb  # noqa: PLC0415
        id_path = os.path.join(out, "wandb_id")
        run_id = open(id_path).read().strip() if os.path.exists(id_path) else ""
        if not run_id:
            run_id = secrets.token_hex(4)
            os.makedirs(out, exist_ok=True)
            with open(id_path, "w") as f:
                f.write(run_id + "\n")
        run = wandb.init(project=os.environ.get("WANDB_PROJECT", "orl"), name=os.path.basename(os.path.abspath(out)),
                         dir=out, config={"kind": kind, **_plain(cfg)}, id=run_id, resume="allow", job_type=kind)
    return Loggers(tb, run)


def _write_hparams(writer, hparams: dict, metrics: tuple[str, ...]) -> None:
    """The hparams plugin's three summaries, in the run's own event file (SummaryWriter.add_hparams
    would open a separate run folder per call)."""
    from torch.utils.tensorboard.summary import hparams as hp_summaries  # noqa: PLC0415
    exp, ssi, sei = hp_summaries(hparams, {m: 0.0 for m in metrics})
    for s in (exp, ssi, sei):
        writer.file_writer.add_summary(s)
