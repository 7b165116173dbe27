"""Serving: the `LLM` object (text in, text out, streaming, cancellation) and its two doors,
`orl generate` (`generate_cli`) and the OpenAI-compatible HTTP server (`server`).

Layering: `llm` knows tokenizers and the decoders (`orl.decode`, `orl.engine`) but no HTTP; the
server knows HTTP and the `LLM` methods but no tensors. Imported lazily so `import orl.serve` stays cheap.
"""
from __future__ import annotations

__all__ = ["LLM", "Generation", "Stream", "ContextLengthError", "EmptyPromptError"]


def __getattr__(name: str):
    if name in __all__:
        from . import llm  # noqa: PLC0415
        return getattr(llm, name)
    raise AttributeError(f"module 'orl.serve' has no attribute {name!r}")
