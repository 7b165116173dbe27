"""The transfer-table loaders (Table 2): IFEval, LiveCodeBench, GPQA-Diamond on small files written
here in the real layouts: SHA256 pinning, every IFEval instruction check on a passing and a failing
response, the paper's four IFEval accuracies by hand, LiveCodeBench stdin and functional problems
judged in the sandbox (and its compressed test cases read without unpickling), and GPQA's seeded,
recorded option shuffle."""
import base64
import csv
import json
import os
import pickle
import zlib
from pathlib import Path

import pytest

from orl.eval.prepare import load_prepared, prepare
from orl.eval.table import PAPER, TRANSFER_TASKS, main_table
from orl.tasks.base import Problem
from orl.tasks.datafile import sha256_file
from orl.tasks.gpqa import GPQA, SOURCES, choice_order
from orl.tasks.ifeval import IFEval, metrics, metrics_from_files
from orl.tasks.ifeval_checks import CHECKS, check, count_words, follows, split_sentences
from orl.tasks.livecodebench import LiveCodeBench, decode_test_cases, extract_program, run, same_output
from orl.tasks.registry import get_task, task_names

try:
    import langdetect  # noqa: F401
    HAVE_LANGDETECT = True
except ImportError:
    HAVE_LANGDETECT = False
LANGUAGE_IDS = {"language:response_language", "change_case:english_capital", "change_case:english_lowercase"}


def _write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return sha256_file(path)


def _pickled(obj) -> str:
    """The release's compression of private test cases: base64(zlib(pickle(obj)))."""
    return base64.b64encode(zlib.compress(pickle.dumps(obj, protocol=4))).decode()


# -- IFEval ---------------------------------------------------------------------------------------

# (instruction id, kwargs, a response that follows it, one that does not)
IFEVAL_CASES = [
    ("keywords:existence", {"keywords": ["correlated", "experiencing"]},
     "We are Experiencing CORRELATED events.", "We are experiencing things."),
    ("keywords:frequency", {"keyword": "story", "frequency": 2, "relation": "at least"},
     "A story, and another Story.", "One story only."),
    ("keywords:frequency", {"keyword": "war", "frequency": 2, "relation": "less than"},
     "One war.", "War and war."),
    ("keywords:forbidden_words", {"forbidden_words": ["rock", "field"]},
     "We rocked the fields.", "Rock on."),
    ("keywords:letter_frequency", {"letter": "t", "let_frequency": 2, "let_relation": "less than"},
     "A quiz about a chair.", "That cat."),
    ("keywords:letter_frequency", {"letter": "#", "let_frequency": 3, "let_relation": "at least"},
     "#a #b #c", "#a #b"),
    ("language:response_language", {"language": "de"},
     "Das Wetter ist heute sehr schön, und wir gehen am Nachmittag mit den Kindern in den Park.",
     "The weather is very nice today, and we are going to the park with the children."),
    ("length_constraints:number_sentences", {"num_sentences": 3, "relation": "less than"},
     "Dr. Smith arrived at 5 p.m. today. He sat down.", "One. Two! Three?"),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2},
     "***\nFirst part.\n***\nSecond part.", "First.\n***\n\n***\nSecond."),
    ("length_constraints:number_words", {"num_words": 5, "relation": "at least"},
     "one two three four five", "one two, three-four"),
    ("length_constraints:nth_paragraph_first_word",
     {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "However"},
     "Intro text.\n\n\"However, this works.\"", "Intro.\n\nMoreover, it does not."),
    ("detectable_content:number_placeholders", {"num_placeholders": 2},
     "Dear [name], at [address].", "Dear [name]."),
    ("detectable_content:postscript", {"postscript_marker": "P.S."},
     "Body.\n\np.s. Bring snacks.", "Body. PS bring snacks."),
    ("detectable_content:postscript", {"postscript_marker": "P.P.S"},
     "Body.\nP.P.S call me", "Body.\nP.S. call me"),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2},
     "Points:\n* one\n  * two", "* one\n* two\n- three"),
    ("detectable_format:constrained_response", {},
     "Well... My answer is maybe.", "Yes."),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 2},
     "*first* and **second**", "*only one* and ** **"),
    ("detectable_format:multiple_sections", {"section_spliter": "SECTION", "num_sections": 2},
     "SECTION 1\nfoo\nSECTION 2\nbar", "SECTION 1\nfoo\nSection 2\nbar"),
    ("detectable_format:json_format", {}, '```json\n{"a": [1, 2]}\n```', 'Here: {"a": 1}'),
    ("detectable_format:title", {}, "<<My Title>>\nbody", "<< >> body"),
    ("combination:two_responses", {}, "Answer one.\n******\nAnswer two.", "Same.\n******\nSame. "),
    ("combination:repeat_prompt", {"prompt_to_repeat": "Write a haiku about rain."},
     "write a haiku about rain. Drops fall...", "Here is a haiku about rain."),
    ("startend:end_checker", {"end_phrase": "Is there anything else I can help with?"},
     '"Done. Is there anything else I can help with?"', "Is there anything else I can help with? Bye."),
    ("change_case:capital_word_frequency", {"capital_frequency": 4, "capital_relation": "at least"},
     "The USA and NASA DON'T sleep.", "The USA and NASA sleep well-KNOWN."),
    ("change_case:capital_word_frequency", {"capital_frequency": 2, "capital_relation": "less than"},
     "Only ONE here.", "TWO WORDS here."),
    ("change_case:english_capital", {}, "THIS IS AN ENGLISH SENTENCE ABOUT THE WEATHER TODAY.",
     "THIS IS mostly UPPER CASE."),
    ("change_case:english_lowercase", {}, "this is an english sentence about the weather today.",
     "This is not all lower case."),
    ("punctuation:no_comma", {}, "No commas here.", "Yes, a comma."),
    ("startend:quotation", {}, '  "Wrapped in quotes."\n', '"Not closed.'),
]


def test_every_ifeval_instruction_has_a_case():
    assert len(CHECKS) == 25 and {c[0] for c in IFEVAL_CASES} == set(CHECKS)


@pytest.mark.parametrize("iid,kwargs,good,bad", IFEVAL_CASES, ids=[c[0] for c in IFEVAL_CASES])
def test_ifeval_check_passes_and_fails(iid, kwargs, good, bad):
    if iid in LANGUAGE_IDS and not HAVE_LANGDETECT:
        pytest.skip("langdetect is not installed (pip install langdetect)")
    assert check(iid, good, kwargs) is True
    assert check(iid, bad, kwargs) is False


def test_ifeval_text_measures():
    assert count_words("It's a well-known fact: 3.5 apples!") == 9  # It s a well known fact 3 5 apples
    assert split_sentences("Mr. Lee met Ms. Kay, e.g. at noon. They left! Why?\n1. one. two") == [
        "Mr. Lee met Ms. Kay, e.g. at noon.", "They left!", "Why?", "1. one.", "two"]
    assert split_sentences("no end punctuation\nat all") == ["no end punctuation\nat all"]
    assert split_sentences("   ") == []


def test_ifeval_strict_and_loose():
    ids = ["detectable_format:json_format", "startend:end_checker"]
    kw = [{}, {"end_phrase": "Any questions?"}]
    # an intro line and markdown emphasis: strict fails, loose (first line removed, '*' removed) passes
    assert follows(ids[:1], kw[:1], 'Sure, here it is:\n{"a": 1}') == ([False], [True])
    assert follows(ids[1:], kw[1:], "Done. **Any questions?**") == ([False], [True])
    assert follows(ids, kw, "") == ([False, False], [False, False])  # an empty response follows nothing


def _ifeval_rows():
    return [
        {"key": 1, "prompt": "Count to three without commas, in 3+ words.",
         "instruction_id_list": ["punctuation:no_comma", "length_constraints:number_words"],
         "kwargs": [{}, {"relation": "at least", "num_words": 3}]},
        {"key": 2, "prompt": "Give JSON.", "instruction_id_list": ["detectable_format:json_format"],
         "kwargs": [{"num_highlights": None, "relation": None}]},  # a null-filled export
        {"key": 3, "prompt": "Quote it, no commas.",
         "instruction_id_list": ["punctuation:no_comma", "startend:quotation"], "kwargs": [{}, {}]},
    ]


def test_ifeval_file_pinning_and_four_accuracies(tmp_path):
    path = tmp_path / "input_data.jsonl"
    sha = _write_jsonl(path, _ifeval_rows())
    with pytest.raises(ValueError, match=sha):  # nothing recorded: the hash to pin is printed
        IFEval(path=str(path)).problems()
    wrong = "0" * 64
    with pytest.raises(ValueError) as e:
        IFEval(path=str(path), sha256=wrong).problems()
    assert wrong in str(e.value) and sha in str(e.value) and str(path) in str(e.value)
    task = IFEval(path=str(path), sha256=sha)
    problems = task.problems()
    assert [p.id for p in problems] == ["ifeval/1", "ifeval/2", "ifeval/3"]
    assert problems[1].answer["kwargs"] == [{}] and problems[0].prompt == _ifeval_rows()[0]["prompt"]
    completions = ["one two three", 'Sure:\n{"a": 1}', "a, b"]
    m = metrics(zip(problems, completions))
    # strict: [T, T], [F], [F, F]; loose: [T, T], [T], [F, F]
    assert (m["prompt_strict"], m["prompt_loose"]) == (1 / 3, 2 / 3)
    assert (m["instruction_strict"], m["instruction_loose"]) == (2 / 5, 3 / 5)
    assert m["n_prompts"] == 3 and m["n_instructions"] == 5
    assert m["by_instruction"]["punctuation:no_comma"] == {"n": 2, "strict": 0.5, "loose": 0.5}
    assert [task.verify(p, c) for p, c in zip(problems, completions)] == [1.0, 0.0, 0.0]
    half = IFEval(path=str(path), sha256=sha, metric="instruction_strict")
    assert half.verify(problems[2], "a b") == 0.5 and task.verify(problems[2], "a b") == 0.0
    assert IFEval(path=str(path), sha256=sha, metric="prompt_loose").verify(problems[1], completions[1]) == 1.0
    # the same numbers from an `orl eval` run's files
    prepared = prepare("ifeval", tmp_path / "prep", task_kwargs={"path": str(path), "sha256": sha})
    gens = tmp_path / "gens.jsonl"
    gens.write_text(json.dumps({"type": "header"}) + "\n" + "".join(
        json.dumps({"id": p.id, "completion": c}) + "\n" for p, c in zip(problems, completions)))
    assert metrics_from_files(prepared, gens)["instruction_loose"] == 3 / 5


def test_ifeval_bad_records_name_the_record(tmp_path):
    path = tmp_path / "bad.jsonl"
    rows = _ifeval_rows()
    rows[2]["instruction_id_list"][1] = "startend:no_such_check"
    sha = _write_jsonl(path, rows)
    with pytest.raises(ValueError, match=r"record 2 \(key 3\).*startend:no_such_check"):
        IFEval(path=str(path), sha256=sha).problems()
    rows = _ifeval_rows()
    rows[0]["kwargs"][1] = {"relation": "at most", "num_words": 3}
    sha = _write_jsonl(path, rows)
    with pytest.raises(ValueError, match="relation must be one of"):
        IFEval(path=str(path), sha256=sha).problems()
    with pytest.raises(ValueError, match="metric"):
        IFEval(metric="strict")


# -- LiveCodeBench ----------------------------------------------------------------------------------

STDIN_PRIVATE = [{"input": "10 20\n", "output": "30\n", "testtype": "stdin"},
                 {"input": "-4 4\n", "output": "0", "testtype": "stdin"}]
FUNCTIONAL_PRIVATE = [{"input": "0\n[]", "output": "[]", "testtype": "functional"},
                      {"input": "-1\n[5, 6, 7]", "output": "[4, 5, 6]", "testtype": "functional"}]


def _lcb_rows():
    return [
        {"question_title": "Sum", "question_content": "Print A+B.", "platform": "atcoder",
         "question_id": "abc001_a", "contest_id": "abc001", "contest_date": "2024-08-03T00:00:00",
         "starter_code": "", "difficulty": "easy",
         "public_test_cases": json.dumps([{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]),
         "private_test_cases": _pickled(json.dumps(STDIN_PRIVATE)), "metadata": "{}"},
        {"question_title": "Add to all", "question_content": "Add a to every element of b.",
         "platform": "leetcode", "question_id": "3000", "contest_id": "weekly-contest-400",
         "contest_date": "2025-02-10T00:00:00", "difficulty": "easy",
         "starter_code": "class Solution:\n    def addTwo(self, a: int, b: List[int]) -> List[int]:\n        ",
         "public_test_cases": json.dumps([{"input": "3\n[1, 2]", "output": "[4, 5]", "testtype": "functional"}]),
         "private_test_cases": base64.b64encode(zlib.compress(json.dumps(FUNCTIONAL_PRIVATE).encode())).decode(),
         "metadata": json.dumps({"func_name": "addTwo"})},
    ]


@pytest.fixture(scope="module")
def lcb(tmp_path_factory):
    path = tmp_path_factory.mktemp("lcb") / "test.jsonl"
    sha = _write_jsonl(path, _lcb_rows())
    return path, sha


def test_lcb_loads_both_kinds_without_unpickling(lcb, monkeypatch):
    path, sha = lcb

    def refuse(*args, **kwargs):
        raise AssertionError("pickle.loads must never be called on data")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    stdin, functional = LiveCodeBench(path=str(path), sha256=sha).problems()
    assert stdin.id == "livecodebench/abc001_a" and stdin.answer["testtype"] == "stdin"
    assert stdin.answer["fn_name"] is None and len(stdin.answer["tests"]) == 3  # public + private
    assert stdin.answer["tests"][2] == {"input": "-4 4\n", "output": "0"}
    assert functional.answer == {"testtype": "functional", "fn_name": "addTwo", "tests": [
        {"input": "3\n[1, 2]", "output": "[4, 5]"}, *({"input": t["input"], "output": t["output"]}
                                                   for t in FUNCTIONAL_PRIVATE)]}
    assert "class Solution:" in functional.prompt and "standard input" in stdin.prompt
    assert [p.id for p in LiveCodeBench(path=str(path), sha256=sha, date_from="2025-01-01").problems()] == [
        "livecodebench/3000"]
    assert LiveCodeBench(path=str(path), sha256=sha, date_to="2024-12-31").problems()[0].id == stdin.id
    with pytest.raises(ValueError, match="0" * 64):
        LiveCodeBench(path=str(path), sha256="0" * 64).problems()


class _Boom:
    def __reduce__(self):  # what a hostile data file would carry: a call made when unpickled
        return (os.system, ("echo unpickled",))


def test_lcb_refuses_pickles_of_anything_but_one_string():
    for hostile in (_Boom(), STDIN_PRIVATE, [json.dumps(STDIN_PRIVATE), "second"]):
        with pytest.raises(ValueError, match="never unpickles"):
            decode_test_cases(_pickled(hostile), "row 7")
    with pytest.raises(ValueError, match="neither JSON nor base64"):
        decode_test_cases("not base64 at all!", "row 7")
    with pytest.raises(ValueError, match="test case 0"):
        decode_test_cases(json.dumps([{"input": "1", "output": 2, "testtype": "stdin"}]), "row 7")
    assert decode_test_cases(STDIN_PRIVATE, "row 7") == STDIN_PRIVATE


def test_lcb_output_comparison_and_extraction():
    assert same_output("3  \n\n", "3") and same_output("1.0 2\n", "1 2.00")
    assert not same_output("3\n4", "3") and not same_output("a b", "a c") and not same_output("1e", "1")
    text = "Idea first:\n```python\nprint(1)\n```\nFinal:\n```python\nprint(2)\n```\n"
    assert extract_program(text) == "print(2)\n"
    assert extract_program("```python\nprint(3)\n") == "print(3)\n"  # cut off by the token budget
    assert extract_program("print(4)") == "print(4)"


STDIN_GOOD = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
STDIN_GOOD_2 = ("```python\nimport sys, threading\n\ndef main():\n    a, b = map(int, open(0).read().split())\n"
                "    sys.stdout.write(str(a + b + pow(2, 10, 7) - 2) + '\\n')\n    sys.exit(0)\n\n"
                "if __name__ == '__main__':\n    threading.stack_size(1 << 26)\n"
                "    threading.Thread(target=main).start()\n```")
STDIN_PUBLIC_ONLY = "```python\nprint(3)\n```"  # right on the public test, wrong on the private ones
FUNCTIONAL_GOOD = ("```python\nclass Solution:\n    def addTwo(self, a: int, b: List[int]) -> List[int]:\n"
                   "        return tuple(x + a for x in b)\n```")
FUNCTIONAL_BAD = FUNCTIONAL_GOOD.replace("x + a", "x - a")


def test_lcb_judged_in_the_sandbox(lcb):
    path, sha = lcb
    task = LiveCodeBench(path=str(path), sha256=sha)
    stdin, functional = task.problems()
    assert run(stdin.answer, STDIN_GOOD).passed
    assert task.verify(stdin, STDIN_GOOD_2) == 1.0  # fd 0, a thread, sys.exit, __main__, builtin pow
    r = run(stdin.answer, STDIN_PUBLIC_ONLY)
    assert r.status == "fail" and "test 2 of 3" in r.reason
    assert task.verify(functional, FUNCTIONAL_GOOD) == 1.0  # a tuple counts as a list
    r = run(functional.answer, FUNCTIONAL_BAD)
    assert r.status == "fail" and "test 1 of 3" in r.reason
    assert task.verify(functional, "```python\nclass Solution:\n    def addTwo(self, a, b):\n        raise KeyError(a)\n```") == 0.0


# -- GPQA ---------------------------------------------------------------------------------------

GPQA_COLUMNS = ["Pre-Revision Question", "Pre-Revision Correct Answer", "Question", "Correct Answer",
                "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3", "Explanation",
                "Record ID", "High-level domain", "Subdomain"]


def _gpqa_csv(path: Path, reverse: bool = False) -> str:
    rows = [{"Question": f"Question {k}?", "Correct Answer": f"right {k}", "Incorrect Answer 1": f"w1 {k}",
             "Incorrect Answer 2": f"w2 {k}", "Incorrect Answer 3": f"w3 {k}", "Record ID": f"rec{k}",
             "High-level domain": "Physics", "Subdomain": "Optics", "Explanation": "because, \"quoted\"\nlines"}
            for k in "ABC"]
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=GPQA_COLUMNS, restval="")
        w.writeheader()
        w.writerows(rows[::-1] if reverse else rows)
    return sha256_file(path)


def test_gpqa_shuffle_is_seeded_recorded_and_scored(tmp_path):
    path = tmp_path / "gpqa_diamond.csv"
    sha = _gpqa_csv(path)
    with pytest.raises(ValueError, match=sha):
        GPQA(path=str(path)).problems()
    with pytest.raises(ValueError, match="0" * 64):
        GPQA(path=str(path), sha256="0" * 64).problems()
    problems = GPQA(path=str(path), sha256=sha).problems()
    assert choice_order(0, "recA") == [2, 1, 3, 0]  # pinned: the order must never change silently
    a = problems[0]
    assert a.id == "gpqa-diamond/recA" and a.answer == "D" and a.meta["seed"] == 0
    assert a.meta["order"] == [SOURCES[i] for i in (2, 1, 3, 0)]
    assert "A. w2 A\nB. w1 A\nC. w3 A\nD. right A" in a.prompt and "about Physics" in a.prompt
    for p in problems:  # the recorded order and the answer letter agree with the prompt
        letter = "ABCD"[p.meta["order"].index("Correct Answer")]
        assert p.answer == letter and f"{letter}. right {p.id[-1]}" in p.prompt
    again = GPQA(path=str(path), sha256=sha).problems()
    assert [(p.prompt, p.answer) for p in again] == [(p.prompt, p.answer) for p in problems]
    rev = tmp_path / "reversed.csv"
    by_id = {p.id: p for p in GPQA(path=str(rev), sha256=_gpqa_csv(rev, reverse=True)).problems()}
    assert all(by_id[p.id].prompt == p.prompt for p in problems)  # row order does not matter
    other = GPQA(path=str(path), sha256=sha, seed=1).problems()
    assert other[0].meta["order"] == [SOURCES[i] for i in choice_order(1, "recA")] != a.meta["order"]
    task = GPQA(path=str(path), sha256=sha)
    assert task.verify(a, "Reasoning...\nThe answer is \\boxed{D}.") == 1.0
    assert task.verify(a, "The answer is (D)") == 1.0
    assert task.verify(a, "\\boxed{A}") == 0.0 and task.verify(a, "no letter") == 0.0


def test_gpqa_shuffle_is_uniform():
    counts = [0, 0, 0, 0]
    for k in range(400):
        counts[choice_order(0, f"rec{k}").index(0)] += 1
    assert all(70 <= c <= 130 for c in counts), counts  # 100 each expected; 4.3 sigma bounds


# -- registry, pipeline, table ---------------------------------------------------------------------

def test_registry_prepare_round_trip_and_table(lcb, tmp_path):
    assert {"ifeval", "livecodebench", "gpqa-diamond"} <= set(task_names())
    path, sha = lcb
    assert get_task("livecodebench", path=str(path), sha256=sha).name == "livecodebench"
    prepared = load_prepared(prepare("livecodebench", tmp_path / "lcb", task_kwargs={"path": str(path), "sha256": sha}))
    assert prepared.manifest["source"]["sha256"] == sha
    task, problem = prepared.task(), prepared.problems()[1]  # answers as JSON read them back
    assert isinstance(problem, Problem) and task.verify(problem, FUNCTIONAL_GOOD) == 1.0
    md, data = main_table({"ifeval": {"accuracy": 0.5, "tpf": 2.0, "n": 4}}, "llada", "base", TRANSFER_TASKS)
    assert [line.split(" | ")[0] for line in md.splitlines()[4:]] == [
        "| AIME-24", "| MMLU-Pro", "| GPQA-D", "| LCB-v6", "| IFEval"]
    assert data["tasks"]["ifeval"]["delta_accuracy"] == round(50.0 - 84.1, 4)
    assert PAPER[("dgemma", "orl")]["livecodebench"] == (51.4, 24.09)
