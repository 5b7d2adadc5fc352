"""Paged sliding-window extend (prefill, chunked prefill, draft extend, verify): :func:`swa_extend`
and :func:`swa_extend_plan` (launcher), its kernel and its heuristics."""

from .config import ExtendConfig, extend_config, extend_grid, extend_num_splits, extend_resident_programs
from .launcher import ExtendPlan, swa_extend, swa_extend_plan

__all__ = [
    "ExtendConfig",
    "ExtendPlan",
    "extend_config",
    "extend_grid",
    "extend_num_splits",
    "extend_resident_programs",
    "swa_extend",
    "swa_extend_plan",
]
