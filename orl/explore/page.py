"""The explorer's page: one self-contained HTML file (inline CSS and JS, no network at view time).

Owns the markup, the style and the script of the page, and embedding the runs' data
(`orl.explore.trace.run_data`) in it as JSON that no string inside can break out of. The page shows,
per run, the block canvas after each forward -- committed tokens, still-unresolved positions shaded
by their normalised entropy at that step, the positions this forward committed highlighted, the
residual input's norm per position as a bar, the running TPF -- with one step slider for every run
(the same forward budget: slider value f shows each run after its f-th forward, commit passes
included; a run that finished earlier shows its final state), keyboard navigation, a chart of
tokens against forwards, and each run's summary (forwards, TPF, verdict).

DOM contract (tests/test_explore_browser.py reads it): the slider is ``#step``; run i is
``section#run-<i>``; its cells are ``.tok[data-block][data-pos]``, with class ``new`` on the
positions committed at the shown forward, ``masked`` on the unresolved ones, ``committed``,
``empty`` (a block not started yet) or ``after-eos``, and ``data-id``: the token id it shows; its
``.status`` carries ``data-forwards`` and ``data-tokens`` (forwards spent and generated tokens resolved at
the shown forward).
Does not own: decoding or the frames (`orl.explore.trace`), serving the page (`orl.explore.cli`,
`orl.explore.route`).
"""
from __future__ import annotations

import html
import json


def embed_json(data) -> str:
    """``data`` as JSON safe inside a <script> element: no ``<``, ``>`` or ``&`` survive literally
    (so no ``</script>`` or ``<!--`` can end it early) and non-ASCII is escaped."""
    s = json.dumps(data, ensure_ascii=True, separators=(",", ":"), allow_nan=False)
    return s.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def page_data(runs: list[dict], prompt: str, title: str = "orl explore", answer=None, command: str = "") -> dict:
    """The page's data: the runs (`orl.explore.trace.run_data`), the prompt, and the slider's range
    (``fmax``: the longest run's forwards)."""
    if not runs:
        raise ValueError("no runs to show; give at least one --model")
    return {"title": title, "prompt": prompt, "answer": None if answer is None else str(answer),
            "command": command, "fmax": max(len(r["frames"]) for r in runs), "runs": runs}


def render(data: dict) -> str:
    """The HTML page of ``page_data`` output."""
    return (_TEMPLATE.replace("__TITLE__", html.escape(data.get("title") or "orl explore"))
            .replace("__FMAX__", str(int(data["fmax"])))
            .replace("__STYLE__", _STYLE).replace("__SCRIPT__", _SCRIPT)
            .replace("__DATA__", embed_json(data)))


_TEMPLATE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>__TITLE__</title>
<style>__STYLE__</style>
</head>
<body>
<header>
  <div class="top">
    <h1>__TITLE__</h1>
    <div class="controls">
      <button id="first" title="first forward (Home)">&#xAB;</button>
      <button id="prev" title="previous forward (&#x2190;)">&#x25C0;</button>
      <button id="play" title="play / pause (space)">&#x25B6;&#xFE0E; play</button>
      <button id="next" title="next forward (&#x2192;)">&#x25B6;</button>
      <button id="last" title="last forward (End)">&#xBB;</button>
      <input type="range" id="step" min="0" max="__FMAX__" value="0" step="1" aria-label="forward pass">
      <output id="step-label" for="step"></output>
    </div>
  </div>
  <div class="prompt-row"><span class="key">prompt</span><pre id="prompt"></pre><span id="answer"></span></div>
  <div class="legend">
    <span><i class="tok committed sw">a</i> committed</span>
    <span><i class="tok committed new sw">a</i> committed by this forward</span>
    <span><i class="tok masked sw" style="background:hsl(265,55%,88%)">&#xB7;</i><i class="tok masked sw"
      style="background:hsl(265,55%,38%)">&#xB7;</i> unresolved, shaded by normalised entropy (light 0, dark 1)</span>
    <span><i class="tok committed sw"><b class="rn" style="height:6px"></b>a</i> norm of the residual input z</span>
    <span><i class="tok empty sw"> </i> block not started</span>
    <span class="keys">keys: &#x2190;/&#x2192; one forward, Shift ten, Home/End, space play</span>
  </div>
</header>
<section id="chart-box"><svg id="chart" role="img" aria-label="tokens resolved against forwards"></svg>
  <p class="note">The slider counts forward passes, the same budget for every run: denoising steps and each
  block's cache-commit pass (TPF's count, docs/method.md 1.5). A run that finished earlier stays at its
  final state.</p></section>
<main id="runs"></main>
<footer id="command"></footer>
<script type="application/json" id="orl-data">__DATA__</script>
<script>__SCRIPT__</script>
</body>
</html>
"""

_STYLE = """
:root { --ink:#1d1d1f; --muted:#6e6e73; --line:#d2d2d7; --new:#ffb000; --bg:#f6f6f8; }
* { box-sizing: border-box; }
body { margin:0; color:var(--ink); background:var(--bg);
  font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif; }
header { position:sticky; top:0; z-index:2; background:#fff; border-bottom:1px solid var(--line); padding:8px 18px; }
.top { display:flex; flex-wrap:wrap; align-items:center; gap:8px 24px; }
h1 { font-size:17px; margin:0; font-weight:650; }
.controls { display:flex; align-items:center; gap:6px; flex:1; min-width:420px; }
.controls button { font-size:13px; padding:3px 8px; border:1px solid var(--line); border-radius:5px;
  background:#fff; cursor:pointer; }
.controls button:hover { background:#eee; }
#step { flex:1; min-width:160px; }
#step-label { font-variant-numeric:tabular-nums; min-width:11em; color:var(--muted); }
.prompt-row { display:flex; gap:10px; align-items:baseline; margin-top:6px; }
.key { color:var(--muted); font-size:12px; text-transform:uppercase; letter-spacing:.04em; }
#prompt { margin:0; font:13px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace; white-space:pre-wrap;
  max-height:4.2em; overflow:auto; }
#answer { color:var(--muted); }
.legend { display:flex; flex-wrap:wrap; gap:4px 18px; margin-top:6px; color:var(--muted); font-size:12px;
  align-items:center; }
.legend .sw { display:inline-flex; height:1.9em; min-width:1.6em; vertical-align:middle; margin-right:3px;
  font-style:normal; }
.legend .keys { margin-left:auto; }
#chart-box { padding:6px 18px 0; }
#chart { width:100%; height:120px; background:#fff; border:1px solid var(--line); border-radius:6px; }
.note { color:var(--muted); font-size:12px; margin:4px 0 0; }
main { display:grid; grid-template-columns:repeat(auto-fit, minmax(540px, 1fr)); gap:14px; padding:12px 18px 18px; }
.run { background:#fff; border:1px solid var(--line); border-left:5px solid var(--c); border-radius:6px;
  padding:10px 12px; min-width:0; }
.run h2 { font-size:15px; margin:0 0 2px; }
.run h2 .meta { font-weight:400; color:var(--muted); font-size:12px; margin-left:6px; }
.summary { font-size:13px; margin-bottom:4px; }
.summary b { font-variant-numeric:tabular-nums; }
.verdict.ok { color:#1a7f37; font-weight:600; } .verdict.bad { color:#c0362c; font-weight:600; }
.status { font-size:13px; color:#333; background:#f3f3f5; border-radius:4px; padding:3px 8px; margin:4px 0 8px;
  font-variant-numeric:tabular-nums; }
.canvas { display:flex; flex-direction:column; gap:3px; }
.block { display:flex; flex-wrap:wrap; align-items:center; border-radius:4px; padding:1px 2px; }
.block.current { background:#eef4ff; outline:1px solid #b9cdf5; }
.blabel { width:4.6em; color:var(--muted); font-size:11px; flex:none; }
.tok { position:relative; display:inline-flex; align-items:flex-start; justify-content:center; min-width:1.65em;
  height:2.15em; margin:1px; padding:1px 3px 0; border:1px solid var(--line); border-radius:3px; background:#fff;
  font:13px/1.5 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace; white-space:pre; }
.tok.empty { background:#ececee; border-style:dashed; color:transparent; }
.tok.masked { color:#fff; border-color:transparent; }
.tok.new { background:var(--new); border-color:#b36b00; font-weight:700; box-shadow:0 0 0 1px #b36b00; }
.tok.after-eos { opacity:.35; text-decoration:line-through; }
.tok .rn { position:absolute; left:1px; right:1px; bottom:1px; height:0; max-height:7px; background:#0a84ff;
  opacity:.85; border-radius:1px; }
.completion { margin-top:8px; font-size:12px; color:var(--muted); }
.completion pre { margin:2px 0 0; color:var(--ink);
  font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace; white-space:pre-wrap; }
footer { color:var(--muted); font-size:11px; padding:0 18px 14px; font-family:ui-monospace,Menlo,Consolas,monospace; }
"""

_SCRIPT = r"""
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("orl-data").textContent);
  const COLORS = ["#0a84ff", "#ff6b00", "#30a14e", "#bf5af2", "#e5484d", "#8e8e93", "#00a3a3", "#a05a2c"];
  const slider = document.getElementById("step");
  const label = document.getElementById("step-label");
  const fmax = data.fmax;
  let cur = 0, timer = null;

  function el(tag, attrs, text) {
    const e = document.createElement(tag);
    for (const k in (attrs || {})) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function visible(s) {
    if (s === undefined) return "?";
    if (s === "") return "\u2205";
    return s.replace(/ /g, "\u2423").replace(/\n/g, "\u23CE").replace(/\t/g, "\u21E5");
  }
  function show(run, id) {  // a committed token (a committed mask id: the model chose the mask token)
    if (run.eos_ids.indexOf(id) >= 0) return "EOS";
    if (run.mask_id !== null && id === run.mask_id) return "[m]";
    return visible(run.vocab[String(id)]);
  }
  function shade(e) { return "hsl(265,55%," + (88 - 50 * Math.max(0, Math.min(1, e))).toFixed(1) + "%)"; }
  function fmt(x) { return (Math.round(x * 100) / 100).toFixed(2); }
  function knob(d) {
    const parts = ["rule " + d.rule];
    for (const k of ["threshold", "edit_threshold", "entropy_bound", "top_p"]) if (k in d) parts.push(k + " " + d[k]);
    parts.push("\u2264 " + d.max_steps + " steps/block");
    parts.push(d.temperature === 0 ? "greedy" : "temperature " + d.temperature);
    if (d.residual === false) parts.push("no residual");
    parts.push("K " + d.block_size);
    return parts.join(" \u00B7 ");
  }

  document.getElementById("prompt").textContent = data.prompt;
  if (data.answer !== null) document.getElementById("answer").textContent = "reference answer: " + data.answer;
  document.getElementById("command").textContent = data.command || "";

  const main = document.getElementById("runs");
  data.runs.forEach(function (run, i) {
    run.color = COLORS[i % COLORS.length];
    const sec = el("section", {"class": "run", "id": "run-" + i, "data-run": i});
    sec.style.setProperty("--c", run.color);
    const h = el("h2", {}, run.label);
    h.appendChild(el("span", {"class": "meta"},
                     run.model + " \u00B7 " + run.family + "/" + run.role + " \u00B7 " + knob(run.decode)));
    sec.appendChild(h);
    const sm = el("div", {"class": "summary"});
    const parts = [["forwards", run.forwards + " (" + run.forwards_no_commit + " without commit passes)"],
                   ["tokens", String(run.n_tokens)],
                   ["TPF", fmt(run.tpf) + " (" + fmt(run.tpf_no_commit) + " without commit)"]];
    parts.forEach(function (p, j) {
      if (j) sm.appendChild(document.createTextNode(" \u00B7 "));
      sm.appendChild(document.createTextNode(p[0] + " "));
      sm.appendChild(el("b", {}, p[1]));
    });
    if (run.verdict !== null && run.verdict !== undefined) {
      sm.appendChild(document.createTextNode(" \u00B7 "));
      const ok = run.verdict >= 1;
      const say = ok ? "\u2713 correct" : (run.verdict > 0 ? "partly correct (" + run.verdict + ")" : "\u2717 wrong");
      sm.appendChild(el("span", {"class": "verdict " + (ok ? "ok" : "bad")}, say));
    }
    sec.appendChild(sm);
    run.status = el("div", {"class": "status"});
    sec.appendChild(run.status);
    const cv = el("div", {"class": "canvas"});
    run.rows = []; run.cells = [];
    for (let b = 0; b < run.blocks.length; b++) {
      const row = el("div", {"class": "block", "data-block": b});
      row.appendChild(el("span", {"class": "blabel"}, "block " + (b + 1)));
      const cells = [];
      for (let k = 0; k < run.K; k++) {
        const c = el("span", {"class": "tok", "data-block": b, "data-pos": k});
        c.appendChild(el("span", {"class": "t"}));
        c.appendChild(el("b", {"class": "rn"}));
        row.appendChild(c);
        cells.push(c);
      }
      cv.appendChild(row);
      run.rows.push(row); run.cells.push(cells);
    }
    sec.appendChild(cv);
    const comp = el("div", {"class": "completion"}, "completion (" + run.finish_reason + ")");
    comp.appendChild(el("pre", {}, run.completion));
    sec.appendChild(comp);
    main.appendChild(sec);
  });

  // ---- tokens against forwards, one line per run, a cursor at the slider
  const svgNS = "http://www.w3.org/2000/svg";
  const chart = document.getElementById("chart");
  const W = 1000, H = 120, L = 40, R = 10, T = 8, B = 22;
  chart.setAttribute("viewBox", "0 0 " + W + " " + H);
  chart.setAttribute("preserveAspectRatio", "none");
  const ymax = Math.max(1, ...data.runs.map(function (r) { return r.n_tokens; }));
  const X = function (f) { return L + (W - L - R) * f / Math.max(1, fmax); };
  const Y = function (t) { return H - B - (H - B - T) * t / ymax; };
  function svg(tag, attrs, text) {
    const e = document.createElementNS(svgNS, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    chart.appendChild(e);
    return e;
  }
  svg("line", {x1: L, y1: Y(0), x2: W - R, y2: Y(0), stroke: "#bbb"});
  svg("line", {x1: L, y1: Y(0), x2: L, y2: T, stroke: "#bbb"});
  svg("text", {x: L - 4, y: T + 9, "text-anchor": "end", "font-size": 10, fill: "#6e6e73"}, String(ymax));
  svg("text", {x: L - 4, y: Y(0), "text-anchor": "end", "font-size": 10, fill: "#6e6e73"}, "0");
  svg("text", {x: W - R, y: H - 6, "text-anchor": "end", "font-size": 10, fill: "#6e6e73"}, "forwards (" + fmax + ")");
  svg("text", {x: L + 4, y: T + 9, "font-size": 10, fill: "#6e6e73"}, "tokens resolved");
  data.runs.forEach(function (run, i) {
    const pts = [[0, 0]].concat(run.frames.map(function (f) { return [f.fwd, f.tokens]; }));
    svg("polyline", {points: pts.map(function (p) { return X(p[0]).toFixed(1) + "," + Y(p[1]).toFixed(1); }).join(" "),
                     fill: "none", stroke: run.color, "stroke-width": 2, "vector-effect": "non-scaling-stroke"});
    svg("text", {x: W - R - 6, y: H - B - 8 - 13 * (data.runs.length - 1 - i), "text-anchor": "end", "font-size": 11,
                 fill: run.color}, "\u2014 " + run.label + ": TPF " + fmt(run.tpf));
  });
  const cursor = svg("line", {x1: X(0), y1: T, x2: X(0), y2: H - B, stroke: "#1d1d1f", "stroke-dasharray": "3,3"});

  // ---- one run at forward f
  function renderRun(run, f) {
    const F = run.frames.length, K = run.K, nb = run.blocks.length;
    const fr = f > 0 ? run.frames[Math.min(f, F) - 1] : null;
    const now = f > 0 && f <= F;
    const curB = fr ? fr.b : 0;
    const newSet = new Set(now && fr ? fr.new : []);
    const unres = new Set(fr ? fr.unres : []);
    for (let b = 0; b < nb; b++) {
      run.rows[b].classList.toggle("current", fr !== null && b === curB && !fr.commit && now);
      for (let k = 0; k < K; k++) {
        const c = run.cells[b][k], t = c.firstChild, bar = c.lastChild;
        let cls = "tok", text = "", bg = "", tip = "block " + (b + 1) + ", position " + k, h = 0, id = null;
        if (fr === null) {
          if (b === 0) { cls += " masked"; text = "\u00B7"; bg = "#a9a9b3"; } else cls += " empty";
        } else if (b < curB || (b === curB && fr.commit)) {
          id = run.blocks[b][k]; cls += " committed"; text = show(run, id);
          if (b * K + k >= run.n_tokens) cls += " after-eos";
        } else if (b === curB) {
          id = fr.canvas[k];
          if (unres.has(k)) {
            cls += " masked"; bg = shade(fr.ent[k]);
            text = run.mask_id === null ? show(run, id) : "\u00B7";
          } else {
            cls += " committed"; text = show(run, id);
            if (newSet.has(k)) cls += " new";
            if (b * K + k >= run.n_tokens) cls += " after-eos";
          }
          if (fr.ent) tip += ", entropy " + fr.ent[k].toFixed(3);
          if (fr.rn) { tip += ", |z| " + fr.rn[k].toFixed(3); h = run.rn_max > 0 ? 7 * fr.rn[k] / run.rn_max : 0; }
        } else cls += " empty";
        c.className = cls; t.textContent = text; c.style.background = bg; c.title = tip;
        if (id === null) c.removeAttribute("data-id"); else c.setAttribute("data-id", id);
        bar.style.height = h.toFixed(2) + "px";
      }
    }
    const st = run.status;
    let msg;
    if (fr === null) msg = "before the first forward";
    else if (!now) msg = "done after " + F + " forwards: " + run.n_tokens + " tokens, TPF " + fmt(run.tpf);
    else {
      const blk = "block " + (fr.b + 1) + "/" + nb;
      const where = fr.commit ? blk + ": cache-commit pass (no token)"
                              : blk + ", step " + (fr.s + 1) + ": +" + fr.new.length + " committed";
      msg = "forward " + fr.fwd + "/" + F + " \u00B7 " + where + " \u00B7 " + fr.tokens + " tokens \u00B7 running TPF "
            + fmt(fr.tokens / fr.fwd);
    }
    st.textContent = msg;
    st.dataset.forwards = fr ? fr.fwd : 0;
    st.dataset.tokens = fr ? fr.tokens : 0;
  }

  function set(f) {
    f = Math.max(0, Math.min(fmax, Math.round(Number(f) || 0)));
    cur = f;
    slider.value = String(f);
    label.textContent = "forward " + f + " of " + fmax;
    data.runs.forEach(function (run) { renderRun(run, f); });
    cursor.setAttribute("x1", X(f)); cursor.setAttribute("x2", X(f));
    if (f >= fmax) stop();
  }
  function stop() {
    if (timer !== null) { clearInterval(timer); timer = null; }
    document.getElementById("play").textContent = "\u25B6\uFE0E play";
  }
  function play() {
    if (timer !== null) return stop();
    if (cur >= fmax) set(0);
    document.getElementById("play").textContent = "\u275A\u275A pause";
    timer = setInterval(function () { set(cur + 1); }, 400);
  }

  slider.addEventListener("input", function () { stop(); set(slider.value); });
  document.getElementById("prev").addEventListener("click", function () { stop(); set(cur - 1); });
  document.getElementById("next").addEventListener("click", function () { stop(); set(cur + 1); });
  document.getElementById("first").addEventListener("click", function () { stop(); set(0); });
  document.getElementById("last").addEventListener("click", function () { stop(); set(fmax); });
  document.getElementById("play").addEventListener("click", play);
  document.addEventListener("keydown", function (e) {
    if (e.altKey || e.ctrlKey || e.metaKey) return;
    let f = cur;
    switch (e.key) {
      case "ArrowRight": f += e.shiftKey ? 10 : 1; break;
      case "ArrowLeft": f -= e.shiftKey ? 10 : 1; break;
      case "Home": f = 0; break;
      case "End": f = fmax; break;
      case " ": e.preventDefault(); play(); return;
      default: return;
    }
    e.preventDefault();  // the focused slider would move too: one step per key press
    stop();
    set(f);
  });
  set(0);
  window.orlExplore = {set: set, get forward() { return cur; }, data: data};
})();
"""
