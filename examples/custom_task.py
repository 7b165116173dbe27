"""A custom task for `orl train --task examples.custom_task:make_task` (run from the repo root, or
put the module on PYTHONPATH).

A task is any object with
  name: str
  problems(split) -> list[orl.tasks.Problem]          # "train" for ORL prompts, "test" for evaluation
  verify(problem, completion: str) -> float           # 1.0 = verified, the ORL reward and the eval score
and optionally
  sample(split, index) -> Problem                      # an endless deterministic stream (else problems() cycles)
  solution(problem) -> str                              # worked solution, needed only for `orl sft`
This one asks for the reverse of a short digit string; the verifier is exact string match.
"""
import random

from orl.tasks import Problem


class ReverseDigits:
    name = "reverse-digits"

    def __init__(self, length: int = 6, n_test: int = 200, seed: int = 0):
        self.length, self.n_test, self.seed = length, n_test, seed

    def sample(self, split: str, index: int) -> Problem:
        rng = random.Random(f"{self.seed}:{split}:{index}")
        s = "".join(rng.choice("0123456789") for _ in range(self.length))
        return Problem(id=f"{split}-{index}", prompt=f"reverse {s}=", answer=s[::-1])

    def problems(self, split: str) -> list[Problem]:
        return [self.sample(split, i) for i in range(self.n_test if split == "test" else 10 * self.n_test)]

    def solution(self, problem: Problem) -> str:
        return problem.answer

    def verify(self, problem: Problem, completion: str) -> float:
        return 1.0 if completion.strip() == problem.answer else 0.0


def make_task(**kwargs) -> ReverseDigits:
    return ReverseDigits(**kwargs)
