"""orl: on-policy residual learning for diffusion language models."""
from __future__ import annotations

__all__ = ["LLM"]


def __getattr__(name: str):
    # Lazy: `import orl` (and `orl --help`) must not pay for torch and transformers.
    if name == "LLM":
        from .serve.llm import LLM  # noqa: PLC0415
        return LLM
    raise AttributeError(f"module 'orl' has no attribute {name!r}")
