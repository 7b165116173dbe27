"""The decode explorer without a browser: frames against the decoder's own trace and `LLM.generate`,
the page's embedded data and its self-containment, `orl explore` end to end, GET /explore on the
server, and the plot readers on hand-written inputs (tests/test_explore_browser.py drives the page)."""
import dataclasses
import json
import re
import threading
import urllib.request

import pytest
import torch

from orl.cli import main
from orl.decode import decode
from orl.explore import page as P
from orl.explore import plots
from orl.explore.trace import frames, trace_run

PROMPT = "7+8+9+6="


@pytest.fixture(scope="module")
def llm(make_speaking_llm):
    return make_speaking_llm("sdar/tiny")


def page_json(html: str) -> dict:
    m = re.search(r'<script type="application/json" id="orl-data">(.*?)</script>', html, re.S)
    assert m, "the page embeds its data"
    return json.loads(m.group(1))


@pytest.mark.parametrize("over", [{}, {"steps": 2}], ids=["threshold", "quota4"])
def test_frames_are_the_decoders_trace_forward_by_forward(llm, over):
    ids = llm.encode(PROMPT)
    cfg = dataclasses.replace(llm.decode_config, max_new_tokens=24, **over)
    run = trace_run(llm, ids, cfg, eos_ids=[])
    # the trace records, it changes nothing: the untraced decode gives the same tokens and steps
    plain = decode(llm.model, torch.tensor([ids]), cfg, eos_ids=[])
    assert run["token_ids"] == plain.tokens[0] and run["steps_per_block"] == plain.steps_per_block[0]
    K, fr = cfg.block_size, run["frames"]
    n_blocks = len(run["blocks"])
    assert n_blocks == 3 and len(fr) == run["forwards"] == sum(plain.steps_per_block[0]) + n_blocks
    assert [f["fwd"] for f in fr] == list(range(1, len(fr) + 1))
    assert fr[-1]["tokens"] == run["n_tokens"] == 24 and run["tpf"] == pytest.approx(plain.tpf())
    traced = decode(llm.model, torch.tensor([ids]), cfg, eos_ids=[], trace=True)
    recs = iter(traced.trace)
    for b in range(n_blocks):
        steps = [f for f in fr if f["b"] == b and not f.get("commit")]
        assert [f["s"] for f in steps] == list(range(plain.steps_per_block[0][b]))
        done: set = set()
        for i, f in enumerate(steps):
            rec = next(recs)
            assert f["new"] == rec.committed[0].nonzero().flatten().tolist()
            assert not done & set(f["new"])  # each position commits once (threshold rule: no edits)
            done |= set(f["new"])
            assert f["unres"] == sorted(set(range(K)) - done)
            final = run["blocks"][b]
            assert all(f["canvas"][k] == final[k] for k in done)
            assert f["ent"] == [round(x, 4) for x in rec.entropy[0].tolist()]
            # the residual enters at the positions unresolved before the step; zero at the block's first step
            before = set(range(K)) if i == 0 else set(steps[i - 1]["unres"])
            assert {k for k, x in enumerate(f["rn"]) if x > 0} == (set() if i == 0 else before)
            if i:
                want = rec.residual[0].norm(dim=-1)
                assert f["rn"] == pytest.approx([round(float(want[k]), 4) if k in before else 0.0 for k in range(K)],
                                                abs=1e-4)
            assert f["tokens"] == b * K + len(done) and f["fwd"] == fr.index(f) + 1
        assert done == set(range(K))
        commit = [f for f in fr if f["b"] == b and f.get("commit")]
        assert len(commit) == 1 and commit[0]["new"] == [] and commit[0]["tokens"] == (b + 1) * K


def test_explorer_tokens_and_tpf_are_llm_generates(llm):
    ids = llm.encode(PROMPT)
    run = trace_run(llm, ids, dataclasses.replace(llm.decode_config, max_new_tokens=16))
    gen = llm.generate(PROMPT, max_new_tokens=16)
    eos = set(llm.eos_ids)
    assert [t for t in run["token_ids"] if t not in eos] == gen.token_ids
    assert (run["forwards"], run["forwards_no_commit"]) == (gen.forwards, gen.forwards_no_commit)
    assert run["tpf"] == pytest.approx(gen.tpf) and run["completion"] == gen.text


def test_frames_need_a_trace(llm):
    out = decode(llm.model, torch.tensor([llm.encode(PROMPT)]), dataclasses.replace(llm.decode_config,
                                                                                    max_new_tokens=8))
    with pytest.raises(ValueError, match="trace=True"):
        frames(out)


def test_page_is_self_contained_and_its_data_cannot_break_out(llm):
    evil = "</script><script>alert(1)</script> & <!-- \u2028 ü"
    run = trace_run(llm, llm.encode("1+2="), dataclasses.replace(llm.decode_config, max_new_tokens=8), label=evil)
    data = P.page_data([run], evil, title=evil)
    html = P.render(data)
    assert page_json(html) == json.loads(json.dumps(data))  # the data round-trips exactly
    assert html.count("<script") == 2 and html.count("</script>") == 2  # the page's own two, nothing injected
    # nothing is fetched at view time: no src/href attributes, no CSS url()/@import, no http(s) but the SVG namespace
    assert not re.search(r"\b(src|href)\s*=", html) and "url(" not in html and "@import" not in html
    assert set(re.findall(r"https?://[^\s\"']+", html)) == {"http://www.w3.org/2000/svg"}
    with pytest.raises(ValueError, match="at least one --model"):
        P.page_data([], "x")


def test_orl_explore_task_prompt_knob_runs_and_verdict(tmp_path, capsys):
    from orl.tasks.arith import ArithTask
    out = tmp_path / "page.html"
    rc = main(["explore", "--model", "sdar/tiny", "--task", "arith", "--index", "2", "--threshold", "0.9,0.5",
               "--set", "steps=2", "--max-new-tokens", "16", "--ignore-eos", "--out", str(out)])
    assert rc == 0
    data = page_json(out.read_text())
    problem = ArithTask().problems("test")[2]
    assert data["prompt"] == problem.prompt and data["answer"] == str(problem.answer)
    runs = data["runs"]
    assert [r["label"] for r in runs] == ["sdar/tiny @ threshold 0.9", "sdar/tiny @ threshold 0.5"]
    assert [r["decode"]["threshold"] for r in runs] == [0.9, 0.5] and runs[0]["decode"]["max_steps"] == 2
    assert all(r["verdict"] == 0.0 for r in runs)  # random weights do not add up
    assert all(r["n_tokens"] == 16 and len(r["frames"]) == r["forwards"] == 2 * 2 + 2 for r in runs)
    assert data["fmax"] == 6 and data["command"].startswith("orl explore --model sdar/tiny")
    assert "TPF" in capsys.readouterr().out


@pytest.mark.parametrize("argv, msg", [
    (["--model", "sdar/tiny"], "either --prompt"),
    (["--model", "sdar/tiny", "--prompt", "x", "--task", "arith"], "either --prompt"),
    (["--model", "sdar/tiny", "--task", "arith", "--index", "99999"], "--index must be in"),
    (["--model", "sdar/tiny", "--prompt", "x", "--threshold", "0.9,high"], "not a number"),
    (["--model", "a", "--model", "b", "--label", "x", "--prompt", "x"], "one --label per --model"),
    (["--model", "a", "--model", "b", "--role", "base", "--role", "orl", "--role", "orl", "--prompt", "x"],
     "one per --model"),
])
def test_orl_explore_errors_name_the_fix(argv, msg, capsys):
    assert main(["explore", *argv]) == 1
    assert msg in capsys.readouterr().err


def test_serve_page_answers_the_page_on_loopback_only():
    from orl.explore.cli import serve_page
    srv = serve_page("<p>page</p>", port=0)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{srv.server_address[1]}/", timeout=10) as r:
            assert r.read() == b"<p>page</p>" and r.headers["Content-Type"].startswith("text/html")
    finally:
        srv.shutdown()
        srv.server_close()
    with pytest.raises(ValueError, match="loopback only"):
        serve_page("x", port=0, host="0.0.0.0")


def test_server_explore_route_is_off_by_default_and_serves_the_page(llm):
    from fastapi.testclient import TestClient

    from orl.explore.route import add_explore_route
    from orl.serve.server import create_app
    assert TestClient(create_app(llm, "tiny", warmup=False)).get("/explore").status_code == 404
    app = create_app(llm, "tiny", warmup=False)
    add_explore_route(app, llm, "tiny")
    c = TestClient(app)
    form = c.get("/explore")
    assert form.status_code == 200 and '<form method="get" action="/explore">' in form.text
    r = c.get("/explore", params={"prompt": PROMPT, "max_tokens": 16, "threshold": "0.9,0.5"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    runs = page_json(r.text)["runs"]
    gen = llm.generate(PROMPT, max_new_tokens=16)
    assert [r["label"] for r in runs] == ["tiny @ threshold 0.9", "tiny @ threshold 0.5"]
    assert [t for t in runs[0]["token_ids"] if t not in llm.eos_ids] == gen.token_ids
    bad = c.get("/explore", params={"prompt": PROMPT, "max_tokens": "many"})
    assert bad.status_code == 400 and "max_tokens must be an integer" in bad.text
    long = c.get("/explore", params={"prompt": PROMPT, "max_tokens": 10 ** 6})
    assert long.status_code == 400 and "exceeds the model context" in long.text
    assert c.get("/explore", params={"prompt": PROMPT, "threshold": "1.5"}).status_code == 400


def test_orl_serve_explore_flag_registers_the_route(monkeypatch):
    import uvicorn

    from orl.serve import server
    apps = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self: apps.append(self.config.app))
    assert server.cli(["--model", "sdar/tiny", "--explore"]) == 0
    assert "/explore" in {getattr(r, "path", None) for r in apps[0].routes}


# ---------------------------------------------------------------- plots
MD = """# Engine
### One round, K=32: (b) ours, while: GPU time by kernel kind (profiler over replays of the round's graph)

| kind | kernels | ms |
|---|---|---|
| gemm | 145 | 2.500 |
| attention | 72 | 0.750 |
| **all kernels** | 217 | 3.250 |
| **between kernels** (round GPU time - kernel time) | - | 0.250 |
| top: `nvjet_x` | 36 | 1.099 |

### One round, K=256: (b) ours, graph: GPU time by kernel kind

| kind | kernels | ms |
|---|---|---|
| gemm | 10 | 1.000 |
"""


def test_profile_readers_on_hand_written_tables():
    got = plots.profiles(MD)
    assert got == {"K=32: (b) ours, while": {"kinds": [("gemm", 2.5), ("attention", 0.75)], "all": 3.25,
                                             "between": 0.25},
                   "K=256: (b) ours, graph": {"kinds": [("gemm", 1.0)], "all": None, "between": None}}
    log = {"copy_bw": 1.0, "dgemma_profile": {"while": [["gemm", 3, "0.400"], ["**all kernels**", 3, "0.400"]]}}
    assert plots.profiles(log) == {"dgemma_profile: while": {"kinds": [("gemm", 0.4)], "all": 0.4, "between": None}}


def test_training_series_panels_and_moving_average():
    recs = [{"step": 1, "loss": 2.0, "reward": 0.5, "note": "x"}, {"step": 2, "loss": float("nan"), "tpf": 3.0},
            {"step": 1, "loss": 1.5, "reward": 0.25}, {"no_step": 1}]  # step 1 again: a resumed run's record wins
    assert plots.training_series(recs) == {"loss": ([1], [1.5]), "reward": ([1], [0.25]), "tpf": ([2], [3.0])}
    assert plots.panels(["tpf", "loss_aec", "loss", "reward", "grad_norm"]) == [
        ("loss", ["loss", "loss_aec"]), ("reward / accuracy", ["reward"]), ("tokens per forward", ["tpf"]),
        ("grad_norm", ["grad_norm"])]
    assert plots.moving_average([1.0, 2.0, 3.0, 4.0], 2) == [1.0, 1.5, 2.5, 3.5]


def test_orl_explore_plot_writes_pngs_beside_their_json(tmp_path, capsys):
    row = dict(knob="threshold", value=0.9, accuracy=0.5, ci=[0.4, 0.6], tpf=2.0, tpf_no_commit=3.0)
    summary = {"frontier": {"models": ["base", "orl"], "level": 0.49, "gain": None, "no_commit": None,
                            "curves": {"base": [row], "orl": [{**row, "tpf": 4.0}]}}}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1 / s, "tpf": s}) + "\n"
                                                    for s in range(1, 6)))
    (tmp_path / "engine_log.json").write_text(json.dumps({"dgemma_profile": {"while": [["gemm", 3, "0.4"]]}}))
    (tmp_path / "other.json").write_text("{}")
    paths = [str(tmp_path / n) for n in ("summary.json", "metrics.jsonl", "engine_log.json")]
    assert main(["explore", "plot", *paths]) == 0
    for n in ("summary.png", "metrics.png", "engine_log.png"):
        assert (tmp_path / n).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["explore", "plot", str(tmp_path / "other.json")]) == 1
    assert "nothing to plot" in capsys.readouterr().err
