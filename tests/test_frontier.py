"""Frontier evaluation (`orl.eval.frontier`): Wilson intervals, the Pareto frontier, interpolation
on it and the frontier gain on hand-worked cases, the bootstrap's determinism, the filler share, a
tiny sweep equal to separate evaluations, and one token count (EOS included) in both evaluators."""
import dataclasses
import random

import pytest
import torch

from orl.decode import DecodeConfig, protocol
from orl.eval import frontier as F
from orl.eval.heldout import evaluate
from orl.model import build_model, get_config, save_pretrained
from orl.tasks.registry import get_task
from orl.tokenizer import build_char_tokenizer


def test_wilson_known_values():
    # 5/10: p = 0.5, z^2 = 3.8416: centre 0.5, half width 1.96 sqrt(0.025 + 0.009604) / 1.38416
    assert F.wilson(5, 10) == pytest.approx((0.23659, 0.76341), abs=1e-5)
    assert F.wilson(0, 10) == pytest.approx((0.0, 0.27754), abs=1e-5)  # z^2 / (n + z^2)
    assert F.wilson(10, 10) == pytest.approx((0.72246, 1.0), abs=1e-5)
    assert F.wilson(0, 0) == (0.0, 1.0)
    lo, hi = F.wilson(458, 500)
    assert lo < 458 / 500 < hi and hi - lo < 0.05


def test_pareto_drops_dominated_points_and_duplicates():
    pts = [(1, .9), (2, .8), (2, .85), (1.5, .9), (3, .5), (0.5, .95), (3, .5), (2.5, .7), (1, .6), (None, 1.0)]
    assert F.pareto(pts) == [(0.5, .95), (1.5, .9), (2, .85), (2.5, .7), (3, .5)]
    assert F.pareto([(2, .9), (2, .9)]) == [(2, .9)]
    assert F.pareto([]) == []


def test_tpf_at_and_acc_at_interpolate_on_the_frontier():
    f = [(2, .9), (4, .8), (6, .5), (3, .7)]  # (3, .7) is dominated by (4, .8)
    assert F.tpf_at(f, .95) is None              # never reached
    assert F.tpf_at(f, .9) == pytest.approx(2)
    assert F.tpf_at(f, .85) == pytest.approx(3)  # half way along (2, .9)-(4, .8)
    assert F.tpf_at(f, .65) == pytest.approx(5)  # half way along (4, .8)-(6, .5)
    assert F.tpf_at(f, .5) == pytest.approx(6)
    assert F.tpf_at(f, .1) == pytest.approx(6)   # no extrapolation past the fastest setting
    assert F.acc_at(f, 3) == pytest.approx(.85)
    assert F.acc_at(f, 5) == pytest.approx(.65)
    assert F.acc_at(f, 2) == pytest.approx(.9) and F.acc_at(f, 6) == pytest.approx(.5)
    assert F.acc_at(f, 1.9) is None and F.acc_at(f, 6.1) is None


def test_frontier_gain_by_hand():
    g = F.frontier_gain([(2, .90), (4, .85)], [(3, .92), (6, .90)])
    # level 0.89: base 2 + (0.90 - 0.89) / 0.05 * 2 = 2.4, model 6 (it still reaches 0.90 there)
    assert g["level"] == pytest.approx(.89)
    assert g["base_tpf"] == pytest.approx(2.4) and g["model_tpf"] == pytest.approx(6)
    assert g["gain"] == pytest.approx(2.5)
    # at the base's best setting (TPF 2, below the model's slowest 3) the model's best accuracy 0.92
    assert g["base_best_tpf"] == 2 and g["model_accuracy_at_base_tpf"] == pytest.approx(.92)
    assert g["acc_gain_points"] == pytest.approx(2.0)
    assert g["model_capped"] and not g["base_capped"] and "lower bound" in g["note"]
    assert g["base_frontier"] == [[2, .90], [4, .85]] and g["model_frontier"] == [[3, .92], [6, .90]]
    # the model reading inside its range: base best at TPF 4 -> model 0.92 - (1/3) 0.02
    g = F.frontier_gain([(4, .90)], [(3, .92), (6, .90)])
    assert g["acc_gain_points"] == pytest.approx(100 * (.92 - .02 / 3 - .90))


def test_frontier_gain_when_unreached_tied_or_exactly_at_the_level():
    g = F.frontier_gain([(2, .90), (4, .85)], [(5, .80), (7, .70)])
    assert g["gain"] is None and g["model_tpf"] is None and "never reaches" in g["note"]
    assert g["acc_gain_points"] == pytest.approx(-10)  # below the model's range: its best, 0.80
    assert F.frontier_gain([(8, .9)], [(3, .95)])["acc_gain_points"] is None  # above it: no reading
    # ties: equal points and an equal-accuracy slower point leave one frontier point
    g = F.frontier_gain([(2, .9), (2, .9), (3, .9), (4, .85)], [(5, .9)])
    assert g["base_frontier"] == [[3, .9], [4, .85]]
    assert g["base_tpf"] == pytest.approx(3.2) and g["gain"] == pytest.approx(5 / 3.2)
    # 0.92 - 0.01 is 0.9100000000000001 in floats; 91/100 still reaches it
    g = F.frontier_gain([(2, 92 / 100)], [(4, 91 / 100)])
    assert g["gain"] == pytest.approx(2.0)


def _records(rng: random.Random, n: int, p: float, tokens: int, fwd: int) -> list[dict]:
    return [{"id": f"p{i}", "correct": float(rng.random() < p), "n_tokens": tokens + rng.randint(0, 4),
             "forwards": fwd + rng.randint(0, 2), "forwards_no_commit": fwd - 2} for i in range(n)]


def test_bootstrap_is_deterministic_and_covers_the_estimate():
    rng = random.Random(0)
    base = [_records(rng, 200, .9, 24, 12), _records(rng, 200, .8, 24, 6)]
    model = [_records(rng, 200, .92, 24, 8), _records(rng, 200, .88, 24, 4)]
    a = F.bootstrap_gain(base, model, n_boot=200, seed=3)
    assert a == F.bootstrap_gain(base, model, n_boot=200, seed=3)
    assert a != F.bootstrap_gain(base, model, n_boot=200, seed=4)
    pts = [[(sum(r["n_tokens"] for r in s) / sum(r["forwards"] for r in s), sum(r["correct"] for r in s) / len(s))
            for s in m] for m in (base, model)]
    g = F.frontier_gain(*pts)["gain"]
    assert a["lo"] <= g <= a["hi"] and a["n_problems"] == 200 and a["n_boot"] == 200
    # forwards recomputed from steps per block (two blocks: + 2 commit passes) give the same draws
    spb = [[{"id": r["id"], "correct": r["correct"], "n_tokens": r["n_tokens"],
             "steps_per_block": [r["forwards"] - 3, 1]} for r in s] for s in base]
    assert F.bootstrap_gain(spb, model, n_boot=200, seed=3) == a
    # a resample the model cannot reach counts as gain 0
    low = [_records(rng, 50, .3, 24, 4)]
    assert F.bootstrap_gain(base, low, n_boot=50)["n_unreached"] == 50


def test_filler_share_by_hand():
    assert F.filler_mask(["a", " ", "b"]) == [False, True, False]
    assert F.filler_mask([";", ";", ";", "x"]) == [False, True, True, False]
    assert F.filler_mask(["1", ";", "2", ";"]) == [False] * 4          # separators between content
    assert F.filler_mask([".", " ", " ."]) == [False, True, True]      # a repeat across whitespace
    assert F.filler_mask(["\n", "\n", "**", "**", "ab", "ab"]) == [True, True, False, True, False, False]
    s = F.filler_share([["a", " ", "b"], [";", ";", ";", "x"], "7+8=15;;"])
    assert (s["filler"], s["tokens"], s["n"]) == (1 + 2 + 1, 3 + 4 + 8, 3)
    assert s["share"] == pytest.approx(4 / 15) and s["mean_length"] == pytest.approx(5)
    assert F.filler_share([])["share"] == 0.0


def test_knobs_of_each_family():
    assert F.knob_grid(DecodeConfig(threshold=0.85), [0.5, 0.9, 0.5]) == [0.5, 0.85, 0.9]
    ll = F.with_knob(protocol("llada"), 0.76)   # editing keeps its ratio 0.9 / 0.95 to the threshold
    assert ll.threshold == 0.76 and ll.edit_threshold == pytest.approx(0.72)
    assert F.with_knob(protocol("dgemma"), 0.3).entropy_bound == 0.3
    assert F.knob_grid(protocol("dgemma"))[0] == 0.02 and 0.1 in F.knob_grid(protocol("dgemma"))
    tk = DecodeConfig(rule="topk", block_size=8)   # top-k: the number of steps per block
    assert F.knob_grid(tk) == [1, 2, 4, 8] and F.with_knob(tk, 4).steps == 4


def _tiny():
    tok = build_char_tokenizer()
    m = build_model(get_config("sdar", "tiny", vocab_size=len(tok), mask_token_id=tok.mask_token_id), seed=0).eval()
    with torch.no_grad():  # a random model's greedy argmax is the mask itself; this makes it write text
        m.model.embed_tokens.weight[tok.mask_token_id] = 0
    return m, tok


def test_sweep_rows_equal_separate_evaluations(tmp_path):
    m, tok = _tiny()
    task = get_task("arith")
    probs = task.problems("test")[:6]
    d = DecodeConfig(rule="threshold", block_size=8, max_new_tokens=24, threshold=0.9)
    rows = F.sweep(m, tok, task, probs, d, [0.3])
    assert [r["value"] for r in rows] == [0.3, 0.9]
    for r in rows:
        e = evaluate(m, tok, task, probs, F.with_knob(d, r["value"]))
        for k in ("accuracy", "tpf", "tpf_no_commit", "steps_per_block", "n"):
            assert r[k] == e[k], k
        assert r["records"] == e["records"]
        assert r["mean_length"] == pytest.approx(sum(x["n_tokens"] for x in e["records"]) / 6)
        assert r["ci"] == list(F.wilson(sum(x["correct"] for x in e["records"]), 6))
    block = F.frontier_block(rows, rows, n_boot=20)
    assert block["gain"] == pytest.approx(1.0) and set(block["curves"]) == {"base", "orl"}
    F.plot(block["curves"], str(tmp_path / "f.png"), block)
    assert (tmp_path / "f.png").stat().st_size > 1000


def test_both_evaluators_count_tokens_alike(tmp_path):
    """`evaluate` and `orl eval generate`/`score` give the same n_tokens (EOS included) and TPF on the
    same greedy generations; some of them end at EOS, some at the token budget."""
    from orl import LLM
    from orl.eval.cli import _generate_fn, _protocol
    from orl.eval.generate import generate_jsonl
    from orl.eval.jsonlog import read_log
    from orl.eval.prepare import prepare
    from orl.eval.score import score_jsonl
    m, tok = _tiny()
    save_pretrained(m, str(tmp_path / "m"), tokenizer=tok)
    llm = LLM(str(tmp_path / "m"), threshold=0.5)
    n_new = 24
    prepared = prepare("arith", tmp_path / "prepared", limit=6)
    gen = tmp_path / "gen.jsonl"
    generate_jsonl(prepared, gen, _generate_fn(llm, n_new), _protocol(llm, n_new), progress=False)
    scored = score_jsonl(gen, prepared, tmp_path / "scored.jsonl", workers=1, progress=False)
    ev = evaluate(llm.model, llm.tokenizer, get_task("arith"), get_task("arith").problems("test")[:6],
                  dataclasses.replace(llm.decode_config, max_new_tokens=n_new), batch_size=1)
    by_id = {r["id"]: r for r in read_log(gen)[1]}
    ended = [x["token_ids"][-1] in (tok.eos_token_id, tok.pad_token_id) for x in ev["records"]]
    assert any(ended) and not all(ended)
    for x, eos in zip(ev["records"], ended):
        g = by_id[x["id"]]
        assert g["completion_tokens"] == x["n_tokens"] - eos  # the text's tokens: what generate counted before
        assert (g["completion"], g["n_tokens"], g["forwards"], g["forwards_no_commit"]) == \
            (x["completion"], x["n_tokens"], x["forwards"], x["forwards_no_commit"])
    assert scored["tpf"] == pytest.approx(ev["tpf"], rel=1e-12)
    assert scored["tpf_no_commit"] == pytest.approx(ev["tpf_no_commit"], rel=1e-12)
    assert scored["accuracy"] == ev["accuracy"]
