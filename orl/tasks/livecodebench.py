"""LiveCodeBench code generation (LeetCode, AtCoder, Codeforces problems): loading, prompt, verifier.

Data: no installable package ships LiveCodeBench. The loader reads one JSONL file in the layout of
the public release ``livecodebench/code_generation_lite`` (``test.jsonl``, ``test2.jsonl``, ...
``test6.jsonl``; release v6 is all six, concatenated in that order into one file), by default
``$ORL_DATA/livecodebench/test.jsonl``. Keys used: ``question_id``, ``question_title``,
``question_content``, ``starter_code``, ``public_test_cases``, ``private_test_cases``,
``metadata`` (``{"func_name": ...}`` for LeetCode problems), ``platform``, ``difficulty`` and
``contest_date`` (``date_from`` / ``date_to``, inclusive ISO dates, keep a contest window).
Nothing is recorded for the file, so the user pins it by passing its SHA256
(``LiveCodeBench(sha256=...)``).

Test cases are a list of ``{"input", "output", "testtype"}``, given as JSON text, as a list, or,
for the private tests of the release, compressed: base64 of zlib of a pickle of the JSON text.
**orl never unpickles data.** `decode_test_cases` accepts JSON, base64+zlib of JSON, and
base64+zlib of a pickle that holds one string and nothing else: that pickle is read opcode by
opcode with ``pickletools.genops``, which parses and builds nothing, and any other opcode (a
global, a call, a container) is refused with an error. So the release file loads, and a file
crafted to run code when unpickled is rejected instead.

Two kinds of problem, judged like LiveCodeBench's grader, on public and private tests together:

* ``stdin`` (AtCoder, Codeforces): the program reads standard input and writes standard output.
  Output matches when, after stripping the whole text and each line, the lines are equal, or
  each pair of unequal lines holds the same numbers as decimals (`same_output`);
* ``functional`` (LeetCode): ``Solution().<func_name>(*args)`` with one JSON argument per input
  line must equal the JSON output (a returned tuple counts as a list).

The program comes from the completion's last closed fenced code block (else an unclosed one at the
end, else the whole text), and runs after a header of standard-library imports
(`IMPORT_HEADER`: typing, collections, heapq, ...; as LiveCodeBench prepends its own, so LeetCode
code using ``List`` without importing it works).

Judging goes through `orl.eval.sandbox.run_tests`, never in this process: the program runs in
the sandboxed child, wrapped in a small runner (``_orl_lcb_stdin`` feeds one input as file
descriptor 0 and ``sys.stdin`` and returns what was printed; ``_orl_lcb_call`` calls the method);
the expected outputs and every comparison stay in the harness, which sends each input across and
compares the plain string or value that comes back. A program that exits (``sys.exit``) ends its
test case normally, and threads it started are waited for; output written with ``os.write(1, ...)``
bypasses the capture and is lost.
The sandbox limits (default: 30 s wall clock for all tests of a problem, 2 GiB, replies up to 64
MiB) are one ``sandbox`` option; `orl.eval.pool`'s per-item timeout must exceed ``timeout_s``.

A prepared folder (`orl.eval.prepare`) holds every test case in its prompts file: for a whole
release that is a large file.

Does not own: sandboxing (`orl.eval.sandbox`), pass@k (one sample per problem here), the
release's other scenarios (self-repair, test output prediction, execution).
"""
from __future__ import annotations

import base64
import binascii
import inspect
import json
import pickletools
import re
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Any

from orl.eval.sandbox import SandboxConfig, SandboxResult, run_tests
from orl.tasks.base import Problem
from orl.tasks.datafile import DataFile, check_file, local_data_root, read_jsonl, require_keys

DEFAULT_SANDBOX = SandboxConfig(timeout_s=30.0, memory_mb=2048, max_reply_bytes=64 << 20)
TEST_TYPES = ("stdin", "functional")
IMPORT_HEADER = "\n".join([
    *(f"from {m} import *" for m in ("typing", "collections", "heapq", "bisect", "itertools",
                                     "functools", "math", "string", "re", "copy", "operator")),
    "from builtins import *",  # undo what the star imports shadowed (math.pow, re.compile, ...)
    "import bisect, collections, copy, datetime, functools, heapq, itertools, json, math, operator",
    "import random, re, statistics, string, sys",
    "sys.setrecursionlimit(50000)",
    "",
])
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.S)
_OPEN_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n((?:(?!```).)*)\Z", re.S)
_PICKLE_META = {"PROTO", "FRAME", "MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT", "STOP"}
_PICKLE_STRINGS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE"}


# -- data ------------------------------------------------------------------------------------------

def _string_from_pickle(raw: bytes, where: str) -> str:
    """The one string a pickle encodes, read with ``pickletools.genops`` (nothing is unpickled)."""
    strings, refused = [], []
    try:
        for op, arg, _ in pickletools.genops(raw):
            if op.name in _PICKLE_STRINGS:
                strings.append(arg)
            elif op.name not in _PICKLE_META:
                refused.append(op.name)
    except ValueError as e:
        raise ValueError(f"{where}: malformed pickle in the compressed test cases ({e})") from None
    if refused or len(strings) != 1:
        raise ValueError(
            f"{where}: the compressed test cases are a pickle of something other than one string "
            f"(opcodes {', '.join(sorted(set(refused))) or f'{len(strings)} strings'}); orl never "
            "unpickles data, so it is refused. Give the test cases as JSON (or base64 of zlib of JSON)."
        )
    return strings[0]


def decode_test_cases(value: Any, where: str) -> list[dict]:
    """Test cases from JSON text, a list, or the release's compressed form (see the module
    docstring); each must have string ``input`` and ``output`` and a known ``testtype``."""
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return []
        if text[0] in "[{":
            cases = json.loads(text)
        else:
            try:
                raw = zlib.decompress(base64.b64decode(text, validate=True))
            except (binascii.Error, zlib.error, ValueError) as e:
                raise ValueError(f"{where}: test cases are neither JSON nor base64 of zlib data ({e})") from None
            if raw[:1] == b"\x80":  # a pickle (protocol 2 or later)
                cases = json.loads(_string_from_pickle(raw, where))
            else:
                try:
                    cases = json.loads(raw.decode("utf-8"))
                except (UnicodeDecodeError, json.JSONDecodeError) as e:
                    raise ValueError(f"{where}: decompressed test cases are not JSON ({e})") from None
    else:
        cases = value
    if not isinstance(cases, list):
        raise ValueError(f"{where}: test cases must be a list, got {type(cases).__name__}")
    for j, case in enumerate(cases):
        if (not isinstance(case, dict) or not isinstance(case.get("input"), str)
                or not isinstance(case.get("output"), str) or case.get("testtype") not in TEST_TYPES):
            raise ValueError(f"{where}: test case {j} is not {{input: str, output: str, testtype: "
                             f"{' | '.join(TEST_TYPES)}}}: {str(case)[:120]}")
    return cases


def _metadata(value: Any, where: str) -> dict:
    if isinstance(value, dict):
        return value
    if not value:
        return {}
    try:
        meta = json.loads(value)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: metadata is not JSON ({e.msg})") from None
    if not isinstance(meta, dict):
        raise ValueError(f"{where}: metadata must be a JSON object, got {type(meta).__name__}")
    return meta


def render_prompt(question: str, starter_code: str) -> str:
    """The problem statement and what form the answer takes (starter code, or stdin/stdout)."""
    intro = ("You are an expert Python programmer. Solve the following programming problem with a "
             "correct and efficient Python program.")
    parts = [intro, "", "### Question:", question.strip(), ""]
    if starter_code.strip():
        form = ("### Format: complete the starter code below and put the whole solution in one "
                "```python code block.")
        parts += [form, "```python", starter_code.rstrip(), "```"]
    else:
        form = ("### Format: the program reads the input from standard input and writes the answer "
                "to standard output (do not test it on the samples yourself). Put the whole program "
                "in one ```python code block.")
        parts += [form, "```python", "# YOUR CODE HERE", "```"]
    return "\n".join(parts + ["", "### Answer:"])


# -- judging ----------------------------------------------------------------------------------------

def extract_program(completion: str) -> str:
    """The completion's last closed fenced Python (or unlabelled) block; else an unclosed one at
    the end; else the whole text."""
    blocks = [body for lang, body in _FENCE.findall(completion)
              if lang.lower() in ("", "python", "py", "python3")]
    if blocks:
        return blocks[-1]
    tail = _OPEN_FENCE.search(completion)  # a block cut off by the token budget
    return tail.group(1) if tail else completion


def same_output(got: str, expected: str) -> bool:
    """LiveCodeBench's stdout rule: the stripped lines of the stripped texts agree, each unequal
    pair as the same list of decimals."""
    from decimal import Decimal, InvalidOperation  # imported here: this source runs in the harness

    a = [line.strip() for line in got.strip().split("\n")]
    b = [line.strip() for line in expected.strip().split("\n")]
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x == y:
            continue
        try:
            if [Decimal(t) for t in x.split()] != [Decimal(t) for t in y.split()]:
                return False
        except (InvalidOperation, ValueError):
            return False
    return True


_STDIN_RUNNER = '''
import io as _orl_io, os as _orl_os, sys as _orl_sys, threading as _orl_threading

_ORL_CODE = compile({source!r}, "solution.py", "exec")


def _orl_lcb_stdin(_orl_input):
    with open("stdin.txt", "w", encoding="utf-8") as f:
        f.write(_orl_input)
    fd = _orl_os.open("stdin.txt", _orl_os.O_RDONLY)
    if fd != 0:  # 0 when the last test's program closed it (its own open(0) was collected)
        _orl_os.dup2(fd, 0)
        _orl_os.close(fd)
    saved = _orl_sys.stdin, _orl_sys.stdout
    buffer = _orl_io.BytesIO()
    out = _orl_io.TextIOWrapper(buffer, encoding="utf-8", newline="\\n", write_through=True)
    _orl_sys.stdin = open(0, encoding="utf-8", closefd=False)
    _orl_sys.stdout = out
    try:
        exec(_ORL_CODE, {{"__name__": "__main__", "__builtins__": __builtins__}})
        for thread in _orl_threading.enumerate():  # a program that solves in a thread (deep recursion)
            if thread is not _orl_threading.current_thread() and not thread.daemon:
                thread.join()
    except SystemExit:
        pass
    finally:
        _orl_sys.stdin, _orl_sys.stdout = saved
        out.flush()
    return buffer.getvalue().decode("utf-8", "replace")
'''

_FUNCTIONAL_CALLER = '''

def _orl_lcb_call(_orl_name, *args):
    if "Solution" in globals():
        return getattr(Solution(), _orl_name)(*args)
    return globals()[_orl_name](*args)
'''

_STDIN_TEST = '''
CASES = json.loads({cases!r})
for i, case in enumerate(CASES):
    got = _orl_lcb_stdin(case["input"])
    assert type(got) is str, f"test {{i}}: the runner returned {{type(got).__name__}}"
    assert same_output(got, case["output"]), f"test {{i + 1}} of {{len(CASES)}}: wrong answer"
'''

_FUNCTIONAL_TEST = '''
CASES = json.loads({cases!r})
for i, case in enumerate(CASES):
    args = [json.loads(line) for line in case["input"].split("\\n") if line.strip()]
    got = _orl_lcb_call({fn_name!r}, *args)
    if isinstance(got, tuple):
        got = list(got)
    assert got == json.loads(case["output"]), f"test {{i + 1}} of {{len(CASES)}}: wrong answer"
'''


def judge_code(answer: dict, program: str) -> tuple[str, str, list[str], str]:
    """(candidate, test, names, setup) for `orl.eval.sandbox.run_tests` (see the module docstring)."""
    cases = json.dumps([{"input": t["input"], "output": t["output"]} for t in answer["tests"]])
    setup = "import json\n\n" + inspect.getsource(same_output)
    if answer["testtype"] == "functional":
        candidate = IMPORT_HEADER + "\n" + program + "\n" + _FUNCTIONAL_CALLER
        return candidate, _FUNCTIONAL_TEST.format(cases=cases, fn_name=answer["fn_name"]), ["_orl_lcb_call"], setup
    candidate = _STDIN_RUNNER.format(source=IMPORT_HEADER + "\n" + program)
    return candidate, _STDIN_TEST.format(cases=cases), ["_orl_lcb_stdin"], setup


def run(answer: dict, completion: str, config: SandboxConfig = DEFAULT_SANDBOX) -> SandboxResult:
    """The sandbox's verdict on one completion over all of the problem's tests."""
    candidate, test, names, setup = judge_code(answer, extract_program(completion))
    return run_tests(candidate, test, names, setup=setup, config=config)


class LiveCodeBench:
    """LiveCodeBench code generation over a local JSONL; ``sha256`` pins it (required);
    ``date_from``/``date_to`` keep a contest window; ``sandbox`` sets the program limits."""

    name = "livecodebench"

    def __init__(self, path: str | None = None, sha256: str | None = None, date_from: str | None = None,
                 date_to: str | None = None, sandbox: SandboxConfig | dict = DEFAULT_SANDBOX):
        for label, d in (("date_from", date_from), ("date_to", date_to)):
            if d is not None and not re.fullmatch(r"\d{4}-\d{2}-\d{2}", str(d)):
                raise ValueError(f"{label} must be an ISO date YYYY-MM-DD, not {d!r}")
        self.path = path
        self.sha256 = sha256
        self.date_from, self.date_to = date_from, date_to
        # a dict (e.g. from a manifest's task_kwargs or --set) is read as SandboxConfig fields
        self.sandbox = replace(DEFAULT_SANDBOX, **sandbox) if isinstance(sandbox, dict) else sandbox

    def data_file(self, split: str = "test") -> DataFile:
        if split != "test":
            raise ValueError(f"LiveCodeBench has only the split 'test', not {split!r}")
        path = Path(self.path) if self.path else local_data_root() / "livecodebench" / "test.jsonl"
        return DataFile(path, None, (
            "No package ships LiveCodeBench: save the release's test*.jsonl (livecodebench/"
            "code_generation_lite; for release v6 concatenate test.jsonl ... test6.jsonl in order) "
            "at this path, set $ORL_DATA, or pass path=..."
        ))

    def problems(self, split: str = "test") -> list[Problem]:
        path = check_file(self.data_file(split), self.sha256)
        out = []
        for i, row in enumerate(read_jsonl(path)):
            require_keys(row, ("question_id", "question_content", "public_test_cases"), path, i)
            date = str(row.get("contest_date") or "")[:10]
            if (self.date_from and date < self.date_from) or (self.date_to and date > self.date_to):
                continue
            where = f"{path}: record {i} (question_id {row['question_id']})"
            tests = (decode_test_cases(row["public_test_cases"], where)
                     + decode_test_cases(row.get("private_test_cases") or "", where))
            kinds = {t["testtype"] for t in tests}
            if len(kinds) != 1:
                raise ValueError(f"{where}: needs tests of one type, has {sorted(kinds) or 'none'}")
            kind = kinds.pop()
            fn_name = _metadata(row.get("metadata"), where).get("func_name")
            if kind == "functional" and not fn_name:
                raise ValueError(f"{where}: functional tests need metadata.func_name")
            starter = str(row.get("starter_code") or "")
            out.append(Problem(
                id=f"livecodebench/{row['question_id']}",
                prompt=render_prompt(str(row["question_content"]), starter),
                answer={"testtype": kind, "fn_name": fn_name if kind == "functional" else None,
                        "tests": [{"input": t["input"], "output": t["output"]} for t in tests]},
                meta={"title": row.get("question_title", ""), "platform": row.get("platform", ""),
                      "difficulty": row.get("difficulty", ""), "contest_date": date,
                      "starter_code": starter},
            ))
        return out

    def verify(self, problem: Problem, completion: str) -> float:
        return 1.0 if run(problem.answer, completion, self.sandbox).passed else 0.0
