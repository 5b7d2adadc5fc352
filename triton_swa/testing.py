"""Testing helpers for triton-swa and for users who compare their own kernels with the reference.

- :func:`assert_close`: the one loud comparison (max-abs, RMS, mismatch count, first bad index; NaN
  and inf must agree; per-dtype default tolerances).
- :func:`make_pool_state`: a random but realistic serving state built by the real allocators
  (several requests, permuted free lists, window eviction, NaN in every slot no window may read).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .mem import ReqToTokenPool, SWAKVPool, SWATokenToKVPoolAllocator, evict_swa_window

# (atol, rtol) by the dtype of the tensor under test: what one rounding in that dtype costs on
# attention outputs of magnitude ~1, with headroom for accumulation order.
DEFAULT_TOLERANCES = {
    torch.float64: (1e-10, 1e-10),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
    torch.float8_e4m3fn: (6e-2, 6e-2),
}


def assert_close(actual: torch.Tensor, expected: torch.Tensor, *, atol: float | None = None,
                 rtol: float | None = None, name: str = "output") -> None:
    """Fail loudly unless ``|actual - expected| <= atol + rtol * |expected|`` everywhere.

    Both are compared in float64. NaN and inf must sit at the same places with the same signs (a NaN
    where the reference has a number always fails). Integer tensors must be equal exactly. The message
    reports max-abs and RMS error, the mismatch count and the first bad index with both values.

    Args:
        actual (torch.Tensor): what the kernel produced; its dtype picks default tolerances.
        expected (torch.Tensor): the reference, any floating dtype (float64 preferred).
        atol, rtol (float | None): override the per-dtype defaults of ``DEFAULT_TOLERANCES``.
        name (str): what is compared, for the message.

    Raises:
        AssertionError: with the report above.
    """
    if actual.shape != expected.shape:
        raise AssertionError(f"{name}: shape {tuple(actual.shape)} != expected {tuple(expected.shape)}")
    if not actual.dtype.is_floating_point:
        bad = (actual.cpu().long() != expected.cpu().long()).reshape(-1)
        if bool(bad.any()):
            i = int(bad.nonzero()[0])
            idx = tuple(int(x) for x in torch.unravel_index(torch.tensor(i), actual.shape))
            raise AssertionError(
                f"{name}: {int(bad.sum())} of {bad.numel()} integers differ; first at {idx}: "
                f"got {int(actual.reshape(-1)[i])}, expected {int(expected.reshape(-1)[i])}")
        return
    d_atol, d_rtol = DEFAULT_TOLERANCES.get(actual.dtype, DEFAULT_TOLERANCES[torch.float32])
    atol = d_atol if atol is None else atol
    rtol = d_rtol if rtol is None else rtol
    a = actual.detach().cpu().to(torch.float64).reshape(-1)
    e = expected.detach().cpu().to(torch.float64).reshape(-1)
    finite = torch.isfinite(a) & torch.isfinite(e)
    special_ok = torch.where(finite, torch.ones_like(finite),
                             (torch.isnan(a) & torch.isnan(e)) | (a == e))
    err = torch.where(finite, (a - e).abs(), torch.zeros_like(a))
    bad = ~special_ok | (err > atol + rtol * e.abs().where(finite, torch.zeros_like(e)))
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        idx = tuple(int(x) for x in torch.unravel_index(torch.tensor(i), actual.shape))
        rms = float(err[finite].pow(2).mean().sqrt()) if bool(finite.any()) else float("nan")
        raise AssertionError(
            f"{name}: {int(bad.sum())} of {bad.numel()} elements mismatch "
            f"(atol={atol:g}, rtol={rtol:g}, dtype {actual.dtype}); "
            f"max-abs {float(err.max()):.3e}, RMS {rms:.3e}; "
            f"NaN in actual {int(torch.isnan(a).sum())}, in expected {int(torch.isnan(e).sum())}; "
            f"first bad index {idx}: got {float(a[i])!r}, expected {float(e[i])!r}")


@dataclass
class Request:
    """One live request of a :class:`PoolState`."""

    req_pool_index: int
    seq_len: int
    evicted_len: int = 0
    prefix_len: int = 0  # committed tokens before the current step's new ones


@dataclass
class PoolState:
    """A serving state: pools, allocator, requests, and which SWA slots hold real data."""

    req_to_token_pool: ReqToTokenPool
    kv_pool: SWAKVPool
    allocator: SWATokenToKVPoolAllocator
    requests: list[Request]
    window_left: int
    page_size: int
    meta: dict = field(default_factory=dict)

    @property
    def req_to_token(self) -> torch.Tensor:
        return self.req_to_token_pool.req_to_token

    @property
    def mapping(self) -> torch.Tensor:
        return self.allocator.full_to_swa_index_mapping

    def req_pool_indices(self) -> torch.Tensor:
        return torch.tensor([r.req_pool_index for r in self.requests], dtype=torch.int64,
                            device=self.req_to_token.device)

    def seq_lens(self) -> torch.Tensor:
        return torch.tensor([r.seq_len for r in self.requests], dtype=torch.int64,
                            device=self.req_to_token.device)

    def prefix_lens(self) -> torch.Tensor:
        return torch.tensor([r.prefix_len for r in self.requests], dtype=torch.int64,
                            device=self.req_to_token.device)

    def new_slots(self) -> torch.Tensor:
        """Full slots of the current step's new tokens, request by request (``out_cache_loc``)."""
        parts = [self.req_to_token[r.req_pool_index, r.prefix_len:r.seq_len].long() for r in self.requests]
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)

    def extend(self, request: Request, num_tokens: int) -> torch.Tensor | None:
        """Allocate ``num_tokens`` more tokens for ``request`` and record them; returns their full slots."""
        dev = self.req_to_token.device
        prefix = torch.tensor([request.seq_len], device=dev)
        last = self.req_to_token[request.req_pool_index, request.seq_len - 1].long().reshape(1) \
            if request.seq_len > 0 else torch.tensor([-1], device=dev)
        slots = self.allocator.alloc_extend(prefix, prefix + num_tokens, last, num_tokens)
        if slots is None:
            return None
        self.req_to_token[request.req_pool_index, request.seq_len:request.seq_len + num_tokens] = slots.to(torch.int32)
        request.seq_len += num_tokens
        return slots

    def evict(self) -> None:
        """Window eviction of every request (SWA slots of tokens no later query can see)."""
        for r in self.requests:
            r.evicted_len = evict_swa_window(self.allocator, self.req_to_token, r.req_pool_index,
                                             r.seq_len, self.window_left, r.evicted_len)

    def fill_kv(self, generator: torch.Generator | None = None, *, window_of=None) -> None:
        """Random K/V in every slot a window may read, NaN everywhere else (dummy slot 0 included).

        A sliding layer's readable slots are the SWA slots of tokens ``[window_of(r), seq_len)``
        (default: the prefix window ``max(0, P - W)`` of the step's committed length ``P``, which for
        one new token is the decode window); a full layer's are the full slots of every token.
        """
        from triton_swa_reference import extend_window_start

        window_of = window_of or (lambda r: extend_window_start(r.prefix_len, self.window_left))
        pool = self.kv_pool
        for index, is_swa in pool.layers_mapping.values():
            sub = pool.swa_kv_pool if is_swa else pool.full_kv_pool
            live = []
            for r in self.requests:
                first = window_of(r) if is_swa else 0
                full = self.req_to_token[r.req_pool_index, first:r.seq_len].long()
                live.append(self.mapping[full] if is_swa else full)
            live = torch.cat(live) if live else torch.zeros(0, dtype=torch.int64)
            for buf in sub.get_kv_buffer(index):
                values = torch.full(buf.shape, float("nan"), dtype=torch.float32)
                fresh = torch.randn(len(live), *buf.shape[1:], generator=generator)
                values[live.cpu()] = fresh
                buf.copy_(values.to(buf.dtype).to(buf.device))


def make_pool_state(
    *,
    seq_lens: list[int],
    window_left: int,
    page_size: int = 1,
    swa_head_num: int = 2,
    swa_head_dim: int = 16,
    full_head_num: int = 1,
    full_head_dim: int = 32,
    num_swa_layers: int = 1,
    num_full_layers: int = 1,
    dtype: torch.dtype = torch.float32,
    device="cpu",
    new_tokens: int | list[int] = 1,
    chunk: int = 5,
    spare_pages: int = 4,
    generator: torch.Generator | None = None,
) -> PoolState:
    """Build requests of the given lengths with the real allocators, as a server would, mid-step.

    Request ``b`` commits ``seq_lens[b] - new_tokens[b]`` tokens, appended ``chunk`` at a time round
    robin with window eviction after every round; then the step's ``new_tokens[b]`` are allocated
    (1 = decode; more = extend or verify; 0 = nothing new). Both free lists are permuted first, so
    full and SWA slots differ and interleave. The SWA pool is sized for the windows only (plus
    ``spare_pages``), as in real deployments. K/V are random in every slot the step may read and NaN
    everywhere else.
    """
    g = generator or torch.Generator().manual_seed(0)
    ps = page_size
    new = [new_tokens] * len(seq_lens) if isinstance(new_tokens, int) else list(new_tokens)
    if len(new) != len(seq_lens) or any(not 0 <= m <= n for m, n in zip(new, seq_lens)):
        raise ValueError(f"new_tokens must be between 0 and each seq_len, got {new_tokens} for {seq_lens}")
    total = sum(seq_lens)
    window = total if window_left < 0 else window_left + 1 + chunk + max(new, default=0) + 2 * ps
    pages_full = sum(-(-n // ps) for n in seq_lens) + spare_pages
    pages_swa = sum(-(-min(n, window) // ps) + 2 for n in seq_lens) + spare_pages
    n_layers = num_swa_layers + num_full_layers
    pool = SWAKVPool(
        pages_full * ps, pages_swa * ps, ps, dtype,
        swa_attention_layer_ids=list(range(num_swa_layers)),
        full_attention_layer_ids=list(range(num_swa_layers, n_layers)),
        device=device, swa_head_num=swa_head_num, swa_head_dim=swa_head_dim,
        full_head_num=full_head_num, full_head_dim=full_head_dim,
    )
    allocator = SWATokenToKVPoolAllocator(pages_full * ps, pages_swa * ps, ps, dtype, device, pool)
    allocator.full_attn_allocator.shuffle_free_list(g)
    allocator.swa_attn_allocator.shuffle_free_list(g)
    max_len = max(seq_lens, default=1) + 64
    rtp = ReqToTokenPool(len(seq_lens) + 2, max_len, device)
    rows = rtp.alloc(len(seq_lens) + 1)
    # Leave the first handed-out row unused so that request rows are not simply 1..B.
    requests = [Request(row, 0) for row in rows[1:]]
    state = PoolState(rtp, pool, allocator, requests, window_left, ps)
    committed = [n - m for n, m in zip(seq_lens, new)]
    while any(r.seq_len < n for r, n in zip(requests, committed)):
        for r, n in zip(requests, committed):
            step = min(chunk, n - r.seq_len)
            if step > 0 and state.extend(r, step) is None:
                raise RuntimeError("make_pool_state sized its pools too small")
        state.evict()
    for r, m in zip(requests, new):
        r.prefix_len = r.seq_len
        if m and state.extend(r, m) is None:
            raise RuntimeError("make_pool_state sized its pools too small")
    state.fill_kv(g)
    return state


def legacy_backend(model_runner, swa_allocator_type: type):
    """A backend that resolves its SWA pool by the rule SPEC §3's policy replaced: the allocator's
    pool when the allocator is of ``swa_allocator_type`` (see
    ``triton_swa_reference.legacy_resolve_by_allocator_type``). **For regression tests and
    demonstrations only**: on a draft worker whose active pool is SWA-backed (Gemma 4 + DFlash) it
    resolves nothing and the sliding layers read ``swa_buffer[full_slot]``."""
    import triton_swa_reference as ref

    from .backend import TritonSWAAttnBackend

    class LegacyBackend(TritonSWAAttnBackend):
        @staticmethod
        def _resolve_swa_kv_pool(runner):
            return ref.legacy_resolve_by_allocator_type(runner, swa_allocator_type)

    return LegacyBackend(model_runner)
