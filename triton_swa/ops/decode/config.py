"""Tiles, splits and residency of paged decode: named heuristics that say why (measured on the H200)."""

from __future__ import annotations

from typing import NamedTuple

import triton

from .._common.merge import MAX_SPLITS

__all__ = [
    "DecodeConfig",
    "decode_block_config",
    "decode_fit_block_n",
    "decode_min_split_tokens",
    "decode_num_splits",
    "decode_resident_programs",
    "decode_shared_bytes",
]

# A split reads at least this many times the bytes of the float32 partial output it writes (and the
# merge reads back): G x Dv x 4 bytes per KV head against split_len x (D + Dv) x itemsize. Of the
# default and heuristics grids only 512-wide heads at B 1 reach this bound (16 kept them at 32 splits:
# H200, L 4k, 21.3 us against 19.6 at 64 once the merge spread its columns;
# bench/results/profile-decode-d512-2026-12-02-*, its 367054f run).
SPLIT_READ_RATIO = 8
# Long windows may take up to this many waves of splits, each split still this many key blocks long:
# more programs per SM leave fewer idle SMs in the last wave once each program's loop is long.
MAX_WAVES = 8
LONG_SPLIT_BLOCKS = 32


class DecodeConfig(NamedTuple):
    """Tile sizes and launch shape of the split kernel."""

    block_g: int
    block_n: int
    num_warps: int
    num_stages: int


def decode_block_config(
    head_dim: int,
    v_head_dim: int,
    group: int,
    kv_itemsize: int,
    interpret: bool = False,
    smem_limit: int | None = None,
    wide_fp8_tiles: bool = True,
) -> DecodeConfig:
    """Tiles for a head geometry.

    - ``block_g``: the query heads of one KV head form the M side of both dots, which needs at least 16
      rows; big groups with wide heads are cut into several programs (each re-reads the K/V tile from
      L2) to keep the `[block_g, Dv]` float32 accumulator and the query tile in registers.
    - ``block_n``: about 32 KB of K plus V per tile (one pipeline stage), enough bytes in flight per SM
      to cover memory latency, without spilling the `[block_g, block_n]` scores; at least 32 for
      512-wide heads so that a loop iteration does enough work, at most 128.
    - ``num_warps``: 4 at every width. At 512-wide heads 4 warps carry the `[16, 512]` accumulator in 64
      registers per thread without spills, and stream at the copy ceiling where 8 warps did not (H200,
      B 64, L 4k, 32-token tiles, CSR list: 497 against 707 us; page table: 498 against 537 us;
      the d512 probe, in git history).
    - ``num_stages``: 3. Triton's pipeliner gives the slot loads and the K/V gathers they feed
      ``(num_stages - 1) // 2`` iterations of lead each: one here, two K/V buffers. 2 would leave the
      slot loads unpipelined (565 against 548 us at D 512, B 8, L 32k on the H200); 5 (two iterations of
      lead, three buffers) measured no better (136 against 131 us at D 128, B 64).

    - ``wide_fp8_tiles``: 1-byte (fp8) pools take as many bytes per tile as 16-bit ones, so twice the
      keys (H200, Mistral-like B 64, fp8: 205 us at 128 keys against 282 at 64;
      ``bench/results/fp8-decode-cff4e57-*``). False keeps the 16-bit key count. The launcher passes
      False on RDNA (AMD, 32-lane waves). There the converted tile is what spills: gfx1100, D 128,
      128 keys spills 215 B and takes 113 s to compile, against 78 B and 21 s at 64 keys (compile
      tier; no RDNA GPU was available to time either).

    Under the interpreter, the smallest legal tiles (it pays per element, not per instruction).
    Off Hopper, ``smem_limit`` (shared memory per program) caps ``block_n`` (:func:`decode_fit_block_n`).
    Where even 16-key tiles exceed it (float32 pools at 512-wide heads on AMD's 64 KB of LDS: 66560 B
    compiled at 3 stages), one stage: no K/V buffers in shared memory, 32 KB (compile tier).
    """
    width = max(triton.next_power_of_2(head_dim), triton.next_power_of_2(v_head_dim))
    g_cap = 64 if width <= 128 else (32 if width <= 256 else 16)
    block_g = min(max(16, triton.next_power_of_2(group)), g_cap)
    if interpret:
        return DecodeConfig(block_g, 16, 1, 1)
    tile_itemsize = kv_itemsize if wide_fp8_tiles else max(kv_itemsize, 2)
    row_bytes = (triton.next_power_of_2(head_dim) + triton.next_power_of_2(v_head_dim)) * tile_itemsize
    block_n = max(16, min(128, triton.next_power_of_2(32768 // row_bytes)))
    if width >= 512:
        block_n = max(block_n, 32)
    block_n = decode_fit_block_n(block_n, head_dim, v_head_dim, kv_itemsize, smem_limit)
    fits = smem_limit is None or decode_shared_bytes(block_n, head_dim, v_head_dim, kv_itemsize) <= smem_limit
    return DecodeConfig(block_g, block_n, 4, 3 if fits else 1)


def decode_fit_block_n(block_n: int, head_dim: int, v_head_dim: int, kv_itemsize: int, smem_limit: int | None) -> int:
    """``block_n`` halved (down to 16) until :func:`decode_shared_bytes` fits ``smem_limit``, the
    target's shared memory per program (64 KB of LDS on AMD: D 512 takes 16-key tiles there, D 256
    32); Hopper's 227 KB keeps every default."""
    while smem_limit is not None and block_n > 16 and decode_shared_bytes(block_n, head_dim, v_head_dim, kv_itemsize) > smem_limit:
        block_n //= 2
    return block_n


def decode_min_split_tokens(group: int, head_dim: int, v_head_dim: int, kv_itemsize: int) -> int:
    """Fewest window tokens per split: a split's K/V reads are at least ``SPLIT_READ_RATIO`` times the
    float32 partial output it writes (`[G, Dv]` per KV head, read back once by the merge), so the
    partials cost at most about ``2 / SPLIT_READ_RATIO`` of the traffic. Small groups split finer."""
    partial = group * v_head_dim * 4
    return max(1, triton.cdiv(SPLIT_READ_RATIO * partial, (head_dim + v_head_dim) * kv_itemsize))


def decode_shared_bytes(block_n: int, head_dim: int, v_head_dim: int, kv_itemsize: int) -> int:
    """Shared memory of one split-kernel program, as fitted to what Triton 3.6 compiles for sm_90
    (the stats probe, in git history): one K plus V tile, and a layout-conversion scratch that grows
    with the head width, ``block_n * (D + Dv) * itemsize + 4 KB + 32 * width`` (D 128 at 64 keys:
    39 KB; D 256 at 64: 76 KB; D 512 at 32: 83 KB). The compile tier checks it against what each
    target's compiler reports."""
    width = max(triton.next_power_of_2(head_dim), triton.next_power_of_2(v_head_dim))
    return block_n * (head_dim + v_head_dim) * kv_itemsize + 4 * 1024 + 32 * width


def decode_resident_programs(
    block_n: int,
    head_dim: int,
    v_head_dim: int,
    kv_itemsize: int,
    smem_per_sm: int = 228 * 1024,
    num_warps: int = 4,
    warp_size: int = 32,
    regs_per_sm: int = 65536,
) -> int:
    """Split-kernel programs one SM (or CU) holds at once (at most 8), bounded by shared memory
    (:func:`decode_shared_bytes`) and registers.

    Registers: about ``80 + 1.25 e`` per thread, with ``e`` the elements of the K tile per thread
    (``warp_size * num_warps`` threads: 128 on NVIDIA, 256 on CDNA at 4 warps), out of
    ``regs_per_sm`` (fitted on sm_90, H200, 4 warps: D 128 at 64 keys, e = 64: 128 registers; D 256
    at 32: 148; D 256 at 64 and D 512 at 32, e = 128: 238-252, two programs).

    Under-counting costs splits: at D 512, B 8, L 4k, 8 splits (two programs per SM) take 76 us where
    the earlier estimate of one program per SM chose 4 and took 95 us.
    """
    width = max(triton.next_power_of_2(head_dim), triton.next_power_of_2(v_head_dim))
    threads = warp_size * num_warps
    shared = decode_shared_bytes(block_n, head_dim, v_head_dim, kv_itemsize)
    registers = min(255, 80 + (5 * block_n * width) // (4 * threads))
    return max(1, min(8, smem_per_sm // shared, regs_per_sm // (threads * registers)))


def decode_num_splits(programs: int, max_window: int, block_n: int, num_sms: int, min_tokens: int = 128, resident: int = 2) -> int:
    """Splits of each window, from the longest window and the GPU's size (never from context length).

    With ``slots = num_sms * resident`` programs running at once (:func:`decode_resident_programs`):

    - ``programs >= slots``, or more than half of them: no split. The GPU is full anyway, and splits only
      add partials, the merge and one more pipeline fill per program (H200, B 64, D 128, window 1k:
      131 us unsplit against 152 us in 2 splits; window 4k: 251 against 256-261 us in 2 to 4; D 512,
      B 64, L 4k, 256 programs on 264 slots: 498.9 us unsplit against 512.7 in 4 splits).
    - fewer programs (small batches, latency-bound): split so that one wave holds them all, and never
      into two waves of short splits (D 256, B 1: 16 splits 12.5 us, 32 splits over two waves 15 us).
      Long windows may take up to ``MAX_WAVES`` waves of splits of at least ``LONG_SPLIT_BLOCKS``
      blocks, which leaves fewer SMs idle in the last wave (D 512, B 1, L 32k: 64 splits 83 us, 32
      splits 97 us).

    Each split keeps at least ``max(block_n, min_tokens)`` tokens of the longest window (see
    :func:`decode_min_split_tokens`), at most ``MAX_SPLITS`` splits, and splits that the longest window
    would leave empty (splits are whole blocks) are dropped. A host-only function of shapes, so a CUDA
    graph sees a fixed count.
    """
    slots = num_sms * max(1, resident)
    if 2 * programs > slots or max_window <= 0:
        return 1
    most = max(1, min(MAX_SPLITS, triton.cdiv(max_window, max(block_n, min_tokens))))
    fill = slots // max(programs, 1)
    long = max_window // (LONG_SPLIT_BLOCKS * block_n)
    splits = min(most, max(1, fill, min(long, MAX_WAVES * fill)))
    chunk = triton.cdiv(triton.cdiv(max_window, splits), block_n) * block_n
    return max(1, min(splits, triton.cdiv(max_window, chunk)))


_DEVICE_SIZES: dict = {}
