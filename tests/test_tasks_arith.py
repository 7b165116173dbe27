"""The embedded task: held-out split, the worked solutions' styles, the verifier."""
import random
import re

import pytest

from orl.tasks.arith import ArithTask


def _order(sol: str) -> list[int]:
    """The terms in the order a worked solution adds them."""
    lines = sol.split(";")[:-1]
    first = re.fullmatch(r"(\d+)\+(\d+)=\d+", lines[0]).groups()
    return [int(first[0]), int(first[1])] + [int(re.fullmatch(r"\d+\+(\d+)=\d+", x).group(1)) for x in lines[1:]]


def _check_worked(p, sol):
    order = _order(sol)
    assert sorted(order) == sorted(p.meta["operands"])
    acc = order[0]
    for line, x in zip(sol.split(";")[:-1], order[1:]):
        assert line.endswith(f"={acc + x}")
        acc += x
    assert sol.endswith(f"#{p.answer}")


def test_shuffle_fraction_and_styles():
    t = ArithTask()                                  # default: a quarter of the solutions shuffled
    ps = [t.sample("train", i) for i in range(2000)]
    in_prompt_order = 0
    for p in ps:
        sol = t.solution(p)
        _check_worked(p, sol)
        assert t.verify(p, sol) == 1.0
        in_prompt_order += _order(sol) == p.meta["operands"]
    # P(prompt order) = 0.75 + 0.25 * P(a shuffle keeps the order) >= 0.75 (+ ties of equal terms)
    frac = in_prompt_order / len(ps)
    assert 0.76 < frac < 0.83, frac
    never = ArithTask(shuffle=0.0)
    assert all(_order(never.solution(p)) == p.meta["operands"] for p in ps[:200])


def test_shuffle_one_is_the_fully_shuffled_task():
    t = ArithTask(shuffle=1.0)
    for i in range(50):
        p = t.sample("train", i)
        ops = list(p.meta["operands"])
        random.Random(f"order:{p.id}").shuffle(ops)       # every solution in its own drawn order
        assert _order(t.solution(p)) == ops


def test_heldout_disjoint_and_verifier():
    t = ArithTask()
    test_ops = {tuple(p.meta["operands"]) for p in t.problems("test")}
    assert len(test_ops) == 500
    assert not test_ops & {tuple(t.sample("train", i).meta["operands"]) for i in range(3000)}
    p = t.problems("test")[0]
    assert t.verify(p, f"junk;#{p.answer}") == 1.0
    assert t.verify(p, f"#{p.answer + 1};#{p.answer}") == 0.0      # the first #<int> counts
    assert t.verify(p, "no answer") == 0.0


def test_bad_arguments():
    with pytest.raises(ValueError, match="terms"):
        ArithTask(terms=1)
    with pytest.raises(ValueError, match="shuffle"):
        ArithTask(shuffle=1.5)


def test_strict_verifier_grades_the_work():
    """strict=True: every line a right sum continuing the previous one, the prompt's terms once each
    in any order, the final answer the last sum; the lenient score reads only the answer."""
    from orl.tasks.base import Problem
    t = ArithTask(strict=True)
    p = Problem(id="x", prompt="7+8+9+6=", answer=30, meta={"operands": [7, 8, 9, 6]})
    cases = {"ok": "7+8=15;15+9=24;24+6=30;#30", "ok ": "6+9=15; 15+8=23; 23+7=30; #30",   # another order
             "sum": "7+8=15;15+9=21;21+6=30;#30", "chain": "7+8=15;14+9=23;23+6=29;#30",
             "operands": "7+8=15;15+9=24;24+7=31;#30", "final": "7+8=15;15+9=24;24+6=30;#31",
             "malformed": "7+8=15;15+9;24+6=30;#30"}
    for want, text in cases.items():
        assert t.diagnose(p, text) == want.strip(), text
        assert t.verify(p, text) == float(want.strip() == "ok")
    assert t.verify_final(p, cases["sum"]) == 1.0 and ArithTask().verify(p, cases["sum"]) == 1.0
    assert all(t.verify(q, t.solution(q)) == 1.0 for q in ArithTask(strict=True, shuffle=1.0).problems("test")[:200])
