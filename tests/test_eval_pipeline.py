"""prepare -> generate -> score -> table: manifest refusal, resumable generation after a crash,
malformed-line errors, isolated scoring, reward == eval agreement, the worker pool's timeouts."""
import json
from pathlib import Path

import pytest

from orl.eval.generate import generate_jsonl
from orl.eval.jsonlog import read_log
from orl.eval.pool import rewards, verify_all, verify_iter
from orl.eval.prepare import load_prepared, prepare
from orl.eval.score import score_jsonl
from orl.eval.table import PAPER, main_table
from orl.tasks.base import Problem
from orl.tasks.registry import get_task

FIX = Path(__file__).parent / "fixtures"
MBPP_KW = {"path": str(FIX / "mbpp" / "mbpp.jsonl"),
           "sha256": "ccf403dcc7874cfa8e89a99ad0c5f52823618395c9c1ed0ab9487bc222f23f17"}
PROTOCOL = {"model": "fake", "decoder": "threshold", "threshold": 0.9, "block": 32, "seed": 0}


class FakeModel:
    """generate_fn stand-in: answers GSM8K correctly on even rows, counts its calls."""

    def __init__(self, answers: dict[str, str], crash_after: int | None = None):
        self.answers, self.crash_after, self.calls = answers, crash_after, []

    def __call__(self, prompt: str) -> dict:
        if self.crash_after is not None and len(self.calls) >= self.crash_after:
            raise KeyboardInterrupt("simulated crash")
        self.calls.append(prompt)
        answer = self.answers[prompt]
        text = f"#### {answer}" if len(self.calls) % 2 else f"The answer is \\boxed{{{int(answer) + 1}}}"
        return {"completion": text, "n_tokens": 64, "forwards": 20, "forwards_no_commit": 16,
                "latency_s": 0.01, "steps_per_block": [4, 4]}


@pytest.fixture
def gsm8k_dir(tmp_path):
    return prepare("gsm8k", tmp_path / "prepared", limit=6)


def _model(prepared_dir, **kw):
    rows = load_prepared(prepared_dir).rows
    return FakeModel({r["prompt"]: r["answer"] for r in rows}, **kw)


def test_prepare_writes_manifest_and_refuses_tampering(gsm8k_dir):
    prepared = load_prepared(gsm8k_dir)
    m = prepared.manifest
    assert m["n"] == 6 and m["task"] == "gsm8k" and m["limit"] == 6 and m["split"] == "test"
    assert m["source"]["sha256"] == get_task("gsm8k").data_file().sha256
    assert prepared.problems()[0].answer == "18"
    prompts = gsm8k_dir / "prompts.jsonl"
    prompts.write_text(prompts.read_text().replace("Janet", "Jane"))
    with pytest.raises(ValueError, match="does not match its manifest.*expected sha256"):
        load_prepared(gsm8k_dir)
    (gsm8k_dir / "manifest.json").unlink()
    with pytest.raises(FileNotFoundError, match="run orl.eval.prepare"):
        load_prepared(gsm8k_dir)


def test_prepare_with_chat_template(tmp_path):
    class Tok:
        name_or_path = "fake-tokenizer"
        chat_template = "{{ messages }}"

        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            assert not tokenize and add_generation_prompt
            return f"<user>{messages[0]['content']}</user><assistant>"

    d = prepare("gsm8k", tmp_path / "p", limit=2, chat_template_tokenizer=Tok())
    prepared = load_prepared(d)
    assert prepared.rows[0]["prompt"].startswith("<user>Janet")
    assert prepared.problems()[0].prompt.startswith("Janet")
    assert prepared.manifest["chat_template"]["tokenizer"] == "fake-tokenizer"


def test_generate_resumes_after_crash_without_redoing(gsm8k_dir, tmp_path):
    out = tmp_path / "gen.jsonl"
    first = _model(gsm8k_dir, crash_after=3)
    with pytest.raises(KeyboardInterrupt):
        generate_jsonl(gsm8k_dir, out, first, PROTOCOL, progress=False)
    assert len(first.calls) == 3
    with open(out, "a") as f:
        f.write('{"type": "result", "id": "gsm8k/test/3", "compl')  # a write cut by the crash
    second = _model(gsm8k_dir)
    summary = generate_jsonl(gsm8k_dir, out, second, PROTOCOL, progress=False)
    assert summary == {"path": str(out), "n": 6, "n_done_before": 3, "n_new": 3}
    assert len(second.calls) == 3 and not set(second.calls) & set(first.calls)
    header, records, _, truncated = read_log(out)
    assert not truncated and header["protocol"] == PROTOCOL
    assert [r["id"] for r in records] == [f"gsm8k/test/{i}" for i in range(6)]
    assert records[0]["tpf"] == 64 / 20 and records[0]["tpf_no_commit"] == 4.0
    assert records[0]["steps_per_block"] == [4, 4]  # extra keys are kept
    third = _model(gsm8k_dir)
    assert generate_jsonl(gsm8k_dir, out, third, PROTOCOL, progress=False)["n_new"] == 0
    assert third.calls == []


def test_generate_refuses_other_protocol_or_prompts(gsm8k_dir, tmp_path):
    out = tmp_path / "gen.jsonl"
    generate_jsonl(gsm8k_dir, out, _model(gsm8k_dir), PROTOCOL, limit=2, progress=False)
    with pytest.raises(ValueError, match="(?s)different 'protocol'.*0.8"):
        generate_jsonl(gsm8k_dir, out, _model(gsm8k_dir), {**PROTOCOL, "threshold": 0.8}, progress=False)
    other = prepare("gsm8k", tmp_path / "other", limit=3)
    with pytest.raises(ValueError, match="different 'manifest_sha256'"):
        generate_jsonl(other, out, _model(other), PROTOCOL, progress=False)


def test_generate_errors_name_line_and_missing_keys(gsm8k_dir, tmp_path):
    out = tmp_path / "gen.jsonl"
    generate_jsonl(gsm8k_dir, out, _model(gsm8k_dir), PROTOCOL, limit=3, progress=False)
    lines = out.read_text().splitlines(keepends=True)
    lines[2] = lines[2][:20] + "\n"  # corrupt line 3 of 4 (not the last one)
    out.write_text("".join(lines))
    with pytest.raises(ValueError, match=r"gen\.jsonl:3: malformed"):
        generate_jsonl(gsm8k_dir, out, _model(gsm8k_dir), PROTOCOL, progress=False)
    with pytest.raises(KeyError, match="forwards_no_commit"):
        generate_jsonl(gsm8k_dir, tmp_path / "g2.jsonl", lambda p: {"completion": "1", "n_tokens": 1,
                       "forwards": 1, "latency_s": 0.0}, PROTOCOL, progress=False)


def test_score_aggregates_and_resumes(gsm8k_dir, tmp_path):
    gen, scored = tmp_path / "gen.jsonl", tmp_path / "scored.jsonl"
    generate_jsonl(gsm8k_dir, gen, _model(gsm8k_dir), PROTOCOL, progress=False)
    result = score_jsonl(gen, gsm8k_dir, scored, workers=2, progress=False)
    assert result["n"] == 6 and result["accuracy"] == 0.5 and result["n_errors"] == 0
    assert result["tpf"] == 64 / 20 and result["tpf_no_commit"] == 4.0
    lines = scored.read_text().splitlines(keepends=True)
    scored.write_text("".join(lines[:-1]) + lines[-1][:15])  # crash while writing the last score
    again = score_jsonl(gen, gsm8k_dir, scored, workers=2, progress=False)
    assert again == result
    _, records, _, _ = read_log(scored)
    assert len(records) == 6 and len({r["id"] for r in records}) == 6
    other = prepare("gsm8k", tmp_path / "other", limit=6, task_kwargs={"timeout_s": 3})
    with pytest.raises(ValueError, match="generated from other prompts"):
        score_jsonl(gen, other, tmp_path / "s2.jsonl", progress=False)


CASES = [  # (task, task kwargs, problem index, completion)
    ("gsm8k", {}, 0, "#### 18"), ("gsm8k", {}, 0, "The answer is $\\boxed{18}$"),
    ("gsm8k", {}, 0, "She makes 18.0 dollars"), ("gsm8k", {}, 0, "#### 19"),
    ("math500", {}, 0, "\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}"), ("math500", {}, 0, "\\boxed{(3, 0)}"),
    ("humaneval", {}, 0, "CANONICAL"), ("humaneval", {}, 0, "    return True\n"),
    ("mbpp", MBPP_KW, 0, "```python\ndef reverse_string(s):\n    return s[::-1]\n```"),
    ("mbpp", MBPP_KW, 0, "def reverse_string(s):\n    return s\n"),
]


def test_reward_equals_eval_on_fixed_cases(tmp_path):
    """The verifier called directly, the training reward path (`orl.eval.pool.rewards`, as
    `orl.train.rollout.rollout_group` calls it), the pool and the full prepare -> generate -> score
    path give the same verdicts on the same cases."""
    by_task: dict[str, list] = {}
    for name, kw, index, completion in CASES:
        by_task.setdefault(name, []).append((kw, index, completion))
    for name, cases in by_task.items():
        kw = cases[0][0]
        task = get_task(name, **kw)
        d = prepare(name, tmp_path / name, limit=1, task_kwargs=kw)
        problem = load_prepared(d).problems()[0]
        completions = [problem.meta["canonical_solution"] if c == "CANONICAL" else c for _, _, c in cases]
        direct = [task.verify(problem, c) for c in completions]
        reward = rewards(task, [(problem, c) for c in completions], workers=2).scores
        pooled = verify_all(task, [(problem, c) for c in completions], workers=2)
        evaluated = []
        for k, c in enumerate(completions):
            gen, out = tmp_path / f"{name}-{k}.jsonl", tmp_path / f"{name}-{k}-scored.jsonl"
            generate_jsonl(d, gen, lambda p, c=c: {"completion": c, "n_tokens": 1, "forwards": 1,
                           "forwards_no_commit": 1, "latency_s": 0.0}, PROTOCOL, progress=False)
            evaluated.append(score_jsonl(gen, d, out, workers=1, progress=False)["accuracy"])
        assert direct == reward == pooled == evaluated, name
        assert reward[0] == 1.0 and reward[-1] == 0.0, name


def test_pool_survives_hangs_crashes_and_exceptions(tmp_path, monkeypatch):
    (tmp_path / "bad_tasks.py").write_text(
        "import os, time\n"
        "class Bad:\n    name = 'bad'\n"
        "    def problems(self, split):\n        return []\n"
        "    def verify(self, problem, completion):\n"
        "        if completion == 'hang': time.sleep(60)\n"
        "        if completion == 'crash': os._exit(7)\n"
        "        if completion == 'raise': raise RuntimeError('verifier bug')\n"
        "        return 1.0\n"
        "def make():\n    return Bad()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    task = get_task("bad_tasks:make")
    p = Problem("x", "q", "a")
    items = [(p, c) for c in ("ok", "hang", "ok", "crash", "raise", "ok")]
    verdicts = sorted(verify_iter(task, items, workers=2, timeout_s=1.0), key=lambda v: v.index)
    assert [v.score for v in verdicts] == [1.0, 0.0, 1.0, 0.0, 0.0, 1.0]
    assert verdicts[1].error.startswith("timeout") and "exit code 7" in verdicts[3].error
    assert "verifier bug" in verdicts[4].error


def test_main_table_all_rows():
    results = {"gsm8k": {"accuracy": 0.9, "tpf": 3.0, "n": 1319}, "math500": {"accuracy": 0.5, "tpf": 2.0, "n": 500}}
    for family, role in PAPER:
        md, data = main_table(results, family, role)
        assert md.count("\n|") >= 5 and data["tasks"]["gsm8k"]["ours"]["accuracy"] == 90.0
    md, data = main_table(results, "sdar", "orl")
    assert "| GSM8K | 90.0 | 92.4 | -2.4 | 3.00 | 5.9 | 1319 |" in md
    assert data["tasks"]["humaneval"]["paper"] == {"accuracy": 89.6, "tpf": 11.1}
    assert json.loads(json.dumps(data)) == data
    with pytest.raises(ValueError, match="no published row"):
        main_table(results, "gpt", "orl")
