"""Checkpoints in the Hugging Face layout, each family in its own format (docs/formats.md): Qwen3 /
SDAR (`qwen3`), LLaDA-2.x (`llada2`), DiffusionGemma (`dgemma`), and orl's former own format, read
only (`native`); the registry (`formats`); reading, validation and atomic writing (`files`).
Importing the package registers every format."""
from . import dgemma, llada2, native, qwen3  # noqa: F401  (registration)
from .files import (hf_files, load_config, load_pretrained, load_state, read_state_dict, read_tensors,
                    save_pretrained)
from .formats import FORMATS, CheckpointError, Format, export_format, format_of

__all__ = ["FORMATS", "CheckpointError", "Format", "export_format", "format_of", "hf_files", "load_config",
           "load_pretrained", "load_state", "read_state_dict", "read_tensors", "save_pretrained"]
