"""Accuracy-vs-TPF frontiers: a speed-up claim as a curve, not a point.

One decoder setting says little: a lower threshold buys TPF for accuracy, so a model can look
faster only because it is read at a faster setting. Here each model is swept over its family
decoder's knob (`sweep`: one `orl.eval.heldout.evaluate` per value), the upper (Pareto) frontier of
its (TPF, accuracy) points is taken, and two models are compared on their frontiers:

* the headline **frontier gain** (`frontier_gain`): with L = the base's best accuracy - 1 point,
  gain = (largest TPF at which the model's frontier reaches L) / (the same for the base), the
  frontiers read as piecewise-linear curves (`tpf_at`); plus the accuracy gain at the TPF of the
  base's most accurate setting (`acc_at`);
* its percentile interval from a paired bootstrap over problems (`bootstrap_gain`);
* per setting: a Wilson interval on accuracy, TPF with and without the commit forward
  (`orl.decode.tpf`), mean completion length and the share of filler tokens (`filler_share`:
  a TPF gain made of whitespace is not a gain).

Everything numerical is a pure function of points or per-problem records; `sweep` runs models and
`plot` writes a PNG. Does not own: decoding, verification or token/forward counting
(`orl.eval.heldout`, `orl.decode.tpf`), the demo's or the CLI's printing.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence

from ..decode import DecodeConfig

_EPS = 1e-9  # accuracies are ratios of small integers: 0.92 - 0.01 must still "reach" 91/100

# rule -> the DecodeConfig field swept (docs/method.md 1.4). "llada" also moves edit_threshold (`with_knob`).
KNOBS = {"threshold": "threshold", "llada": "threshold", "topk": "steps", "entropy": "entropy_bound",
         "dgemma": "entropy_bound"}
# Default grids: wide enough to show where each family's accuracy starts to fall. A higher threshold is
# slower; a higher entropy bound is faster. The protocol's own value is always added (`knob_grid`).
GRIDS = {"threshold": (0.1, 0.2, 0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95), "llada": (0.5, 0.7, 0.8, 0.9, 0.95),
         "entropy": (0.1, 0.2, 0.35, 0.7, 1.5), "dgemma": (0.02, 0.05, 0.1, 0.2, 0.5, 1.0)}


# ---------------------------------------------------------------- intervals and frontiers
def wilson(k: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion k / n (z = 1.96: 95 %); (0, 1) when n = 0."""
    if n <= 0:
        return 0.0, 1.0
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, mid - half), min(1.0, mid + half)


def pareto(points: Iterable[Sequence[float]]) -> list[tuple[float, float]]:
    """The upper frontier of (tpf, accuracy) points, sorted by TPF (so accuracy strictly falls).

    A point is on it unless another point has >= TPF and >= accuracy with one of them strictly
    greater; of identical points one is kept. Points with TPF None are ignored."""
    pts = sorted({(float(t), float(a)) for t, a in points if t is not None}, key=lambda p: (-p[0], -p[1]))
    out, best = [], -math.inf
    for t, a in pts:  # fastest first: keep a point only if it beats every faster one
        if a > best:
            out.append((t, a))
            best = a
    return out[::-1]


def tpf_at(frontier: Iterable[Sequence[float]], acc: float) -> float | None:
    """The largest TPF at which the frontier reaches accuracy >= ``acc``.

    The frontier (`pareto` is applied) is read as the piecewise-linear curve through its points
    (t_0, a_0) ... (t_m, a_m), t rising and a falling. None when acc > a_0 (never reached); t_m when
    a_m >= acc (no extrapolation past the fastest measured setting); otherwise, on the segment with
    a_i >= acc > a_{i+1}: t_i + (a_i - acc) / (a_i - a_{i+1}) * (t_{i+1} - t_i)."""
    f = pareto(frontier)
    if not f or acc > f[0][1] + _EPS:
        return None
    if f[-1][1] >= acc - _EPS:
        return f[-1][0]
    for (t0, a0), (t1, a1) in zip(f, f[1:]):
        if a0 >= acc - _EPS and acc > a1:
            return t0 + (a0 - acc) / (a0 - a1) * (t1 - t0)
    return None  # unreachable: the segments cover [a_m, a_0]


def acc_at(frontier: Iterable[Sequence[float]], tpf: float) -> float | None:
    """Frontier accuracy at ``tpf``, linearly interpolated between its points; None outside
    [t_0, t_m] (the slowest and fastest frontier points)."""
    f = pareto(frontier)
    if not f or tpf < f[0][0] - _EPS or tpf > f[-1][0] + _EPS:
        return None
    if len(f) == 1 or tpf <= f[0][0]:
        return f[0][1]
    for (t0, a0), (t1, a1) in zip(f, f[1:]):
        if tpf <= t1 + _EPS:
            return a0 + (min(tpf, t1) - t0) / (t1 - t0) * (a1 - a0)
    return f[-1][1]


def _gain(base_f, model_f, drop: float) -> tuple[float | None, float, float, float | None]:
    """(gain, level, base TPF at level, model TPF at level) of two frontiers (see `frontier_gain`)."""
    level = base_f[0][1] - drop
    b, m = tpf_at(base_f, level), tpf_at(model_f, level)
    return (m / b if m is not None and b else None), level, b, m


def frontier_gain(base_points, model_points, drop: float = 0.01) -> dict:
    """Compare two models' (tpf, accuracy) points on their frontiers.

    ``level`` = the base's best accuracy - ``drop``; ``gain`` = tpf_at(model, level) /
    tpf_at(base, level) (`tpf_at`); None when the model's frontier never reaches the level (then
    ``note`` says so: no TPF of the model matches the base's accuracy). At the TPF of the base's
    most accurate setting (``base_best_tpf``) the model's frontier accuracy is ``acc_at``; when that
    TPF is below the model's slowest frontier point, the model's best accuracy is used (it is
    reached at a higher TPF, which is no slower); None when it is above the model's fastest.
    ``acc_gain_points`` = 100 (that accuracy - the base's best). ``base_capped`` / ``model_capped``:
    that model's frontier still reaches the level at its fastest swept setting, so its TPF there is
    a lower bound (a capped model makes the gain a lower bound, a capped base an upper bound;
    ``note`` says so: sweep to faster settings). Both frontiers come back as [tpf, accuracy] lists."""
    bf, mf = pareto(base_points), pareto(model_points)
    if not bf or not mf:
        raise ValueError("frontier_gain needs at least one (tpf, accuracy) point per model")
    gain, level, b_tpf, m_tpf = _gain(bf, mf, drop)
    best_tpf, best = bf[0]
    acc_m = acc_at(mf, best_tpf)
    if acc_m is None and best_tpf < mf[0][0]:
        acc_m = mf[0][1]
    b_cap = bf[-1][1] >= level - _EPS
    m_cap = m_tpf is not None and mf[-1][1] >= level - _EPS
    notes = []
    if m_tpf is None:
        notes.append(f"the model never reaches accuracy {level:.4f} (its best is {mf[0][1]:.4f}): no gain "
                     "at the base's accuracy")
    if m_cap:
        notes.append("the model is at the level at its fastest setting: the gain is a lower bound")
    if b_cap:
        notes.append("the base is at the level at its fastest setting: the gain is an upper bound")
    return {"gain": gain, "level": level, "drop": drop, "base_tpf": b_tpf, "model_tpf": m_tpf,
            "base_best_accuracy": best, "base_best_tpf": best_tpf, "model_best_accuracy": mf[0][1],
            "model_accuracy_at_base_tpf": acc_m,
            "acc_gain_points": None if acc_m is None else 100 * (acc_m - best),
            "base_capped": b_cap, "model_capped": m_cap,
            "base_frontier": [list(p) for p in bf], "model_frontier": [list(p) for p in mf], "note": "; ".join(notes)}


# ---------------------------------------------------------------- bootstrap over problems
def _arrays(settings: list[list[dict]], ids: list, commit: bool):
    """Per setting: (correct, n_tokens, forwards) arrays over ``ids``; forwards from ``steps_per_block``
    (`orl.decode.tpf.forwards`) when a record lacks them."""
    import numpy as np  # noqa: PLC0415

    from ..decode.tpf import forwards  # noqa: PLC0415
    fkey = "forwards" if commit else "forwards_no_commit"
    out = []
    for recs in settings:
        by = {r["id"]: r for r in recs}
        fwd = [by[i][fkey] if fkey in by[i] else forwards(by[i]["steps_per_block"], commit) for i in ids]
        out.append((np.array([float(by[i]["correct"]) for i in ids]), np.array([by[i]["n_tokens"] for i in ids]),
                    np.array(fwd)))
    return out


def bootstrap_gain(base_settings: list[list[dict]], model_settings: list[list[dict]], drop: float = 0.01,
                   n_boot: int = 1000, seed: int = 0, ci: float = 0.95, commit: bool = True) -> dict:
    """Percentile interval of `frontier_gain`'s gain from a paired bootstrap over problems.

    ``*_settings``: one list of per-problem records per swept setting (``id``, ``correct``,
    ``n_tokens``, and ``forwards`` / ``forwards_no_commit`` or ``steps_per_block``:
    `orl.eval.heldout.evaluate`'s records); problems are matched by ``id``.
    Each of ``n_boot`` resamples draws problem indices with replacement (numpy, ``seed``), the same
    draw for every setting of both models, recomputes every setting's accuracy and TPF (tokens /
    forwards over the resample), then the gain. A resample where the model never reaches the level
    counts as gain 0 (no TPF reaches it) and is counted in ``n_unreached``."""
    import numpy as np  # noqa: PLC0415
    sets = list(base_settings) + list(model_settings)
    ids = [r["id"] for r in sets[0]]
    common = set(ids).intersection(*({r["id"] for r in s} for s in sets[1:]))
    ids = [i for i in ids if i in common]
    if not ids:
        raise ValueError("bootstrap_gain: the settings share no problem ids")
    arr = _arrays(sets, ids, commit)
    idx = np.random.default_rng(seed).integers(0, len(ids), size=(n_boot, len(ids)))
    acc = [c[idx].mean(1) for c, _, _ in arr]
    tpf = [n[idx].sum(1) / np.maximum(f[idx].sum(1), 1) for _, n, f in arr]
    nb = len(base_settings)
    gains, unreached = [], 0
    for b in range(n_boot):
        pts = [(tpf[s][b], acc[s][b]) for s in range(len(sets))]
        g = _gain(pareto(pts[:nb]), pareto(pts[nb:]), drop)[0]
        unreached += g is None
        gains.append(0.0 if g is None else g)
    lo, hi = np.percentile(gains, [100 * (1 - ci) / 2, 100 * (1 + ci) / 2])
    return {"lo": float(lo), "hi": float(hi), "ci": ci, "n_boot": n_boot, "seed": seed, "n_problems": len(ids),
            "n_unreached": unreached}


# ---------------------------------------------------------------- TPF honesty
def _is_separator(piece: str) -> bool:
    s = piece.strip()
    return bool(s) and not any(c.isalnum() for c in s)


def filler_mask(pieces: Sequence[str]) -> list[bool]:
    """Which tokens of one completion are filler: a token whose text is whitespace only, or a
    separator (text with no letter or digit, e.g. ``;`` ``.`` ``**``) equal, up to surrounding
    whitespace, to the previous non-whitespace token with only whitespace between (``;;;`` has
    two filler tokens, ``;`` after ``15`` none)."""
    out, prev = [], None
    for p in pieces:
        if p.isspace():
            out.append(True)
            continue
        out.append(prev is not None and _is_separator(p) and p.strip() == prev.strip())
        prev = p
    return out


def filler_share(completions: Iterable[str | Sequence[str]]) -> dict:
    """Share of generated tokens that are filler (`filler_mask`) and the mean completion length.

    Each completion is its list of token texts (a str: its characters, i.e. the character
    tokenizer's tokens). Returns ``share`` (filler / tokens; 0.0 when there are none),
    ``mean_length`` (tokens per completion), ``filler``, ``tokens`` and ``n``. Whitespace-only
    tokens are legitimate in code (indentation); there the share is a reading aid, not a defect count."""
    n = tokens = filler = 0
    for c in completions:
        m = filler_mask(list(c))
        n, tokens, filler = n + 1, tokens + len(m), filler + sum(m)
    return {"share": filler / tokens if tokens else 0.0, "mean_length": tokens / n if n else 0.0,
            "filler": filler, "tokens": tokens, "n": n}


# ---------------------------------------------------------------- the sweep
def knob_grid(dcfg: DecodeConfig, values: Iterable[float] | None = None) -> list[float]:
    """The knob values to sweep: ``values`` (default: the rule's `GRIDS`, for "topk" K, K/2, K/4,
    K/8 steps) plus ``dcfg``'s own setting, deduplicated and sorted."""
    if dcfg.rule not in KNOBS:
        raise ValueError(f"no sweepable knob for rule {dcfg.rule!r}; rules: {sorted(KNOBS)}")
    if values is None:
        K = dcfg.block_size
        values = GRIDS.get(dcfg.rule) or tuple(max(1, K // d) for d in (1, 2, 4, 8))
    own = getattr(dcfg, KNOBS[dcfg.rule]) if KNOBS[dcfg.rule] != "steps" else dcfg.max_steps
    return sorted({round(float(v), 6) for v in (*values, own)})


def with_knob(dcfg: DecodeConfig, value: float) -> DecodeConfig:
    """``dcfg`` with its rule's knob at ``value``. For "llada" the editing threshold moves with the
    mask->token threshold, keeping their ratio (0.9 / 0.95 in the published protocol), capped at 1."""
    field = KNOBS.get(dcfg.rule)
    if field is None:
        raise ValueError(f"no sweepable knob for rule {dcfg.rule!r}; rules: {sorted(KNOBS)}")
    if field == "steps":
        return dataclasses.replace(dcfg, steps=int(value))
    over = {field: float(value)}
    if dcfg.rule == "llada":
        over["edit_threshold"] = min(1.0, dcfg.edit_threshold * float(value) / dcfg.threshold)
    return dataclasses.replace(dcfg, **over)


def sweep(model, tokenizer, task, problems, base_dcfg: DecodeConfig, knob_values: Iterable[float] | None = None,
          batch_size: int = 64, chat: bool = False) -> list[dict]:
    """One `orl.eval.heldout.evaluate` per knob value (`knob_grid`, `with_knob`); per setting a row:
    ``knob``, ``value``, ``accuracy``, ``ci`` (Wilson 95 %), ``n``, ``tpf``, ``tpf_no_commit``,
    ``steps_per_block``, ``mean_length``, ``filler_share``, ``seconds``, ``decode`` and the
    per-problem ``records`` (for `bootstrap_gain`)."""
    from .heldout import evaluate  # noqa: PLC0415
    piece: dict[int, str] = {}

    def text(i: int) -> str:
        if i not in piece:
            piece[i] = tokenizer.decode([i])
        return piece[i]

    rows = []
    for v in knob_grid(base_dcfg, knob_values):
        dcfg = with_knob(base_dcfg, v)
        r = evaluate(model, tokenizer, task, problems, dcfg, batch_size=batch_size, chat=chat)
        k = sum(float(x["correct"]) for x in r["records"])
        fs = filler_share([text(i) for i in x["token_ids"]] for x in r["records"])
        rows.append({"knob": KNOBS[dcfg.rule], "value": v, "accuracy": r["accuracy"], "ci": list(wilson(k, r["n"])),
                     "n": r["n"], "tpf": r["tpf"], "tpf_no_commit": r["tpf_no_commit"],
                     "steps_per_block": r["steps_per_block"], "mean_length": fs["mean_length"],
                     "filler_share": fs["share"], "seconds": r["seconds"], "decode": dcfg.to_dict(),
                     "records": r["records"]})
    return rows


def points(rows: list[dict], commit: bool = True) -> list[tuple[float, float]]:
    """(tpf, accuracy) of each sweep row; ``commit=False``: TPF without the commit forward."""
    return [(r["tpf" if commit else "tpf_no_commit"], r["accuracy"]) for r in rows]


def frontier_block(base_rows: list[dict], model_rows: list[dict], drop: float = 0.01, n_boot: int = 1000,
                   seed: int = 0, names: tuple[str, str] = ("base", "orl")) -> dict:
    """The ``frontier`` block of a summary: `frontier_gain` with TPF counting the commit forward,
    its bootstrap interval ``gain_ci``, the same gain without the commit forward (``no_commit``), and
    both curves (sweep rows without their records) under ``curves``."""
    block = frontier_gain(points(base_rows), points(model_rows), drop)
    boot = bootstrap_gain([r["records"] for r in base_rows], [r["records"] for r in model_rows], drop, n_boot, seed)
    block["gain_ci"] = [boot["lo"], boot["hi"]]
    block["bootstrap"] = boot
    nc = frontier_gain(points(base_rows, False), points(model_rows, False), drop)
    block["no_commit"] = {k: nc[k] for k in ("gain", "level", "base_tpf", "model_tpf", "base_capped", "model_capped",
                                             "base_frontier", "model_frontier", "note")}
    block["models"] = list(names)
    block["curves"] = {n: [{k: v for k, v in r.items() if k != "records"} for r in rows]
                       for n, rows in zip(names, (base_rows, model_rows))}
    return block


# ---------------------------------------------------------------- reports
def table(block: dict) -> str:
    """Markdown: one line per model and setting of ``frontier_block``'s curves."""
    lines = ["| model | knob | accuracy (95 % CI) | TPF | TPF no commit | mean length | filler | frontier |",
             "|---|---|---|---|---|---|---|---|"]
    fronts = dict(zip(block["models"], (block["base_frontier"], block["model_frontier"])))
    for name, rows in block["curves"].items():
        on = {(round(t, 9), round(a, 9)) for t, a in fronts[name]}
        for r in rows:
            mark = "*" if (round(r["tpf"], 9), round(r["accuracy"], 9)) in on else ""
            lo, hi = r["ci"]
            lines.append(f"| {name} | {r['knob']} {r['value']:g} | {100 * r['accuracy']:.1f} % "
                         f"({100 * lo:.1f}-{100 * hi:.1f}) | {r['tpf']:.2f} | {r['tpf_no_commit']:.2f} | "
                         f"{r['mean_length']:.1f} | {100 * r['filler_share']:.1f} % | {mark} |")
    return "\n".join(lines)


def headline(block: dict) -> str:
    """One line: the frontier gain at its level with the bootstrap interval, and the accuracy gain."""
    lvl = 100 * block["level"]
    if block["gain"] is None:
        s = f"frontier gain: none at accuracy {lvl:.1f} % ({block['note']})"
    else:
        lo, hi = block.get("gain_ci") or (math.nan, math.nan)
        s = f"frontier gain {block['gain']:.2f}x at accuracy {lvl:.1f} % (CI {lo:.2f}-{hi:.2f})"
        nc = block.get("no_commit", {}).get("gain")
        if nc is not None:
            s += f", {nc:.2f}x without the commit forward"
    if block["acc_gain_points"] is not None:
        s += f"; {block['acc_gain_points']:+.1f} points at the base's TPF {block['base_best_tpf']:.2f}"
    if block["gain"] is not None and block["note"]:
        s += f" ({block['note']})"
    return s


def plot(curves: dict[str, list[dict]], path: str, block: dict | None = None) -> None:
    """PNG of accuracy (Wilson bars) vs TPF, one line per model through its frontier, all settings
    as points; left with the commit forward, right without; the level line and the gain annotated
    when ``block`` (`frontier_block`) is given."""
    import matplotlib  # noqa: PLC0415
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, commit in zip(axes, (True, False)):
        key = "tpf" if commit else "tpf_no_commit"
        for i, (name, rows) in enumerate(curves.items()):
            c = f"C{i}"
            t = [r[key] for r in rows]
            a = [100 * r["accuracy"] for r in rows]
            err = [[100 * (r["accuracy"] - r["ci"][0]) for r in rows],
                   [100 * (r["ci"][1] - r["accuracy"]) for r in rows]]
            ax.errorbar(t, a, yerr=err, fmt="o", color=c, alpha=0.5, capsize=2)
            for r, x, y in zip(rows, t, a):
                ax.annotate(f"{r['value']:g}", (x, y), textcoords="offset points", xytext=(3, 3), fontsize=7, color=c)
            f = pareto(points(rows, commit))
            ax.plot([p[0] for p in f], [100 * p[1] for p in f], "-", color=c, label=f"{name} frontier")
        g = None if block is None else (block if commit else block.get("no_commit"))
        if g is not None:
            ax.axhline(100 * g["level"], color="gray", ls=":", lw=1, label=f"level {100 * g['level']:.1f} %")
            if g["gain"] is not None:
                y = 100 * g["level"]
                ax.annotate("", (g["model_tpf"], y), (g["base_tpf"], y), arrowprops=dict(arrowstyle="->", color="k"))
                ax.text((g["base_tpf"] + g["model_tpf"]) / 2, y, f"{g['gain']:.2f}x", ha="center", va="bottom")
        ax.set_xlabel("tokens per forward" + (" (with commit)" if commit else " (no commit)"))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower left")
    axes[0].set_ylabel("accuracy (%)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
