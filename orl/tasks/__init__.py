"""Tasks: one file per benchmark (loading, prompt, single verifier); see `orl.tasks.base`."""
from orl.tasks.base import Problem, Task, check_problems, check_task

__all__ = ["Problem", "Task", "check_problems", "check_task"]
