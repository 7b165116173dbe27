"""Oracle checks for the code verifiers: HumanEval's canonical solutions pass 164/164 through the
sandbox (in the same worker pool scoring uses), corrupted ones fail; code extraction rules."""
import pytest

from orl.eval.pool import verify_all
from orl.tasks.codecheck import defines, extract_code
from orl.tasks.humaneval import HumanEval, build_program


@pytest.fixture(scope="module")
def humaneval():
    task = HumanEval()
    return task, task.problems()


def test_humaneval_canonical_164_of_164(humaneval):
    task, problems = humaneval
    assert len(problems) == 164
    pairs = [(p, p.meta["canonical_solution"]) for p in problems]  # raw continuation
    scores = verify_all(task, pairs, workers=4)
    assert [p.id for p, s in zip(problems, scores) if s != 1.0] == []


def test_humaneval_full_function_in_a_fence(humaneval):
    task, problems = humaneval
    sample = problems[::8]
    pairs = [(p, "Sure!\n```python\n" + p.answer["prompt"] + p.meta["canonical_solution"] + "```\n")
             for p in sample]
    assert sum(verify_all(task, pairs, workers=4)) == len(sample)


def test_humaneval_corrupted_fails(humaneval):
    task, problems = humaneval
    pairs = [(p, "    return None\n") for p in problems]
    pairs += [(p, p.meta["canonical_solution"].replace("return", "return not", 1))
              for p in problems[:40]]
    pairs += [(p, p.meta["canonical_solution"] + "\n    )(\n") for p in problems[:5]]  # syntax
    assert sum(verify_all(task, pairs, workers=4)) == 0


def test_extract_code_rules():
    text = "intro\n```python\ndef f(x):\n    return 1\n```\nmore\n```\ndef g():\n    pass\n```"
    assert extract_code(text, "g").startswith("def g")
    assert extract_code(text, "f").startswith("def f")
    assert extract_code(text).startswith("def f")
    assert extract_code("```python\ndef h():\n    return 2\n").startswith("def h")  # unclosed
    assert extract_code("    return x\n") == "    return x\n"
    assert extract_code("```bash\nls\n```\nplain") == "```bash\nls\n```\nplain"
    assert defines("import os\nasync def f(a):\n    pass", "f") and not defines("def ff():", "f")


def test_build_program_keeps_prompt_helpers(humaneval):
    _, problems = humaneval
    p = problems[10]  # its prompt defines a helper (is_palindrome) used by the solution
    full = p.answer["prompt"] + p.meta["canonical_solution"]
    program = build_program(p.answer, f"```python\ndef make_palindrome(string: str) -> str:\n{p.meta['canonical_solution']}```")
    assert "def is_palindrome" in program and program.rstrip().endswith("check(make_palindrome)")
    assert "def is_palindrome" in full


def test_mbpp_candidate_names_are_the_functions_under_test():
    from orl.tasks.mbpp import candidate_names

    tests = "assert math.isclose(area(2), 12.5)\nassert set(pairs(xs)) == {(1, 2)}\nassert [n for n in range(2)] == [0, 1]\n"
    assert candidate_names(tests, "import math\nxs = [1, 2]\n") == ["area", "pairs"]
    assert candidate_names("assert sum_it([1]) == 1\n", "") == ["sum_it"]  # builtins stay builtins
    assert candidate_names("assert f(\n", "") == []  # the harness reports the syntax error
