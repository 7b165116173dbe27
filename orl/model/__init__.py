"""One transformer for every family, its residual pathway, masks, cache and HF checkpoints."""
from .config import FAMILIES, SIZES, ModelConfig, find_size, get_config
from .checkpoint import CheckpointError, load_pretrained, save_pretrained
from .transformer import Transformer, build_model

__all__ = ["FAMILIES", "SIZES", "ModelConfig", "find_size", "get_config", "CheckpointError",
           "load_pretrained", "save_pretrained", "Transformer", "build_model"]
