"""Test-wide settings: one intra-op thread. The tests use tiny models whose ops are microseconds;
with several threads on a busy 2-core machine every op can stall on thread hand-off."""
import torch

torch.set_num_threads(1)
