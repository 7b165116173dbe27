"""Oracle checks for the math verifiers: GSM8K 1319/1319 and MATH-500 500/500 in the forms models
write, wrong answers 0, and the per-item verify working in the main thread and in other threads."""
import threading

import pytest

from orl.eval.pool import verify_all
from orl.tasks.gsm8k import GSM8K, gold_answer
from orl.tasks.math500 import MATH500
from orl.tasks.mathcheck import last_boxed


@pytest.fixture(scope="module")
def gsm8k_test():
    return GSM8K().problems("test")


@pytest.fixture(scope="module")
def math500_test():
    return MATH500().problems("test")


def test_gsm8k_files_and_counts(gsm8k_test):
    assert len(gsm8k_test) == 1319
    assert gsm8k_test[0].prompt.startswith("Janet")
    assert gsm8k_test[0].answer == "18" and gsm8k_test[-1].answer == "14"
    assert "\\boxed{}" in gsm8k_test[0].prompt
    assert len(GSM8K().problems("train")) == 7473
    assert gold_answer("so 1,600 in all\n#### 1,600") == "1600"


def _gsm8k_forms(answer: str) -> list[str]:
    n = int(answer)
    forms = [f"#### {answer}", f"The answer is $\\boxed{{{answer}}}$", f"She makes {answer}.0 dollars.",
             f"Step 1: 3 + 4 = 7.\nStep 2: so the total is {answer}.\n#### {answer}",
             f"The answer is \\${answer}."]  # an escaped dollar: a currency sign
    if abs(n) >= 1000:
        forms += [f"The answer is {n:,}.", f"#### {n:,}", f"\\boxed{{{n:,}}}", f"She paid \\${n:,}."]
    return forms


def test_gsm8k_oracle_all_forms(gsm8k_test):
    task = GSM8K()
    pairs = [(p, c) for p in gsm8k_test for c in [p.meta["solution"], *_gsm8k_forms(p.answer)]]
    scores = verify_all(task, pairs, workers=2)
    wrong = [(p.id, c[-50:]) for (p, c), s in zip(pairs, scores) if s != 1.0]
    assert not wrong, wrong[:5]
    per_problem = {p.id for p, _ in pairs}
    assert len(per_problem) == 1319


def test_gsm8k_wrong_answers_score_zero(gsm8k_test):
    task = GSM8K()
    pairs = [(p, c) for p in gsm8k_test for c in (f"#### {int(p.answer) + 1}",
                                                  f"The answer is $\\boxed{{{int(p.answer) - 1}}}$",
                                                  f"The answer is \\${int(p.answer) + 1}.",
                                                  "I do not know.")]
    assert sum(verify_all(task, pairs, workers=2)) == 0


def test_math500_files_and_counts(math500_test):
    assert len(math500_test) == 500
    assert len({p.id for p in math500_test}) == 500
    assert math500_test[0].id == "test/precalculus/807.json"
    train = MATH500().problems("train")
    assert len(train) == 7498 and all(p.answer for p in train)  # 2 boxes are empty


def test_math500_oracle(math500_test):
    task = MATH500()
    pairs = []
    for p in math500_test:
        pairs += [(p, f"So the final answer is $\\boxed{{{p.answer}}}$."),
                  (p, p.meta["solution"])]
    scores = verify_all(task, pairs, workers=2)
    wrong = [(p.id, p.answer, c[-60:]) for (p, c), s in zip(pairs, scores) if s != 1.0]
    assert not wrong, wrong[:5]


def test_math500_wrong_answers_score_zero(math500_test):
    pairs = [(p, f"The answer is $\\boxed{{{p.answer}+1}}$.") for p in math500_test]
    assert sum(verify_all(MATH500(), pairs, workers=2)) == 0


@pytest.mark.parametrize("gold,completion,expected", [
    ("\\frac{3}{4}", "The answer is $0.75$.", 1.0),
    ("\\frac{3}{4}", "\\boxed{0.75}", 1.0),
    ("0.75", "\\boxed{\\frac34}", 1.0),
    ("\\frac{3}{4}", "\\boxed{0.7}", 0.0),
    ("(3,\\frac{\\pi}{2})", "$\\left( 3, \\frac{\\pi}{2} \\right)$", 1.0),
    ("2\\sqrt{2}", "\\boxed{\\sqrt{8}}", 1.0),
    ("18", "The answer is \\$18.", 1.0),
    ("18", "The answer is \\$19.", 0.0),
    ("\\$18.90", "The answer is \\$18.90.", 1.0),
])
def test_math_forms(gold, completion, expected):
    from orl.tasks.base import Problem
    assert MATH500().verify(Problem("x", "q", gold), completion) == expected


def test_verify_in_main_thread_and_in_a_thread(gsm8k_test):
    task, p = GSM8K(), gsm8k_test[0]
    assert task.verify(p, "#### 18") == 1.0  # main thread: math-verify's signal timeouts
    out = []
    t = threading.Thread(target=lambda: out.append(task.verify(p, "The answer is $\\boxed{18}$")))
    t.start()
    t.join()
    assert out == [1.0]  # other threads: runs without signal-based timeouts


def test_sft_solutions_verify(gsm8k_test, math500_test):
    g, m = GSM8K(), MATH500()
    assert g.solution(gsm8k_test[0]).endswith("The answer is $\\boxed{18}$.")
    assert "<<" not in g.solution(gsm8k_test[0])
    pairs = [(p, g.solution(p)) for p in gsm8k_test[:200]]
    assert sum(verify_all(g, pairs, workers=2)) == 200
    assert all(m.verify(p, m.solution(p)) == 1.0 for p in math500_test[:20])


def test_last_boxed():
    assert last_boxed("a \\boxed{1} b \\boxed{\\frac{1}{2}} c") == "\\frac{1}{2}"
    assert last_boxed("no box") is None
