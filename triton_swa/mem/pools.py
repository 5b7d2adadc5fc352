"""Request and KV pools with SGLang's names and semantics (docs/contract.md §2).

- :class:`ReqToTokenPool`: ``req_to_token`` int32 `[size + 1, max_context_len]`; row 0 is padding.
- :class:`MHATokenToKVPool`: per-layer ``k_buffer``/``v_buffer`` `[size + page_size, H, D]` (V may have
  its own head dim); slot 0 (page 0) is a dummy that padded tokens write to.
- :class:`BaseSWAKVPool` / :class:`SWAKVPool`: a full and an SWA sub-pool, routed by layer id, with the
  full-to-SWA mapping shared by reference with the SWA allocator.
"""

from __future__ import annotations

import math
import sys
from abc import ABC, abstractmethod
from collections.abc import Mapping

import torch

from ..runtime.checks import INDEX_DTYPES, KV_DTYPES, check_int, check_tensor, storage_dtype
from ..runtime.guard import debug_enabled


def _check_device(name: str, device) -> torch.device:
    if isinstance(device, bool) or not isinstance(device, (str, torch.device, int)):
        raise TypeError(f"{name} must be a torch.device or a device string, got {type(device).__name__}")
    try:
        return torch.device(device)
    except (RuntimeError, ValueError) as e:
        raise ValueError(f"{name} is not a valid device: {device!r} ({e})") from None


class ReqToTokenPool:
    """Rows of full-pool slots, one row per live request; row 0 is a padding row never handed out.

    Rows are tracked: ``alloc`` hands out only free rows, ``free`` takes only rows that are handed
    out, so no row can be handed out twice.

    Args:
        size (int): how many requests can live at once (rows ``1..size``).
        max_context_len (int): columns per row.
        device: where ``req_to_token`` lives.
    """

    def __init__(self, size: int, max_context_len: int, device="cpu", enable_memory_saver: bool = False):
        check_int("size", size, minimum=1)
        check_int("max_context_len", max_context_len, minimum=1)
        if not isinstance(enable_memory_saver, bool):
            raise TypeError(f"enable_memory_saver must be a bool, got {type(enable_memory_saver).__name__}")
        self.size = size
        self.max_context_len = max_context_len
        self.device = _check_device("device", device)
        self.req_to_token = torch.zeros(size + 1, max_context_len, dtype=torch.int32, device=self.device)
        self.clear()

    def available_size(self) -> int:
        return len(self.free_slots)

    def alloc(self, need_size: int) -> list[int] | None:
        """Hand out ``need_size`` free rows, or return None (and change nothing) when too few are free."""
        check_int("need_size", need_size, minimum=0)
        if need_size > len(self.free_slots):
            return None
        rows, self.free_slots = self.free_slots[:need_size], self.free_slots[need_size:]
        self._in_use.update(rows)
        return rows

    def _rows(self, free_index) -> list[int]:
        if isinstance(free_index, torch.Tensor):
            if free_index.dtype not in INDEX_DTYPES:
                raise TypeError(f"free_index must be an int, a list of ints or an int32/int64 tensor, got a {free_index.dtype} tensor")
            if free_index.dim() > 1:
                raise ValueError(f"free_index must be a 0-/1-D tensor, got shape {list(free_index.shape)}")
            return [int(r) for r in free_index.reshape(-1).tolist()]
        if isinstance(free_index, (list, tuple)):
            rows = list(free_index)
        else:
            rows = [free_index]
        for r in rows:
            if isinstance(r, bool) or not isinstance(r, int):
                raise TypeError(f"free_index must be an int or a list of ints, got an element of type {type(r).__name__}")
        return rows

    def free(self, free_index) -> None:
        """Return rows (an int, a list of ints or an int tensor) to the free list.

        Raises:
            TypeError: not ints.
            ValueError: a row outside ``1..size``, one not handed out (a double free), or one given
                twice; no row is freed then.
        """
        rows = self._rows(free_index)
        seen = set()
        for r in rows:
            if not 1 <= r <= self.size:
                raise ValueError(f"free_index holds row {r}, outside 1..{self.size} (row 0 is padding)")
            if r in seen:
                raise ValueError(f"free_index holds row {r} twice")
            if r not in self._in_use:
                raise ValueError(f"free_index holds row {r}, which is not allocated (a double free?)")
            seen.add(r)
        self._in_use.difference_update(rows)
        self.free_slots.extend(rows)

    def write(self, indices, values: torch.Tensor) -> None:
        """``req_to_token[indices] = values`` (SGLang's spelling)."""
        check_tensor("values", values, dtype=INDEX_DTYPES)
        self.req_to_token[indices] = values.to(torch.int32)

    def clear(self) -> None:
        self.free_slots = list(range(1, self.size + 1))
        self._in_use: set[int] = set()


def _layer_ids(name: str, ids) -> list[int]:
    if isinstance(ids, (str, bytes, torch.Tensor)) or not hasattr(ids, "__iter__"):
        raise TypeError(f"{name} must be a list of ints, got {type(ids).__name__}")
    ids = list(ids)
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int):
            raise TypeError(f"{name} must be a list of ints, got an element of type {type(i).__name__}")
        if i < 0:
            raise ValueError(f"{name} must hold layer ids >= 0, got {i}")
    if len(set(ids)) != len(ids):
        raise ValueError(f"{name} names a layer twice: {ids}")
    return ids


def _layer_id(layer) -> int:
    layer_id = getattr(layer, "layer_id", layer)
    return check_int("layer.layer_id", layer_id)


def _check_in_range(name: str, idx: torch.Tensor, lo: int, hi: int, what: str) -> None:
    """ValueError naming ``name`` unless every entry of ``idx`` lies in ``[lo, hi]``.

    Free on the host: always when ``idx`` is a CPU tensor (where torch's own indexing would raise a
    bare IndexError, or wrap a negative index silently). A device tensor's values need a
    synchronisation, so there it runs in debug mode only (``TRITON_SWA_DEBUG=1``); outside it an
    out-of-range index is the caller's contract (a device-side assert on CUDA).
    """
    if idx.numel() == 0 or (idx.device.type != "cpu" and not debug_enabled()):
        return
    bad = (idx < lo) | (idx > hi)
    if bool(bad.any()):
        j = int(bad.reshape(-1).nonzero()[0])
        at = f"[{j}]" if idx.dim() == 1 else f" (flat index {j})"
        raise ValueError(f"{name}{at} = {int(idx.reshape(-1)[j])} is outside {what}")


class MHATokenToKVPool:
    """Per-layer K and V buffers of one head geometry.

    Args:
        size (int): usable token slots (a multiple of ``page_size``); buffers have ``size + page_size``
            rows because page 0 is the dummy.
        page_size (int): tokens per page.
        dtype (torch.dtype): float16, bfloat16, float32, float8_e4m3fn or float8_e4m3fnuz (fp8 stored as
            uint8, viewed back).
        head_num (int): KV heads; ``head_dim`` K head dim; ``v_head_dim`` V head dim (default ``head_dim``).
        layer_num (int): layers in this pool; ``start_layer`` is the model layer id of the first.
    """

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        head_num: int,
        head_dim: int,
        layer_num: int,
        device="cpu",
        v_head_dim: int | None = None,
        start_layer: int = 0,
    ):
        check_int("size", size, minimum=1)
        check_int("page_size", page_size, minimum=1)
        if size % page_size:
            raise ValueError(f"size ({size}) must be a multiple of page_size ({page_size})")
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype, one of {KV_DTYPES}, got {type(dtype).__name__}")
        if dtype not in KV_DTYPES:
            raise TypeError(f"dtype must be one of {KV_DTYPES}, got {dtype}")
        check_int("head_num", head_num, minimum=1)
        check_int("head_dim", head_dim, minimum=1)
        check_int("layer_num", layer_num, minimum=1)
        v_head_dim = head_dim if v_head_dim is None else check_int("v_head_dim", v_head_dim, minimum=1)
        check_int("start_layer", start_layer, minimum=0)
        device = _check_device("device", device)
        self.size, self.page_size, self.dtype = size, page_size, dtype
        self.store_dtype = storage_dtype(dtype)
        self.head_num, self.head_dim, self.v_head_dim = head_num, head_dim, v_head_dim
        self.layer_num, self.start_layer = layer_num, start_layer
        self.device = torch.device(device)
        rows = size + page_size
        self.k_buffer = [torch.zeros(rows, head_num, head_dim, dtype=self.store_dtype, device=self.device) for _ in range(layer_num)]
        self.v_buffer = [torch.zeros(rows, head_num, v_head_dim, dtype=self.store_dtype, device=self.device) for _ in range(layer_num)]

    def _index(self, layer_id: int) -> int:
        if type(layer_id) is int and 0 <= layer_id - self.start_layer < self.layer_num:
            return layer_id - self.start_layer  # a layer step's lookup: an int in range
        check_int("layer_id", layer_id)
        i = layer_id - self.start_layer
        if not 0 <= i < self.layer_num:
            last = self.start_layer + self.layer_num - 1
            raise ValueError(f"layer_id {layer_id} is not in this pool (layers {self.start_layer}..{last})")
        return i

    def _view(self, buf: torch.Tensor) -> torch.Tensor:
        return buf.view(self.dtype) if self.store_dtype != self.dtype else buf

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self._view(self.k_buffer[self._index(layer_id)])

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self._view(self.v_buffer[self._index(layer_id)])

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        i = self._index(layer_id)
        return self._view(self.k_buffer[i]), self._view(self.v_buffer[i])

    def set_kv_buffer(self, layer, loc, cache_k, cache_v, k_scale=None, v_scale=None, layer_id_override=None):
        """Write ``cache_k``/``cache_v`` `[n, H, D]` at slots ``loc`` `[n]` of a layer.

        ``layer`` is a layer object with ``layer_id`` (or the id itself); ``layer_id_override`` wins.
        Values in another dtype are divided by ``k_scale``/``v_scale`` when given, then cast.

        Raises:
            TypeError, ValueError: naming the argument; a ``loc`` outside ``[0, size + page_size)``
                is a ValueError naming it and the range, always for a CPU ``loc`` (free) and in debug
                mode for a device one (reading it synchronises).
        """
        layer_id = layer_id_override if layer_id_override is not None else _layer_id(layer)
        i = self._index(layer_id)
        check_tensor("loc", loc, dtype=INDEX_DTYPES, device=self.device, ndim=1)
        n = loc.shape[0]
        check_tensor("cache_k", cache_k, device=self.device, shape=(n, self.head_num, self.head_dim))
        check_tensor("cache_v", cache_v, device=self.device, shape=(n, self.head_num, self.v_head_dim))
        for name, x in (("cache_k", cache_k), ("cache_v", cache_v)):
            if not x.dtype.is_floating_point:
                raise TypeError(f"{name} must be a floating tensor, got {x.dtype}")
        for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
            if scale is not None and not isinstance(scale, torch.Tensor):
                if isinstance(scale, bool) or not isinstance(scale, (int, float)):
                    raise TypeError(f"{name} must be a number, a tensor or None, got {type(scale).__name__}")
                if not math.isfinite(scale) or scale <= 0:
                    raise ValueError(f"{name} must be finite and > 0, got {scale}")
        rows = self.k_buffer[i].shape[0]
        _check_in_range("loc", loc, 0, rows - 1, f"this pool's slots 0..{rows - 1}")
        for buf, x, scale in ((self.k_buffer[i], cache_k, k_scale), (self.v_buffer[i], cache_v, v_scale)):
            if x.dtype != self.dtype:
                if scale is not None:
                    x = x / scale
                x = x.to(self.dtype)
            buf[loc.long()] = x.view(self.store_dtype) if self.store_dtype != self.dtype else x


# What a pool with an SWA sub-pool exposes (docs/contract.md §2, §3): ours, SGLang's or any engine's.
SWA_POOL_PROTOCOL = ("swa_kv_pool", "full_kv_pool", "layers_mapping", "full_to_swa_index_mapping", "translate_loc_from_full_to_swa")
_SGLANG_BASE_SWA_MODULE = "sglang.srt.mem_cache.base_swa_memory_pool"


def is_swa_kv_pool(pool) -> bool:
    """Whether ``pool`` has an SWA sub-pool, by what it is, never by identity with one class.

    True for triton-swa's :class:`BaseSWAKVPool`, for SGLang's ``BaseSWAKVPool`` (checked only when
    SGLang is already imported: a pool of SGLang's implies it is; the core never imports SGLang), and
    for any pool exposing the whole protocol (``SWA_POOL_PROTOCOL``: the two sub-pools, a
    ``layers_mapping`` mapping, the full-to-SWA mapping and ``translate_loc_from_full_to_swa``).
    False for a pool exposing none of it.

    Raises:
        ValueError: a pool exposing part of the protocol cannot be classified; silently translating
            nothing (or everything) would read wrong K/V, so the error names what is missing.
    """
    if pool is None:
        return False
    if isinstance(pool, BaseSWAKVPool):
        return True
    sglang_base = sys.modules.get(_SGLANG_BASE_SWA_MODULE)
    if sglang_base is not None and isinstance(pool, getattr(sglang_base, "BaseSWAKVPool", ())):
        return True
    present = [name for name in SWA_POOL_PROTOCOL if hasattr(pool, name)]
    if not present:
        return False
    problems = [f"{name} is missing" for name in SWA_POOL_PROTOCOL if name not in present]
    if "layers_mapping" in present and not isinstance(pool.layers_mapping, Mapping):
        problems.append(f"layers_mapping is a {type(pool.layers_mapping).__name__}, not a mapping")
    if "translate_loc_from_full_to_swa" in present and not callable(pool.translate_loc_from_full_to_swa):
        problems.append("translate_loc_from_full_to_swa is not callable")
    if problems:
        raise ValueError(
            f"cannot tell whether the {type(pool).__name__} pool has an SWA sub-pool: it exposes "
            f"{', '.join(present)} but {'; '.join(problems)} (an SWA pool exposes all of "
            f"{', '.join(SWA_POOL_PROTOCOL)})"
        )
    return True


class BaseSWAKVPool(ABC):
    """Abstract base of every pool with an SWA sub-pool; the policy of docs/contract.md §3 tests for this type."""

    swa_kv_pool: MHATokenToKVPool
    full_kv_pool: MHATokenToKVPool
    layers_mapping: dict[int, tuple[int, bool]]
    full_to_swa_index_mapping: torch.Tensor | None

    @abstractmethod
    def register_mapping(self, full_to_swa_index_mapping: torch.Tensor) -> None: ...

    @abstractmethod
    def translate_loc_from_full_to_swa(self, kv_indices: torch.Tensor) -> torch.Tensor: ...


class SWAKVPool(BaseSWAKVPool):
    """A full sub-pool for full-attention layers and an SWA sub-pool for sliding layers.

    ``layers_mapping[layer_id] = (index_in_subpool, is_swa)``. The sub-pools may differ in head count
    and head dims (Gemma 4): ``head_num``/``head_dim``/``v_head_dim`` give both, and the ``swa_`` and
    ``full_`` variants override one side.

    Args:
        size (int): full-pool token slots; ``size_swa`` SWA-pool token slots.
        page_size (int): shared by both sub-pools (their allocators run in lockstep).
        swa_attention_layer_ids, full_attention_layer_ids (list[int]): model layer ids of each kind.
    """

    def __init__(
        self,
        size: int,
        size_swa: int,
        page_size: int,
        dtype: torch.dtype,
        swa_attention_layer_ids,
        full_attention_layer_ids,
        device="cpu",
        head_num: int | None = None,
        head_dim: int | None = None,
        v_head_dim: int | None = None,
        swa_head_num: int | None = None,
        swa_head_dim: int | None = None,
        swa_v_head_dim: int | None = None,
        full_head_num: int | None = None,
        full_head_dim: int | None = None,
        full_v_head_dim: int | None = None,
    ):
        check_int("page_size", page_size, minimum=1)
        for name, value in (("size", size), ("size_swa", size_swa)):
            check_int(name, value, minimum=1)
            if value % page_size:
                raise ValueError(f"{name} ({value}) must be a multiple of page_size ({page_size})")
        swa_ids = _layer_ids("swa_attention_layer_ids", swa_attention_layer_ids)
        full_ids = _layer_ids("full_attention_layer_ids", full_attention_layer_ids)
        if set(swa_ids) & set(full_ids):
            raise ValueError(f"layer ids {sorted(set(swa_ids) & set(full_ids))} are both sliding and full")
        if not swa_ids:
            raise ValueError("swa_attention_layer_ids must name at least one layer")
        geometry = {
            "head_num": head_num,
            "head_dim": head_dim,
            "v_head_dim": v_head_dim,
            "swa_head_num": swa_head_num,
            "swa_head_dim": swa_head_dim,
            "swa_v_head_dim": swa_v_head_dim,
            "full_head_num": full_head_num,
            "full_head_dim": full_head_dim,
            "full_v_head_dim": full_v_head_dim,
        }
        for name, value in geometry.items():
            if value is not None:
                check_int(name, value, minimum=1)

        def pick(side, own, shared):
            value = own if own is not None else shared
            if value is None:
                raise ValueError(f"{side} head geometry missing: give head_num/head_dim or their {side}_ variants")
            return value

        def sub_pool(side, slots, num_layers, own_head_num, own_head_dim, own_v_head_dim):
            hd = pick(side, own_head_dim, head_dim)
            v_hd = next(v for v in (own_v_head_dim, v_head_dim, hd) if v is not None)
            return MHATokenToKVPool(slots, page_size, dtype, pick(side, own_head_num, head_num), hd, num_layers, device, v_head_dim=v_hd)

        self.size, self.size_swa, self.page_size, self.dtype = size, size_swa, page_size, dtype
        self.device = _check_device("device", device)
        self.swa_layer_nums, self.full_layer_nums = len(swa_ids), len(full_ids)
        self.swa_kv_pool = sub_pool("swa", size_swa, len(swa_ids), swa_head_num, swa_head_dim, swa_v_head_dim)
        self.full_kv_pool = sub_pool("full", size, len(full_ids), full_head_num, full_head_dim, full_v_head_dim) if full_ids else None
        self.layers_mapping = {}
        for i, layer_id in enumerate(full_ids):
            self.layers_mapping[layer_id] = (i, False)
        for i, layer_id in enumerate(swa_ids):
            self.layers_mapping[layer_id] = (i, True)
        self.full_to_swa_index_mapping = None

    def register_mapping(self, full_to_swa_index_mapping: torch.Tensor) -> None:
        """Share the SWA allocator's mapping (by reference: later allocations show up here)."""
        check_tensor(
            "full_to_swa_index_mapping",
            full_to_swa_index_mapping,
            dtype=torch.int64,
            device=self.device,
            shape=(self.size + self.page_size + 1,),
        )
        self.full_to_swa_index_mapping = full_to_swa_index_mapping

    def translate_loc_from_full_to_swa(self, kv_indices: torch.Tensor) -> torch.Tensor:
        """SWA slots of full slots, as int32 (0 where evicted, -1 for -1).

        Raises:
            ValueError: no mapping registered, or a slot outside ``[-1, size + page_size)`` (named with
                the range; always for CPU ``kv_indices``, in debug mode for device ones).
        """
        if self.full_to_swa_index_mapping is None:
            raise ValueError("no full_to_swa_index_mapping registered: call register_mapping first")
        check_tensor("kv_indices", kv_indices, dtype=INDEX_DTYPES, device=self.device)
        n = self.full_to_swa_index_mapping.shape[0]
        _check_in_range("kv_indices", kv_indices, -1, n - 2, f"the full slots 0..{n - 2} (or -1)")
        return self.full_to_swa_index_mapping[kv_indices.long()].to(torch.int32)

    def route(self, layer_id: int) -> tuple[MHATokenToKVPool, int, bool]:
        """(sub-pool, layer id inside it, is_swa) of a model layer."""
        hit = self.layers_mapping.get(layer_id) if type(layer_id) is int else None
        if hit is not None:  # a layer step's lookup: a known int id
            return (self.swa_kv_pool if hit[1] else self.full_kv_pool), hit[0], hit[1]
        check_int("layer_id", layer_id)
        if layer_id not in self.layers_mapping:
            raise ValueError(f"layer_id {layer_id} is not in layers_mapping (known: {sorted(self.layers_mapping)})")
        index, is_swa = self.layers_mapping[layer_id]
        return (self.swa_kv_pool if is_swa else self.full_kv_pool), index, is_swa

    def is_swa_layer(self, layer_id: int) -> bool:
        return self.route(layer_id)[2]

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        pool, index, _ = self.route(layer_id)
        return pool.get_key_buffer(index)

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        pool, index, _ = self.route(layer_id)
        return pool.get_value_buffer(index)

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        pool, index, _ = self.route(layer_id)
        return pool.get_kv_buffer(index)

    def set_kv_buffer(self, layer, loc, cache_k, cache_v, k_scale=None, v_scale=None):
        """Write a layer's new K/V at full slots ``loc``; a sliding layer writes at ``mapping[loc]``.

        A ``loc`` outside the pool's full slots raises ValueError naming it and the range (always for a
        CPU ``loc``, in debug mode for a device one)."""
        pool, index, is_swa = self.route(_layer_id(layer))
        check_tensor("loc", loc, dtype=INDEX_DTYPES, device=self.device, ndim=1)
        if is_swa:
            if self.full_to_swa_index_mapping is not None:
                n = self.full_to_swa_index_mapping.shape[0]
                _check_in_range("loc", loc, 0, n - 2, f"the full slots 0..{n - 2}")
            loc = self.translate_loc_from_full_to_swa(loc)
        pool.set_kv_buffer(None, loc, cache_k, cache_v, k_scale, v_scale, layer_id_override=index)
