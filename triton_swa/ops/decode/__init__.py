"""Paged sliding-window decode: :func:`swa_decode` and :func:`swa_decode_plan` (launcher), its kernel and its heuristics."""

from .config import DecodeConfig, decode_block_config, decode_min_split_tokens, decode_num_splits, decode_resident_programs
from .launcher import DecodePlan, swa_decode, swa_decode_plan

__all__ = [
    "DecodeConfig",
    "decode_block_config",
    "decode_min_split_tokens",
    "decode_num_splits",
    "decode_resident_programs",
    "DecodePlan",
    "swa_decode",
    "swa_decode_plan",
]
