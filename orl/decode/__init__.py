"""Decoders: samplers as pure functions, one reference block decoder, protocols, trace and TPF."""
from .block import DecodeOutput, StepRecord, decode
from .config import DecodeConfig, protocol

__all__ = ["DecodeOutput", "StepRecord", "decode", "DecodeConfig", "protocol"]
