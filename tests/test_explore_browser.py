"""The explorer page in a real browser: headless Chromium (orl.explore.browser, the DevTools protocol
over a pipe) opens the generated file, the slider moves by script, by keyboard and by mouse, and the
DOM must show, for each model, exactly the decoder's commits at that forward: the expected cells are
computed here from the decoder's own trace (`DecodeOutput.trace`), not from the page's frames.
Skipped, with the reason, where no Chromium is installed (CI installs it: .ci/run)."""
import dataclasses
import struct

import pytest
import torch

from orl import LLM
from orl.decode import decode
from orl.explore import page as P
from orl.explore.browser import INSTALL_HINT, Browser, find_chromium
from orl.explore.trace import run_data

pytestmark = pytest.mark.skipif(find_chromium() is None,
                                reason="Chromium not found (chromium, chromium-browser, google-chrome or "
                                       f"$ORL_CHROMIUM); {INSTALL_HINT}")
PROMPT = "7+8+9+6="


def expected(out, K: int) -> list[dict]:
    """Per forward (1-based index f - 1), from the raw trace: the cells committed by it as
    {(block, pos, token id)}, and the generated tokens resolved after it (every block's
    denoising steps, then its commit pass, as TPF counts forwards)."""
    final = out.block_tokens[0]
    per, tokens = [], 0
    blocks = sorted({r.block for r in out.trace})
    for b in blocks:
        for rec in (r for r in out.trace if r.block == b):
            new = {(b, k, final[b * K + k]) for k in rec.committed[0].nonzero().flatten().tolist()}
            tokens += len(new)
            per.append({"new": new, "tokens": tokens})
        per.append({"new": set(), "tokens": tokens})  # the commit pass
    return per


@pytest.fixture(scope="module")
def two_models(make_speaking_llm):
    """Two different tiny models decoding the same prompt: one at the protocol (one commit per step),
    one with perturbed weights and a 4-token quota per step, so they finish at different forwards."""
    a = make_speaking_llm("sdar/tiny")
    b = LLM("sdar/tiny", role="orl", steps=2)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in b.model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
        b.model.model.embed_tokens.weight[b.tokenizer.mask_token_id] = 0
    runs, truth = [], []
    for llm, label in ((a, "A"), (b, "B")):
        ids = llm.encode(PROMPT)
        cfg = dataclasses.replace(llm.decode_config, max_new_tokens=24)
        out = decode(llm.model, torch.tensor([ids]), cfg, eos_ids=[], trace=True)
        runs.append(run_data(llm, out, cfg, label=label))
        truth.append(expected(out, cfg.block_size))
    return runs, truth


def dom_state(browser, i: int) -> dict:
    return browser.evaluate(f"""(() => {{
      const sec = document.getElementById("run-{i}"), st = sec.querySelector(".status");
      return {{new: [...sec.querySelectorAll(".tok.new")].map(c => [+c.dataset.block, +c.dataset.pos, +c.dataset.id]),
              masked: sec.querySelectorAll(".tok.masked").length,
              forwards: +st.dataset.forwards, tokens: +st.dataset.tokens,
              slider: +document.getElementById("step").value}};
    }})()""")


def check(browser, truth, f: int) -> None:
    for i, per in enumerate(truth):
        s = dom_state(browser, i)
        F = len(per)
        assert s["slider"] == f
        want = per[f - 1]["new"] if 1 <= f <= F else set()  # a finished run highlights nothing
        assert {tuple(x) for x in s["new"]} == want, f"run {i} at forward {f}"
        assert s["forwards"] == min(f, F) and s["tokens"] == (per[min(f, F) - 1]["tokens"] if f else 0)


def test_page_in_chromium_shows_each_forwards_commits(two_models, tmp_path):
    runs, truth = two_models
    F = [len(t) for t in truth]
    assert F == [8 * 3 + 3, 2 * 3 + 3]  # A: 8 steps a block, B: 2 (quota 4), each + a commit pass
    html = tmp_path / "explore.html"
    html.write_text(P.render(P.page_data(runs, PROMPT)), encoding="utf-8")
    with Browser(width=1280, height=900) as b:
        b.open(html.as_uri(), ready="window.orlExplore !== undefined")
        assert b.evaluate("document.getElementById('step').max") == str(max(F))
        check(b, truth, 0)
        for f in (1, 2, 5, 9, 10, 14):  # the slider moved by script, as a drag fires it: value + input event
            b.evaluate(f"(() => {{ const s = document.getElementById('step'); s.value = {f};"
                       " s.dispatchEvent(new Event('input', {bubbles: true})); })()")
            check(b, truth, f)
        b.evaluate("document.getElementById('step').focus()")  # a focused slider must not step twice a key
        b.key("ArrowRight")             # real key presses through the browser's input pipeline
        check(b, truth, 15)
        b.key("ArrowRight", shift=True)
        check(b, truth, 25)
        b.key("ArrowLeft")
        check(b, truth, 24)
        b.key("End")
        check(b, truth, max(F))
        b.key("Home")
        check(b, truth, 0)
        box = b.evaluate("(() => { const r = document.getElementById('step').getBoundingClientRect();"
                         " return [r.left, r.top, r.width, r.height]; })()")
        x, y = box[0] + 0.6 * box[2], box[1] + box[3] / 2
        for kind in ("mousePressed", "mouseReleased"):   # a click on the slider's track
            b.send("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1})
        f = b.evaluate("+document.getElementById('step').value")
        assert 0 < f < max(F)
        check(b, truth, f)
        png = b.screenshot(str(tmp_path / "explore.png"))
        assert not b.exceptions, b.exceptions
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">I", png[16:20])[0] == 1280  # IHDR width
