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
Verification: ``test_imports + code + test_setup_code + test_list`` in `orl.eval.sandbox`;
challenge tests are not run.

Does not own: sandboxing (`orl.eval.sandbox`), MBPP+ (EvalPlus's extended tests).
"""
from __future__ import annotations

from pathlib import Path

from orl.eval.sandbox import SandboxConfig
from orl.tasks.base import Problem
from orl.tasks.codecheck import extract_code, passes
from orl.tasks.datafile import DataFile, check_file, local_data_root, read_records, require_keys

FILES = {  # variant -> (file name, sha256)
    "full": ("mbpp.jsonl", "ccf64ceae9c5403bf50a044cb6d505bfd2a2963ee58338ba268fd65beab92a9f"),
    "sanitized": ("sanitized-mbpp.json",
                  "ca95deaa9a01ef0a6f439f88bcf0dd3db3563d22f22aad6cae04ebb9a8d8c8e9"),
}
SPLITS = {"prompt": (1, 10), "test": (11, 510), "validation": (511, 600), "train": (601, 974),
          "all": (1, 10**9)}


def build_program(answer: dict, completion: str) -> str:
    """The test program for one completion."""
    parts = [*answer["test_imports"], extract_code(completion), answer["test_setup_code"],
             *answer["test_list"]]
    return "\n".join(p for p in parts if p) + "\n"


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
        return passes(build_program(problem.answer, completion), self.sandbox)
