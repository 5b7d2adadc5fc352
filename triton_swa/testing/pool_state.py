"""Realistic serving states for tests: requests admitted, extended and evicted by the real allocators,
with NaN in every pool slot that no window may read."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..mem import ReqToTokenPool, SWAKVPool, SWATokenToKVPoolAllocator, evict_swa_window
from ..runtime.window import window_start

__all__ = ["PoolState", "Request", "make_pool_state"]


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
        return torch.tensor([r.req_pool_index for r in self.requests], dtype=torch.int64, device=self.req_to_token.device)

    def seq_lens(self) -> torch.Tensor:
        return torch.tensor([r.seq_len for r in self.requests], dtype=torch.int64, device=self.req_to_token.device)

    def prefix_lens(self) -> torch.Tensor:
        return torch.tensor([r.prefix_len for r in self.requests], dtype=torch.int64, device=self.req_to_token.device)

    def new_slots(self) -> torch.Tensor:
        """Full slots of the current step's new tokens, request by request (``out_cache_loc``)."""
        parts = [self.req_to_token[r.req_pool_index, r.prefix_len : r.seq_len].long() for r in self.requests]
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)

    def extend(self, request: Request, num_tokens: int) -> torch.Tensor | None:
        """Allocate ``num_tokens`` more tokens for ``request`` and record them; returns their full slots."""
        dev = self.req_to_token.device
        prefix = torch.tensor([request.seq_len], device=dev)
        last = (
            self.req_to_token[request.req_pool_index, request.seq_len - 1].long().reshape(1)
            if request.seq_len > 0
            else torch.tensor([-1], device=dev)
        )
        slots = self.allocator.alloc_extend(prefix, prefix + num_tokens, last, num_tokens)
        if slots is None:
            return None
        self.req_to_token[request.req_pool_index, request.seq_len : request.seq_len + num_tokens] = slots.to(torch.int32)
        request.seq_len += num_tokens
        return slots

    def evict(self) -> None:
        """Window eviction of every request (SWA slots of tokens no later query can see)."""
        for r in self.requests:
            r.evicted_len = evict_swa_window(
                self.allocator, self.req_to_token, r.req_pool_index, r.seq_len, self.window_left, r.evicted_len
            )

    def fill_kv(self, generator: torch.Generator | None = None, *, window_of=None) -> None:
        """Random K/V in every slot a window may read, NaN everywhere else (dummy slot 0 included).

        A sliding layer's readable slots are the SWA slots of tokens ``[window_of(r), seq_len)``
        (default: the prefix window ``max(0, P - W)`` of the step's committed length ``P``, which for
        one new token is the decode window); a full layer's are the full slots of every token.
        """
        window_of = window_of or (lambda r: window_start(r.prefix_len, self.window_left, extend=True))
        pool = self.kv_pool
        for index, is_swa in pool.layers_mapping.values():
            sub = pool.swa_kv_pool if is_swa else pool.full_kv_pool
            live = []
            for r in self.requests:
                first = window_of(r) if is_swa else 0
                full = self.req_to_token[r.req_pool_index, first : r.seq_len].long()
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
        pages_full * ps,
        pages_swa * ps,
        ps,
        dtype,
        swa_attention_layer_ids=list(range(num_swa_layers)),
        full_attention_layer_ids=list(range(num_swa_layers, n_layers)),
        device=device,
        swa_head_num=swa_head_num,
        swa_head_dim=swa_head_dim,
        full_head_num=full_head_num,
        full_head_dim=full_head_dim,
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
