"""MBPP (Mostly Basic Python Problems), full and sanitized: loading, prompt and its single verifier.

Data: no installable package ships MBPP. The loader reads the public release files from a local
folder, by default ``$ORL_DATA/mbpp/`` (``$ORL_DATA`` defaults to ``~/.cache/orl/data``):

* full: ``mbpp.jsonl`` (974 records: task_id, text, code, test_list, test_setup_code,
  challenge_test_list), 563,743 bytes;
* sanitized: ``sanitized-mbpp.json`` (a JSON array of 427 records: source_file, task_id, prompt,
  code, test_imports, test_list), 255,053 bytes.

Both come from the google-research GitHub repository, folder ``mbpp/``. Their SHA256 values are
the ones recorded in Hugging Face datasets' ``datasets/mbpp/dataset_infos.json``
(download_checksums). Another release is refused unless you pass its hash explicitly
(``MBPP(sha256=...)``).

Splits follow MBPP's README by task_id: "prompt" 1-10, "test" 11-510 (500 full / 257 sanitized),
"validation" 511-600, "train" 601-974, and "all".

Prompt: the MBPP paper's wording (task text plus the tests) asking for a ```python block.
Verification (`orl.eval.sandbox.run_tests`): the candidate, ``test_imports + code +
test_setup_code``, runs in the sandboxed child; ``test_imports + test_setup_code`` and then the
``test_list`` asserts run in the harness, where every name the asserts use that neither the
setup, the asserts nor Python's builtins define (the function under test, found with `ast`) is the
proxy of the candidate's function of that name, called with plain data across the boundary. So a
test that needs the candidate's objects themselves (an instance of its class) fails, with that
reason. Challenge tests are not run.

Does not own: sandboxing (`orl.eval.sandbox`), MBPP+ (EvalPlus's extended tests).
"""
from __future__ import annotations

import ast
import builtins
from pathlib import Path

from orl.eval.sandbox import SandboxConfig, SandboxResult, run_tests
from orl.tasks.base import Problem
from orl.tasks.codecheck import extract_code
from orl.tasks.datafile import DataFile, check_file, local_data_root, read_records, require_keys

FILES = {  # variant -> (file name, sha256)
    "full": ("mbpp.jsonl", "ccf64ceae9c5403bf50a044cb6d505bfd2a2963ee58338ba268fd65beab92a9f"),
    "sanitized": ("sanitized-mbpp.json",
                  "ca95deaa9a01ef0a6f439f88bcf0dd3db3563d22f22aad6cae04ebb9a8d8c8e9"),
}
SPLITS = {"prompt": (1, 10), "test": (11, 510), "validation": (511, 600), "train": (601, 974),
          "all": (1, 10**9)}


def _join(parts: list[str]) -> str:
    return "\n".join(p for p in parts if p) + "\n"


def build_program(answer: dict, completion: str) -> str:
    """The whole test program for one completion, as MBPP runs it (for reading)."""
    return _join([*answer["test_imports"], extract_code(completion), answer["test_setup_code"],
                  *answer["test_list"]])


def _bound(tree: ast.AST) -> set[str]:
    """Names that ``tree`` binds anywhere (assignments, defs, imports, arguments)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            out.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
    return out


def candidate_names(tests: str, setup: str) -> list[str]:
    """The names ``tests`` uses that ``setup``, the tests themselves and builtins do not define."""
    try:
        test_tree, setup_tree = ast.parse(tests), ast.parse(setup)
    except SyntaxError:
        return []  # the harness reports the dataset's syntax error
    used = {n.id for n in ast.walk(test_tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return sorted(used - _bound(test_tree) - _bound(setup_tree) - set(dir(builtins)))


def run(answer: dict, completion: str, config: SandboxConfig = SandboxConfig()) -> SandboxResult:
    """The sandbox's verdict on one completion (see the module docstring)."""
    setup = _join([*answer["test_imports"], answer["test_setup_code"]])
    tests = _join(answer["test_list"])
    candidate = _join([*answer["test_imports"], extract_code(completion), answer["test_setup_code"]])
    return run_tests(candidate, tests, candidate_names(tests, setup), setup=setup, config=config)


class MBPP:
    """MBPP task; ``variant`` is "full" or "sanitized"; ``sandbox`` sets the program limits."""

    def __init__(self, variant: str = "full", path: str | None = None, sha256: str | None = None,
                 sandbox: SandboxConfig | dict = SandboxConfig()):
        if variant not in FILES:
            raise ValueError(f"MBPP variant must be one of {sorted(FILES)}, not {variant!r}")
        self.variant = variant
        self.name = "mbpp" if variant == "full" else "mbpp-sanitized"
        self.path = path
        self.sha256 = sha256
        # a dict (e.g. from a manifest's task_kwargs or --set) is read as SandboxConfig fields
        self.sandbox = SandboxConfig(**sandbox) if isinstance(sandbox, dict) else sandbox

    def data_file(self, split: str = "test") -> DataFile:
        if split not in SPLITS:
            raise ValueError(f"MBPP has splits {sorted(SPLITS)}, not {split!r}")
        file_name, sha = FILES[self.variant]
        path = Path(self.path) if self.path else local_data_root() / "mbpp" / file_name
        return DataFile(path, sha, (
            f"No package ships MBPP: download {file_name} from the google-research GitHub "
            f"repository (folder mbpp/) and save it as {path} (or set $ORL_DATA, or pass path=...)"
        ))

    def problems(self, split: str = "test") -> list[Problem]:
        path = check_file(self.data_file(split), self.sha256)
        lo, hi = SPLITS[split]
        text_key = "text" if self.variant == "full" else "prompt"
        out = []
        for i, row in enumerate(read_records(path)):
            require_keys(row, ("task_id", text_key, "test_list"), path, i)
            if not lo <= int(row["task_id"]) <= hi:
                continue
            tests = list(row["test_list"])
            out.append(Problem(
                id=f"{self.name}/{row['task_id']}",
                prompt=(f"You are an expert Python programmer, and here is your task: "
                        f"{str(row[text_key]).strip()} Your code should pass these tests:\n\n"
                        + "\n".join(tests) + "\n\nWrite your solution in a ```python code block."),
                answer={"test_list": tests, "test_imports": list(row.get("test_imports", [])),
                        "test_setup_code": row.get("test_setup_code", "")},
                meta={"reference_code": row.get("code", "")},
            ))
        return out

    def verify(self, problem: Problem, completion: str) -> float:
        return 1.0 if run(problem.answer, completion, self.sandbox).passed else 0.0
