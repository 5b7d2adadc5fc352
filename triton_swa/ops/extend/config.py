"""Tiles, splits and grid of paged extend: named heuristics that say why (measured on the H200)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from ...runtime.checks import check_grid
from .._common.merge import MAX_SPLITS

__all__ = ["ExtendConfig", "extend_config", "extend_grid", "extend_num_splits", "extend_resident_programs", "extend_shared_bytes"]

# Split-KV (extend_num_splits): fewest cached-prefix key tiles per split, and most programs counted as
# running at once on one SM. Estimates to tune on the GPU (``triton-swa bench --grid heuristics``).
SPLIT_MIN_TILES = 1
SPLIT_MIN_WINDOW_TILES = 2
SPLIT_RESIDENT = 2


@dataclass(frozen=True)
class ExtendConfig:
    """Tile shape and launch knobs of one extend launch.

    ``block_m`` rows per program (``block_m // pack`` tokens x ``pack`` query heads of one KV head),
    ``block_n`` keys per inner step, ``pack`` query heads per tile (divides the GQA group size),
    ``edge_in_loop``: causal launches stream the window's lower-edge key tiles inside the main loop
    (masked by a branch) rather than in a loop of their own. ``dv_parts``: programs each query tile's
    value width is divided among (each computes the scores whole).
    """

    block_m: int
    block_n: int
    pack: int
    num_warps: int
    num_stages: int
    edge_in_loop: bool = False
    dv_parts: int = 1


# sm_90's tile for a head wider than 256 (D 512) in launches of at least block_m rows, as
# (block_m, block_n, warps, stages, dv_parts): extend_config's docstring says why
WIDE_HEAD_TILE = (128, 32, 8, 2, 2)


def _pow2_divisor(n: int) -> int:
    return n & -n


def extend_config(
    head_dim: int,
    v_head_dim: int,
    group: int,
    max_extend_len: int,
    dtype: torch.dtype = torch.bfloat16,
    interpret: bool = False,
    smem_limit: int | None = None,
    kv_bytes: bool = False,
    wgmma: bool = False,
) -> ExtendConfig:
    """Default tile shape for an extend launch, from the head dims, GQA group and longest request.

    Why these numbers (Hopper-class budget: 227 KB shared memory, 255 registers per thread; every
    default below compiles for sm_90 without register spills and with asynchronous wgmma, checked
    with ptxas; the sweep of ``bench/bench_extend.py``, in git history, timed the alternatives):

    - ``pack``: all query heads of a KV head that a power of two can hold share one tile, so a K/V
      tile loaded from the pool serves the whole group (decode's GQA packing) and a tile spans fewer
      tokens, which trims the masked diagonal and window-edge work of long prompts.
    - Long prompts are compute bound. ``D <= 128``: 64 rows over 4 warps with 64-key tiles (the
      H200 sweep of 2026-11-29 at N = 8192, W = 1023, 32/8 heads: 308 TFLOP/s against 287 for 128
      rows over 8 warps; ``bench/results/extend-sweep-*``). ``D = 256``: ``block_m`` 128 rows over 8
      warps (two warpgroups of 64 rows for wgmma) keeps the tensor cores fed; ``block_n`` halves so
      that the fp32 accumulator (``block_m x Dv``) and the score tile stay in registers, with two
      K/V stages in shared memory. ``D = 512``: a whole 64-row wgmma tile spills (sm_90, ptxas:
      64 x 32 over 8 warps, 2 stages: 280 bytes of stack; 64 x 16: 192), and below 64 rows Triton
      emits ``mma.sync``, not wgmma: the portable default's 32 x 32 tiles, which SGLang's engine
      profile put at about 83 TFLOP/s of causal prefill (Gemma-4-like's full layers,
      docs/sglang.md). On Hopper (``wgmma``), launches of at least 128 rows take
      :data:`WIDE_HEAD_TILE` instead: 128 x 32 over 8 warps, 2 stages, the value width in 2 parts
      (``dv_parts``): each program accumulates 256 columns, as at ``D = 256``, at the price of
      computing the scores twice. ptxas (sm_90) gives it 255 registers and 32 bytes of stack; it
      still ran fastest of four tiles on an H100 (graph replay, causal, 2026-12-07; 32k / 8k
      prompt tokens): 128 x 32 73.5 / 8.0 ms (about 209 / 274 TFLOP/s), 128 x 16 with 3 stages
      and no spill 101.1 / 10.7, 64 x 32 211.8 / 18.8, the 32 x 32 default 338.7 / 39.9
      (``bench/results/engines-2026-12-07.log``). Shorter launches (verify, short
      chunks) keep the 32-row tiles below.
    - ``edge_in_loop`` on at ``D = 256`` only: streaming the window's lower edge inside the main
      loop took the D 256 prefill from 316-317 to 341-348 TFLOP/s, and changed nothing measurable
      at D 128 (283-291 against 272-290, alternated in one run;
      ``bench/results/extend-sweep-edge-2026-11-29-NVIDIA_H200.log``), where it costs registers.
    - Verify and short extends (few tokens per request): ``block_m`` shrinks to the request's rows
      (tokens x packed heads) so that no program streams the window for padding rows; the window
      is then read once per KV head, as in decode, with 4 warps (8 at ``D = 512``).
    - fp32 inputs (tests, reference-grade runs) use smaller tiles: fp32 tiles take twice the space.
    - Pointer loads, not TMA: loading the new-key tiles through Hopper tensor descriptors freed
      address registers (ptxas for sm_90 at the D = 128 tiles: 244 instead of 255) but ran slower on
      the H200 (N = 8192, W = 1023, D = 128: 194-210 TFLOP/s against 269-301; commit c5a2bd1 and
      its sweep), so that path was removed again.
    - Under Triton's interpreter, which pays per element rather than per instruction, the smallest
      legal tiles.
    - ``smem_limit`` (the target's shared memory per program): tiles shrink until they fit
      (:func:`_fit_shared`); on the H200 nothing changes, on 99 KB (sm_86/89/120) and 64 KB (AMD
      LDS) targets the compile tier checks what each target's compiler allocates. ``kv_bytes``
      (an fp8 pool decoded from its bytes in the kernel) counts a second query tile, which Triton
      3.6 keeps on sm_80/86 then (D 256, 128 x 32 x 2 stages: 104 KB over bf16 K/V, 168 KB over
      decoded bytes).
    """
    d = max(head_dim, v_head_dim)
    if interpret:
        pack = min(_pow2_divisor(group), 16)
        return ExtendConfig(16, 16, pack, 1, 1)
    edge, parts = False, 1
    if d <= 128:
        block_m, block_n, warps, stages = 64, 64, 4, 3
    elif d <= 256:
        block_m, block_n, warps, stages, edge = 128, 32, 8, 2, True
    else:
        block_m, block_n, warps, stages = 32, 32, 8, 2
    if dtype == torch.float32:
        block_m, block_n, stages = max(16, block_m // 2), max(16, block_n // 2), min(stages, 2)
    pack = min(_pow2_divisor(group), block_m)
    rows = max(1, max_extend_len) * pack
    if d > 256 and wgmma and dtype != torch.float32 and rows >= WIDE_HEAD_TILE[0]:
        # Hopper, a 512-wide head's prefill: the value width in parts, for wgmma without spills
        block_m, block_n, warps, stages, parts = WIDE_HEAD_TILE
    elif rows < block_m:
        # a short request: one tile holds it whole; tiles below 16 rows do not map to tensor cores
        block_m = max(16, triton.next_power_of_2(rows))
        block_n = 64 if d <= 128 else 32
        warps = 4 if d <= 256 else 8
        stages = 3 if d <= 128 else 2
    if smem_limit is not None:
        q_tiles = 2 if kv_bytes else 1
        # a program holds its part of the value columns
        dv_part = -(-v_head_dim // parts)
        block_m, block_n, stages = _fit_shared(block_m, block_n, stages, head_dim, dv_part, dtype.itemsize, smem_limit, q_tiles)
        pack = min(pack, block_m)
    return ExtendConfig(block_m, block_n, pack, warps, stages, edge, parts)


def extend_shared_bytes(
    block_m: int, block_n: int, num_stages: int, head_dim: int, v_head_dim: int, itemsize: int, q_tiles: int = 1
) -> int:
    """Shared memory of one extend program, an upper bound of what Triton 3.6 allocates: the K/V
    pipeline stages and ``q_tiles`` query tiles (sm_90, D 128, 64 x 64 x 3 stages: 112 KB estimated
    and compiled; sm_80 and gfx942 compile less, as their pipeliners keep fewer stages in shared
    memory)."""
    return itemsize * (num_stages * block_n * (head_dim + v_head_dim) + q_tiles * block_m * head_dim)


def _fit_shared(block_m: int, block_n: int, stages: int, head_dim: int, v_head_dim: int, itemsize: int, limit: int, q_tiles: int = 1):
    """Shrink a tile until :func:`extend_shared_bytes` fits ``limit`` (a target's shared memory per
    program): pipeline stages down to 2 first (latency hiding is cheaper to lose than tile size),
    then key tiles down to 32, query tiles down to 32, key tiles to 16, query tiles to 16, and last
    a single stage. Hopper-class budgets (227 KB) keep every default as it is."""
    steps = [("stages", 2), ("block_n", 32), ("block_m", 32), ("block_n", 16), ("block_m", 16), ("stages", 1)]
    tile = {"block_m": block_m, "block_n": block_n, "stages": stages}
    for name, floor in steps:
        while extend_shared_bytes(tile["block_m"], tile["block_n"], tile["stages"], head_dim, v_head_dim, itemsize, q_tiles) > limit:
            if tile[name] <= floor:
                break
            tile[name] = tile[name] - 1 if name == "stages" else tile[name] // 2
    return tile["block_m"], tile["block_n"], tile["stages"]


def extend_num_splits(
    programs: int, max_window: int, block_n: int, num_sms: int, resident: int = SPLIT_RESIDENT, one_tile_per_request: bool = False
) -> int:
    """Splits of each program's cached-prefix window, from host ints only (CUDA-graph capturable).

    ``programs`` is the launch's unsplit grid (query tiles of the longest request x query-head groups
    x requests), ``max_window`` a host bound on the cached prefix keys any request reads, ``block_n``
    the key tile, ``num_sms`` the GPU's SM count and ``resident`` the programs one SM runs at once
    (the launcher passes ``min(SPLIT_RESIDENT, what shared memory holds)``: one at 512-wide heads).

    - Split only where the programs alone leave at least half the SMs idle (``2 * programs <=
      num_sms``): speculative verify and short extends at small batch, which are latency bound (one
      program streams its whole window serially: B 1, 8 drafts, W 1023, 32/8 heads, D 128 is 8
      programs on 132 SMs, 30-38 us on the H200 against 7.2 us for decode over the same window).
      Prefills and large batches keep the unsplit kernel, untouched.
    - ``one_tile_per_request`` (every request's new tokens fit one query tile: verify): split while
      the programs fit one wave (``programs <= num_sms``), where the partials stay small. H200, B 8,
      8 drafts, W 1023, 32/16 heads (128 programs), 2 splits against none: D 128 32.3 against 37.1
      us, D 256 53.8 against 70.9 (a probe plugin, in git history).
    - Windows of at most ``SPLIT_MIN_WINDOW_TILES`` key tiles are never split: the merge costs more
      than the tile it saves (gpt-oss-like W 127, 64/8 heads, D 64, 8 drafts: B 1 6.2 us unsplit
      against 7.5 in 2 splits, B 8 8.8 against 12.1).
    - Then fill about ``resident`` programs per SM (two verify-sized tiles fit one SM's shared
      memory and registers up to 256-wide heads), down to ``SPLIT_MIN_TILES`` (one) key tile per
      split, at most ``MAX_SPLITS``. On 132 SMs, W 1023, D 128 (1024 keys, 16 tiles of 64): 16
      splits at B 1 (8 programs), 4 at B 8 (64 programs), none at B 64.

    Measured on the H200 (the since-deleted ``bench/bench_extend.py --verify-splits 1,2,4,8,16 --quick``; B 1 and 8,
    8 drafts, W 1023, 32/8 heads, D 128, CSR): B 1 takes 37.8 us unsplit, 25.0 / 17.4 / 14.2 / 12.3
    us in 2 / 4 / 8 / 16 splits (one tile each is best: the call is latency bound); B 8 takes 40.2
    us unsplit, 25.5 in 4 splits, 32.0 and 44.0 in 8 and 16 (two and four waves). A prefix-less
    launch (a whole prompt) gains nothing from splits: pass ``max_window=0`` there.
    """
    busy = programs > num_sms if one_tile_per_request else 2 * programs > num_sms
    if programs <= 0 or busy or max_window <= SPLIT_MIN_WINDOW_TILES * block_n:
        return 1
    most = triton.cdiv(max_window, block_n) // SPLIT_MIN_TILES
    return max(1, min(MAX_SPLITS, most, (num_sms * max(1, resident)) // programs))


def extend_resident_programs(
    block_m: int, block_n: int, num_stages: int, head_dim: int, v_head_dim: int, itemsize: int, smem_per_sm: int
) -> int:
    """Programs one SM holds for :func:`extend_num_splits`: as many as shared memory fits (the K/V
    pipeline stages and the query tile), at most ``SPLIT_RESIDENT``."""
    tile_bytes = itemsize * (num_stages * block_n * (head_dim + v_head_dim) + block_m * head_dim)
    return max(1, min(SPLIT_RESIDENT, smem_per_sm // tile_bytes))


def extend_grid(m_tiles: int, num_splits: int, head_groups: int, batch: int, merge_programs: int = 0) -> tuple:
    """The main kernel's grid ``(query tiles x splits, query-head groups, requests)``, checked against
    CUDA's limits (axis 0: 2**31 - 1, axes 1 and 2: 65535) before anything is launched: a batch of
    more than 65535 requests raises ``ValueError`` (split it into several calls). ``merge_programs``
    (tokens x query heads of the split path's merge, one axis) is checked too."""
    check_grid("swa_extend", (merge_programs, 1, 1), ("tokens x query heads (split merge)", "", ""))
    return check_grid(
        "swa_extend", (m_tiles * num_splits, head_groups, batch), ("query tiles x splits", "query-head groups", "the batch (requests)")
    )
