"""Test-wide settings and shared fixtures.

One intra-op thread: the tests use tiny models whose ops are microseconds; with several threads on
a busy 2-core machine every op can stall on thread hand-off.
Without a GPU, Triton kernels run in Triton's interpreter: TRITON_INTERPRET must be set before the
first import of triton anywhere in the process (torch.compile imports it too), so it is set here.
"""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def make_speaking_llm():
    """Factory of fresh tiny random `LLM`s whose greedy output is text: a random tiny model's greedy
    argmax is the mask token itself (tied embeddings: a mask input predicts a mask), which decodes
    to ''; zeroing that embedding row makes greedy text non-empty."""
    def make(model: str = "sdar/tiny"):
        from orl import LLM
        llm = LLM(model)
        with torch.no_grad():
            llm.model.model.embed_tokens.weight[llm.tokenizer.mask_token_id] = 0
        return llm
    return make
