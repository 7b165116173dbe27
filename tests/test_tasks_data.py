"""Data-file pinning and loader errors (sha mismatch, missing file, malformed lines), the local
MBPP / MMLU-Pro / AIME loaders on hand-written fixtures, and the task registry."""
import shutil
from pathlib import Path

import pytest

from orl.tasks.aime import AIME
from orl.tasks.base import Problem
from orl.tasks.datafile import read_jsonl, read_records, sha256_file
from orl.tasks.gsm8k import GSM8K
from orl.tasks.humaneval import HumanEval
from orl.tasks.mbpp import MBPP
from orl.tasks.mmlu_pro import MMLUPro, extract_letter
from orl.tasks.registry import get_task, load_custom_task, task_names

FIX = Path(__file__).parent / "fixtures"
SHA = {
    "mbpp": "ccf403dcc7874cfa8e89a99ad0c5f52823618395c9c1ed0ab9487bc222f23f17",
    "sanitized": "70a88e3e7e452ebf5f83e72bb5baf2d35a3f56ddfac7c3cea2a3a75e7311ac41",
    "mmlu": "c7daa35baa8420391ad6e46ff1b58a7eae060a26e83d4c6c146a7574e44ede9c",
    "aime": "b2afcab6d0c03ce30ee7a8ab381864eae1761d3181754d6d7b0ed8b429f092db",
}


def test_packaged_files_match_pins():
    for task in (GSM8K(), HumanEval()):
        df = task.data_file("test")
        assert sha256_file(df.path) == df.sha256
    assert len(HumanEval().problems()) == 164


def test_sha_mismatch_names_path_hashes_and_fix(tmp_path):
    bad = tmp_path / "test.jsonl"
    shutil.copy(GSM8K().data_file("test").path, bad)
    with open(bad, "a") as f:
        f.write('{"question": "extra", "answer": "#### 1"}\n')
    with pytest.raises(ValueError) as e:
        GSM8K(path=str(bad)).problems("test")
    msg = str(e.value)
    assert str(bad) in msg and GSM8K().data_file().sha256 in msg and sha256_file(bad) in msg
    assert "sha256=" in msg  # the fix: pass the hash explicitly
    assert len(GSM8K(path=str(bad), sha256=sha256_file(bad)).problems()) == 1320


def test_missing_file_names_path_and_how_to_get(tmp_path, monkeypatch):
    monkeypatch.setenv("ORL_DATA", str(tmp_path / "data"))
    with pytest.raises(FileNotFoundError) as e:
        MBPP().problems("test")
    msg = str(e.value)
    assert str(tmp_path / "data" / "mbpp" / "mbpp.jsonl") in msg and "google-research" in msg
    with pytest.raises(FileNotFoundError, match="mmlu-pro"):
        MMLUPro().problems()


def test_unpinned_local_file_is_refused_with_its_hash(tmp_path):
    with pytest.raises(ValueError, match=SHA["aime"]):
        AIME(path=str(FIX / "aime.jsonl")).problems()


def test_malformed_jsonl_names_line(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text('{"a": 1}\n\n{"a": 2}\n{"a": \n')
    with pytest.raises(ValueError, match=r"x\.jsonl:4: malformed"):
        read_jsonl(p)
    q = tmp_path / "y.json"
    q.write_text('[\n {"a": 1},\n {"a": 2,,}\n]\n')
    with pytest.raises(ValueError, match=r"y\.json:3: malformed"):
        read_records(q)
    m = tmp_path / "mbpp.jsonl"
    m.write_text(Path(FIX / "mbpp" / "mbpp.jsonl").read_text() + "{oops\n")
    with pytest.raises(ValueError, match=r"mbpp\.jsonl:5"):
        MBPP(path=str(m), sha256=sha256_file(m)).problems("all")


def test_mbpp_full_fixture_splits_and_verify():
    task = MBPP(path=str(FIX / "mbpp" / "mbpp.jsonl"), sha256=SHA["mbpp"])
    assert task.name == "mbpp"
    test = task.problems("test")
    assert [p.id for p in test] == ["mbpp/11", "mbpp/12"]
    assert [p.id for p in task.problems("train")] == ["mbpp/601"]
    assert "assert reverse_string" in test[0].prompt
    for p in test:  # reference code, as plain text and fenced; test_setup_code is used
        assert task.verify(p, p.meta["reference_code"]) == 1.0
        assert task.verify(p, f"Here:\n```python\n{p.meta['reference_code']}\n```\nDone.") == 1.0
    assert task.verify(test[0], "def reverse_string(s):\n    return s") == 0.0
    assert task.verify(test[0], "[BEGIN]\ndef reverse_string(s):\n    return s[::-1]\n[DONE]") == 1.0


def test_mbpp_sanitized_fixture():
    task = get_task("mbpp-sanitized", path=str(FIX / "mbpp" / "sanitized-mbpp.json"), sha256=SHA["sanitized"])
    test = task.problems("test")
    assert [p.id for p in test] == ["mbpp-sanitized/11", "mbpp-sanitized/13"]
    assert all(task.verify(p, p.meta["reference_code"]) == 1.0 for p in test)  # test_imports used
    with pytest.raises(ValueError, match="SHA256 mismatch"):
        MBPP("sanitized", path=str(FIX / "mbpp" / "sanitized-mbpp.json")).problems()


def test_mmlu_pro_fixture():
    task = MMLUPro(path=str(FIX / "mmlu_pro.jsonl"), sha256=SHA["mmlu"])
    ps = task.problems()
    assert len(ps) == 3 and "J. 66" in ps[1].prompt and ps[2].answer == "D"
    assert task.verify(ps[0], "Nitrogen is 78%. \\boxed{B}") == 1.0
    assert task.verify(ps[0], "The answer is (B).") == 1.0
    assert task.verify(ps[0], "\\boxed{A}") == 0.0
    assert extract_letter("Answer: C") == "C" and extract_letter("\\boxed{\\text{(D)}}") == "D"
    assert extract_letter("no idea") is None


def test_aime_fixture():
    task = AIME(path=str(FIX / "aime.jsonl"), sha256=SHA["aime"])
    ps = task.problems()
    assert [p.answer for p in ps] == ["24", "391"] and ps[1].id == "aime/2024-I-2"
    assert task.verify(ps[0], "So the remainder is $\\boxed{24}$.") == 1.0
    assert task.verify(ps[0], "\\boxed{1024}") == 0.0


def test_registry_names_and_errors(tmp_path, monkeypatch):
    assert {"gsm8k", "math500", "humaneval", "mbpp", "mbpp-sanitized", "mmlu-pro",
            "aime"} <= set(task_names())
    assert get_task("gsm8k").name == "gsm8k"
    with pytest.raises(ValueError, match="module:function"):
        get_task("nope")
    (tmp_path / "my_tasks.py").write_text(
        "from orl.tasks.base import Problem\n"
        "class Echo:\n    name = 'echo'\n"
        "    def __init__(self, n=2): self.n = n\n"
        "    def problems(self, split):\n"
        "        return [Problem(f'e{i}', f'say {i}', str(i)) for i in range(self.n)]\n"
        "    def verify(self, problem, completion):\n"
        "        return float(completion.strip() == problem.answer)\n"
        "def make(n=2):\n    return Echo(n)\n"
        "def bad():\n    return object()\n"
        "NOT_CALLABLE = 3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    task = load_custom_task("my_tasks:make", n=3)
    assert len(task.problems("test")) == 3 and task.verify(Problem("e1", "x", "1"), "1") == 1.0
    assert get_task("my_tasks:make").name == "echo"
    with pytest.raises(ImportError, match="cannot import module 'no_such_mod'"):
        load_custom_task("no_such_mod:make")
    with pytest.raises(AttributeError, match="has no attribute 'missing'"):
        load_custom_task("my_tasks:missing")
    with pytest.raises(TypeError, match="returned an invalid task"):
        load_custom_task("my_tasks:bad")
    with pytest.raises(TypeError, match="expected a function"):
        load_custom_task("my_tasks:NOT_CALLABLE")
    with pytest.raises(ValueError, match="must look like"):
        load_custom_task("my_tasks")
