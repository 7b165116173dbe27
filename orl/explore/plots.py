"""`orl explore plot PATH ...`: PNGs beside the files people would otherwise read as numbers.

Owns reading three kinds of result and drawing each (matplotlib, Agg backend):

* a frontier: ``frontier.json`` (`orl eval frontier`) or any JSON holding a ``frontier`` block
  (the demo's ``summary.json``) -> accuracy vs TPF, drawn by `orl.eval.frontier.plot` (the one
  frontier plot; this module only finds the block);
* training curves: a run's ``metrics.jsonl`` (ORL / RFT: one record per step), or a run directory
  holding it or TensorBoard event files (SFT logs only those: ``tb/``) -> one panel per kind of
  number (losses, reward and accuracy, TPF, entropies, ...);
* the engine's per-round profile: the benchmark's ``engine_log.json`` (its ``*profile`` entries:
  rows ``[kind, kernels, ms]``) or its results markdown (the "### One round ..." tables) -> GPU time
  per kernel kind, one bar chart per profiled path.

``PATH.png`` is written next to ``PATH`` (``X.json`` -> ``X.png``, ``metrics.jsonl`` ->
``metrics.png``, a run directory -> ``DIR/curves.png``, a results table ``engine_results.md`` -> ``engine_results.profile.png``).
The readers (`frontier_block`, `training_series`, `profiles`) are pure functions of the files'
contents, tested with values written by hand. Does not own: the numbers (their producers) or
training numerics (nothing here runs in a trainer).
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re

# panels of the training curves: (title, test on a metric name), first match wins; the rest: one panel each
GROUPS: list[tuple[str, object]] = [
    ("loss", lambda k: k == "loss" or k.startswith("loss") or k.endswith("_loss")),
    ("reward / accuracy", lambda k: k in ("reward", "accuracy", "eval_accuracy", "eval_final_accuracy")),
    ("tokens per forward", lambda k: k in ("tpf", "tpf_no_commit", "eval_tpf", "eval_tpf_no_commit")),
    ("entropy", lambda k: "entropy" in k),
    ("cross-entropy", lambda k: k.startswith("ce")),
    ("throughput (tokens/s)", lambda k: k.endswith("tokens_per_s")),
]
MAX_PANELS = 12
_SKIP = {"step", "time", "seconds", "wall", "generation"}


# ---------------------------------------------------------------- readers (pure)
def frontier_block(d: dict) -> dict | None:
    """The frontier block of a frontier.json (itself) or of a summary (its ``frontier``), else None."""
    if isinstance(d, dict) and "curves" in d and "models" in d:
        return d
    if isinstance(d, dict) and isinstance(d.get("frontier"), dict) and "curves" in d["frontier"]:
        return d["frontier"]
    return None


def training_series(records: list[dict]) -> dict[str, tuple[list[float], list[float]]]:
    """metric name -> (steps, values) over records holding ``step``; non-numbers and NaN skipped;
    a step logged twice (a resumed run) keeps its last record."""
    by_step: dict[float, dict] = {}
    for r in records:
        if isinstance(r, dict) and isinstance(r.get("step"), (int, float)):
            by_step[r["step"]] = r
    series: dict[str, tuple[list, list]] = {}
    for step in sorted(by_step):
        for k, v in by_step[step].items():
            if k in _SKIP or isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                continue
            xs, ys = series.setdefault(k, ([], []))
            xs.append(step)
            ys.append(float(v))
    return series


def panels(names) -> list[tuple[str, list[str]]]:
    """Group metric names into (title, names) panels: `GROUPS` first, then one panel per other name,
    at most `MAX_PANELS` panels."""
    out: dict[str, list[str]] = {}
    for k in sorted(names):
        title = next((t for t, test in GROUPS if test(k)), k)
        out.setdefault(title, []).append(k)
    order = [t for t, _ in GROUPS if t in out] + sorted(t for t in out if t not in dict(GROUPS))
    return [(t, out[t]) for t in order][:MAX_PANELS]


def _ms(x) -> float | None:
    try:
        return float(str(x).strip())
    except ValueError:
        return None


def profile_rows(rows: list) -> dict:
    """One profile's rows ``[kind, kernels, ms]`` -> {"kinds": [(kind, ms)], "all": ms or None,
    "between": ms or None}; "top: ..." rows (single kernels, already inside their kind) are dropped."""
    kinds, total, between = [], None, None
    for r in rows:
        if len(r) < 3:
            continue
        name, ms = str(r[0]).strip(), _ms(r[2])
        if ms is None:
            continue
        plain = name.strip("*").strip()
        if plain.startswith("top:"):
            continue
        if plain.startswith("all kernels"):
            total = ms
        elif plain.startswith("between kernels"):
            between = ms
        else:
            kinds.append((plain, ms))
    return {"kinds": kinds, "all": total, "between": between}


def profiles(d) -> dict[str, dict]:
    """The profiles in an engine_log.json (keys ending in ``profile``: {path: rows} or rows), or in
    a results markdown (text: each "### One round ..." heading and the table under it)."""
    found: dict[str, dict] = {}
    if isinstance(d, str):
        lines = d.splitlines()
        for i, line in enumerate(lines):
            if not line.startswith("### One round"):
                continue
            title = re.sub(r"^### One round,?\s*", "", line).split(": GPU time")[0].strip() or line[4:]
            rows = []
            for row in lines[i + 1:]:
                if row.startswith("#"):
                    break
                if row.startswith("|") and not set(row) <= set("|-: "):
                    cells = [c.strip() for c in row.strip().strip("|").split("|")]
                    if cells[0] != "kind":
                        rows.append(cells)
            if rows:
                found[title] = profile_rows(rows)
        return found
    for key, v in (d or {}).items():
        if not key.endswith("profile"):
            continue
        items = v.items() if isinstance(v, dict) else [(key, v)]
        for name, rows in items:
            if isinstance(rows, list):
                found[f"{key}: {name}" if isinstance(v, dict) else key] = profile_rows(rows)
    return found


def read_tensorboard(tb_dir: str) -> list[dict]:
    """The scalars of TensorBoard event files under ``tb_dir`` as records {"step", tag: value} (the
    tag's ``sft/`` or ``orl/`` prefix dropped)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: PLC0415
    by_step: dict[int, dict] = {}
    for path in sorted(glob.glob(os.path.join(tb_dir, "**", "events.out.tfevents.*"), recursive=True)):
        acc = EventAccumulator(path, size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            for e in acc.Scalars(tag):
                by_step.setdefault(e.step, {"step": e.step})[tag.split("/", 1)[-1]] = e.value
    return [by_step[s] for s in sorted(by_step)]


def moving_average(ys: list[float], window: int) -> list[float]:
    """Trailing mean over the last ``window`` values (fewer at the start): same length as ``ys``."""
    out, acc = [], 0.0
    for i, y in enumerate(ys):
        acc += y
        if i >= window:
            acc -= ys[i - window]
        out.append(acc / min(i + 1, window))
    return out


# ---------------------------------------------------------------- drawing
def _plt():
    import matplotlib  # noqa: PLC0415
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    return plt


def plot_training(records: list[dict], path: str, title: str = "") -> None:
    """PNG of a run's training curves (`training_series`, `panels`)."""
    series = training_series(records)
    if not series:
        raise ValueError("no numeric metrics with a 'step' to plot (is this a trainer's metrics.jsonl?)")
    groups = panels(series)
    plt = _plt()
    cols = min(3, len(groups))
    rows = math.ceil(len(groups) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.0 * rows), squeeze=False)
    for ax, (name, keys) in zip(axes.flat, groups):
        for i, k in enumerate(keys):
            xs, ys = series[k]
            if len(xs) > 50:  # noisy per-step numbers: faint raw line, moving average on top
                ax.plot(xs, ys, "-", lw=0.8, alpha=0.25, color=f"C{i}")
                ax.plot(xs, moving_average(ys, max(5, len(ys) // 30)), "-", lw=1.5, color=f"C{i}", label=k)
            else:
                ax.plot(xs, ys, "o-", ms=3, lw=1.2, color=f"C{i}", label=k)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("step", fontsize=8)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=8)
        if len(keys) > 1 or keys[0] != name:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(groups):]:
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_profiles(profs: dict[str, dict], path: str) -> None:
    """PNG of per-round GPU time by kernel kind, one horizontal bar chart per profiled path."""
    if not profs:
        raise ValueError("no per-round profile found (engine_log.json '*profile' entries, or '### One round' "
                         "tables in a results markdown)")
    plt = _plt()
    fig, axes = plt.subplots(len(profs), 1, figsize=(9, 0.5 + sum(0.32 * (len(p["kinds"]) + 2) for p in
                                                                  profs.values())), squeeze=False)
    for ax, (name, p) in zip(axes[:, 0], profs.items()):
        labels = [k for k, _ in p["kinds"]] + (["between kernels"] if p["between"] is not None else [])
        vals = [v for _, v in p["kinds"]] + ([p["between"]] if p["between"] is not None else [])
        colors = ["C0"] * len(p["kinds"]) + (["0.6"] if p["between"] is not None else [])
        y = list(range(len(vals)))[::-1]
        ax.barh(y, vals, color=colors)
        ax.set_yticks(y, labels, fontsize=8)
        for yi, v in zip(y, vals):
            ax.text(v, yi, f" {v:.3f}", va="center", fontsize=7)
        total = p["all"] if p["all"] is not None else sum(v for _, v in p["kinds"])
        round_ms = total + (p["between"] or 0.0)
        ax.set_title(f"{name}: {round_ms:.3f} ms per round", fontsize=9)
        ax.set_xlabel("ms", fontsize=8)
        ax.set_xlim(0, max(vals) * 1.18 if vals else 1)
        ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_path(path: str, out: str | None = None) -> str:
    """Draw the PNG of one result file or run directory (module docstring); returns its path."""
    if os.path.isdir(path):
        metrics = os.path.join(path, "metrics.jsonl")
        if os.path.exists(metrics):
            records = _jsonl(metrics)
        elif glob.glob(os.path.join(path, "**", "events.out.tfevents.*"), recursive=True):
            records = read_tensorboard(path)
        else:
            raise FileNotFoundError(f"{path} holds neither metrics.jsonl nor TensorBoard event files")
        out = out or os.path.join(path, "curves.png")
        plot_training(records, out, title=os.path.normpath(path))
        return out
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} does not exist")
    stem = os.path.splitext(path)[0]
    if path.endswith(".jsonl"):
        out = out or stem + ".png"
        plot_training(_jsonl(path), out, title=os.path.normpath(os.path.dirname(path) or "."))
        return out
    if path.endswith(".md"):
        with open(path, encoding="utf-8") as f:
            profs = profiles(f.read())
        out = out or stem + ".profile.png"
        plot_profiles(profs, out)
        return out
    with open(path, encoding="utf-8") as f:
        try:
            d = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not JSON ({e}); plot takes frontier/summary JSON, metrics.jsonl, "
                             "engine_log.json or a results markdown") from None
    block = frontier_block(d)
    out = out or stem + ".png"
    if block is not None:
        from ..eval.frontier import plot  # noqa: PLC0415
        plot(block["curves"], out, block)
        return out
    profs = profiles(d)
    if profs:
        plot_profiles(profs, out)
        return out
    raise ValueError(f"{path}: no frontier block ('curves' and 'models', or a 'frontier' entry) and no "
                     "'*profile' entry; nothing to plot")


def _jsonl(path: str) -> list[dict]:
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    raise ValueError(f"{path}:{n} is not a JSON line") from None
    return out


def cli(argv: list[str]) -> int:
    from ..cli import HelpFormatter  # noqa: PLC0415
    ap = argparse.ArgumentParser(prog="orl explore plot", description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("paths", nargs="+", metavar="PATH",
                    help="frontier.json / summary.json, metrics.jsonl, a run directory, engine_log.json, results .md")
    ap.add_argument("--out", default=None, help="the PNG (one PATH only; default: beside PATH)")
    a = ap.parse_args(argv)
    if a.out and len(a.paths) > 1:
        raise ValueError("--out names one PNG; give one PATH with it")
    for p in a.paths:
        print(f"wrote {plot_path(p, a.out)}")
    return 0
