"""Checkpoints in the Hugging Face layout, one registry of formats (`formats`): orl's own
(`native`), Qwen3 / SDAR (`qwen3`) and DiffusionGemma (`dgemma`); reading, validation and atomic
writing (`files`). Importing the package registers every format."""
from . import dgemma, native, qwen3  # noqa: F401  (registration)
from .files import load_pretrained, load_state, read_state_dict, save_pretrained
from .formats import FORMATS, CheckpointError, Format, format_of

__all__ = ["FORMATS", "CheckpointError", "Format", "format_of", "load_pretrained", "load_state",
           "read_state_dict", "save_pretrained"]
