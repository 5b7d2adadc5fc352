"""Paged sliding-window extend (prefill, chunked prefill, draft extend, verify): :func:`swa_extend`
(launcher), its kernel and its heuristics."""

from .config import ExtendConfig, extend_config, extend_grid, extend_num_splits, extend_resident_programs
from .launcher import swa_extend

__all__ = ["ExtendConfig", "extend_config", "extend_grid", "extend_num_splits", "extend_resident_programs", "swa_extend"]
