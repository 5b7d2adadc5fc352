"""Paged sliding-window decode: :func:`swa_decode` (launcher), its kernel and its heuristics."""

from .config import DecodeConfig, decode_block_config, decode_min_split_tokens, decode_num_splits, decode_resident_programs
from .launcher import swa_decode

__all__ = ["DecodeConfig", "decode_block_config", "decode_min_split_tokens", "decode_num_splits", "decode_resident_programs", "swa_decode"]
