"""lm-eval-harness's `local-completions` model against `orl serve`, on a local data file.

    python benchmarks/lm_eval_local.py --lm-eval /tmp/lmeval/bin/lm_eval                  # sdar/tiny (random)
    python benchmarks/lm_eval_local.py --lm-eval /tmp/lmeval/bin/lm_eval --model runs/demo/orl/final
    python benchmarks/lm_eval_local.py --lm-eval /tmp/lmeval/bin/lm_eval --loglikelihood  # + a multiple-choice task

Starts `orl serve` on ``--model`` on a free loopback port, writes a generate_until task into
``--out`` (``orl_local_arith.yaml`` and ``arith.jsonl``: held-out problems of the embedded
arithmetic task, `orl.tasks.arith`; the answer is the ``#<n>`` the model writes, graded by exact
match), runs

    lm_eval run --model local-completions --tasks orl_local_arith --include_path OUT \
        --model_args model=NAME,base_url=http://127.0.0.1:PORT/v1/completions,tokenizer_backend=None,\
tokenized_requests=False,num_concurrent=1,max_retries=1 --output_path OUT/results --log_samples

and prints lm_eval's table, the elapsed time and the command. ``--loglikelihood`` also runs a
multiple-choice version of the same questions: lm-eval scores choices with log-likelihood
requests (``echo=true, logprobs=1``; lm-eval needs a tokenizer for them, so this run passes the
server's, ``tokenizer_backend=huggingface``), which `orl serve` answers with a 400 naming them (a
block-diffusion model has no causal likelihood of a given text; docs/serving.md), so that task
fails with the server's message while generate_until works.

lm-eval is not a dependency of orl (it pulls datasets, evaluate, scikit-learn, ...): install it
in an environment of its own (``python -m venv /tmp/lmeval && /tmp/lmeval/bin/pip install
"lm-eval[api]"``: the API models need its ``api`` extra) and pass its ``lm_eval``. Nothing is downloaded: the task reads the JSONL through
`datasets`' json builder and HF_DATASETS_OFFLINE / HF_HUB_OFFLINE are set. Without lm_eval the
script checks that the server answers lm-eval's two request shapes and stops (CI makes the same
check: tests/test_server_openai.py::test_lm_eval_requests). benchmarks/RESULTS.md records a run.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

TASK = "orl_local_arith"
MC_TASK = "orl_local_arith_mc"

GEN_YAML = """task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: {max_tokens}
  temperature: 0
  do_sample: false
filter_list:
  - name: final_answer
    filter:
      - function: regex
        regex_pattern: "#\\\\s*(-?\\\\d+)"
      - function: take_first
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""

MC_YAML = """task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: 0
metric_list:
  - metric: acc
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_task(out: Path, n: int, max_tokens: int) -> list[dict]:
    """The JSONL (n held-out arith problems) and both task YAMLs under ``out``; returns the rows."""
    from orl.tasks.arith import make_task  # noqa: PLC0415
    problems = make_task(n_test=n).problems("test")
    rows = [{"id": p.id, "question": p.prompt, "answer": str(p.answer),
             "choices": [f"#{p.answer}", f"#{p.answer + 1}", f"#{p.answer - 1}", f"#{p.answer + 10}"]}
            for p in problems]
    out.mkdir(parents=True, exist_ok=True)
    data = out / "arith.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / f"{TASK}.yaml").write_text(GEN_YAML.format(task=TASK, data=data.resolve(), max_tokens=max_tokens))
    (out / f"{MC_TASK}.yaml").write_text(MC_YAML.format(task=MC_TASK, data=data.resolve()))
    return rows


def start_server(model: str, port: int, log: Path) -> subprocess.Popen:
    """`orl serve` on ``model`` (served under its own name), once /health says ready."""
    proc = subprocess.Popen([sys.executable, "-m", "orl", "serve", "--model", model, "--port", str(port),
                             "--log-level", "warning"], stdout=log.open("w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"orl serve exited with {proc.returncode}; see {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).json().get("ready"):
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.terminate()
    raise RuntimeError(f"orl serve did not become ready within 300 s; see {log}")


def check_shapes(url: str, model: str, question: str) -> dict:
    """lm-eval's two payloads (lm_eval/models/openai_completions.py): generate_until -> 200,
    loglikelihood -> 400 naming echo. Returns what the server said."""
    gen = {"prompt": [question], "model": model, "max_tokens": 16, "temperature": 0, "stop": ["\n"], "seed": 1234}
    ll = {"model": model, "prompt": [question + "#5"], "temperature": 0, "max_tokens": 1, "logprobs": 1,
          "seed": 1234, "echo": True}
    g, x = httpx.post(url, json=gen, timeout=120), httpx.post(url, json=ll, timeout=120)
    if g.status_code != 200 or x.status_code != 400 or x.json()["error"]["param"] != "echo":
        raise RuntimeError(f"unexpected answers: generate {g.status_code} {g.text[:200]}, "
                           f"loglikelihood {x.status_code} {x.text[:200]}")
    return {"generate_until": g.json()["choices"][0]["text"], "loglikelihood_400": x.json()["error"]["message"]}


def tokenizer_dir(model: str, out: Path) -> Path:
    """A directory holding the server's tokenizer: the checkpoint's own, or the named size's saved
    (lm-eval's log-likelihood path counts context tokens with a Hugging Face tokenizer)."""
    from orl.serve.llm import LLM, TOKENIZER_FILES  # noqa: PLC0415
    if os.path.isdir(model) and any(os.path.exists(os.path.join(model, f)) for f in TOKENIZER_FILES):
        return Path(model)
    target = out / "tokenizer"
    LLM(model).tokenizer.save_pretrained(target)  # the one `orl serve` picked for this model
    return target


def run_lm_eval(lm_eval: str, task: str, out: Path, model: str, url: str, limit: int,
                tokenizer: Path | None = None) -> tuple[int, str, float, list]:
    """One lm_eval run; ``tokenizer``: a Hugging Face tokenizer directory (else tokenizer_backend=None)."""
    tok = f"tokenizer_backend=huggingface,tokenizer={tokenizer}" if tokenizer else "tokenizer_backend=None"
    cmd = [lm_eval, "run", "--model", "local-completions", "--tasks", task, "--include_path", str(out),
           "--model_args", f"model={model},base_url={url},{tok},tokenized_requests=False,"
           "num_concurrent=1,max_retries=1", "--limit", str(limit),
           "--output_path", str(out / "results"), "--log_samples"]
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    return p.returncode, p.stdout + p.stderr, time.perf_counter() - t0, cmd


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="sdar/tiny", help="checkpoint directory or named size (default sdar/tiny: "
                    "random weights, so exact match is ~0: a plumbing check)")
    ap.add_argument("--lm-eval", default="lm_eval", help="the lm_eval executable (default: lm_eval on PATH)")
    ap.add_argument("--limit", type=int, default=20, help="problems (the JSONL holds this many; default 20)")
    ap.add_argument("--max-tokens", type=int, default=48, help="max_gen_toks of the task (default 48)")
    ap.add_argument("--out", default=None, help="work directory (default: a fresh temporary one, kept)")
    ap.add_argument("--loglikelihood", action="store_true", help="also run the multiple-choice task (fails: 400)")
    args = ap.parse_args(argv)

    out = Path(args.out or tempfile.mkdtemp(prefix="orl-lm-eval-"))
    rows = write_task(out, args.limit, args.max_tokens)
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1/completions"
    server = start_server(args.model, port, out / "server.log")
    try:
        shapes = check_shapes(url, args.model, rows[0]["question"])
        print(f"server answers lm-eval's requests: generate_until 200 ({shapes['generate_until']!r}), "
              f"loglikelihood 400: {shapes['loglikelihood_400'][:120]}...")
        exe = shutil.which(args.lm_eval)
        if exe is None:
            print(f"{args.lm_eval!r} not found: install lm-eval in its own environment and pass --lm-eval; "
                  f"the task is in {out}")
            return 0
        tasks = [TASK] + ([MC_TASK] if args.loglikelihood else [])
        rc_all = 0
        for task in tasks:
            tok = tokenizer_dir(args.model, out) if task == MC_TASK else None
            rc, text, secs, cmd = run_lm_eval(exe, task, out, args.model, url, args.limit, tok)
            print(f"\n$ {' '.join(cmd)}\n[{task}: exit {rc}, {secs:.1f} s]")
            lines = text.splitlines()
            table = [ln for ln in lines if ln.startswith("|")]
            said = [ln for ln in lines if "API request failed" in ln][:1]  # the server's answer, as lm-eval logs it
            print("\n".join(table) if rc == 0 and table else "\n".join(said + [ln for ln in lines if ln.strip()][-2:]))
            rc_all = rc_all or (rc if task == TASK else 0)
        return rc_all
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    sys.exit(main())
