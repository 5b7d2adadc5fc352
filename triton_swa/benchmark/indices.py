"""Op ``indices`` of ``triton-swa bench``: the decode window's index build with the SWA mapping.

A case is ``B`` requests of ``L`` tokens whose decode windows (the last ``W + 1`` tokens) are
translated from full-pool slots to SWA slots through an int64 ``full_to_swa_index_mapping`` of at
least 4M slots (random slots at page size 1, random pages at page size 16; the mapping keeps each
slot's in-page offset, docs/contract.md §2). Page size 1 builds the CSR list (``kv_indptr``,
``kv_indices``, ``window_starts``), a larger page size the window's page table. Providers:

- ``triton_swa``: ``build_window_indices`` / ``build_window_page_table`` with ``mapping`` (one launch
  into fixed output buffers);
- ``two_pass``: the same builder without the mapping, then the translation by a torch gather (what
  engines did before the fused builder);
- ``plain_gather``: ``torch.index_select`` of the mapping at the window's full slots (page size 1) or
  at its pages' first slots, computed beforehand: the same gathers with nothing else to do, the floor
  of a translation (it writes int64).

Each is checked exactly against ``triton_swa_reference`` (``max_abs_err`` counts the entries that
differ; outputs are poisoned with -7 before the check).
"""

from __future__ import annotations

import torch

from .cases import Case

POISON = -7


def _mapping_and_rows(case: Case, gen: torch.Generator, device: str):
    """``req_to_token`` int32 `[B + 1, L]` (row 0 unused) over distinct random pages of a full pool of
    at least 4M slots (4k in Triton's interpreter), and the int64 mapping of that pool to SWA slots:
    page by page to distinct random SWA pages (a live pool's, which the debug guard checks)."""
    B, L, ps = case.batch, case.context, case.page_size
    per_row = -(-L // ps)
    n_pages = max((B + 1) * per_row + 1, (1 << 22 if device == "cuda" else 1 << 12) // ps)
    pages = (torch.randperm(n_pages - 1, device=device, generator=gen)[: (B + 1) * per_row] + 1).view(B + 1, per_row).to(torch.int32)
    offsets = torch.arange(ps, device=device, dtype=torch.int32)
    req_to_token = (pages[:, :, None] * ps + offsets).reshape(B + 1, per_row * ps)[:, :L].contiguous()
    req_to_token[0] = 0
    size = n_pages * ps
    swa_pages = torch.randperm(n_pages + 1, device=device, generator=gen)[1:] + 1  # never page 0, the dummy
    slot = torch.arange(size + ps + 1, device=device)
    mapping = swa_pages[(slot // ps).clamp(max=n_pages - 1)] * ps + slot % ps
    mapping[0], mapping[-1] = 0, -1
    return req_to_token, mapping


def _pages(case: Case) -> int:
    """Pages the decode window spans (page size > 1)."""
    return (case.context - 1) // case.page_size - case.window_start // case.page_size + 1


def width(case: Case) -> int:
    """Pages of the decode window's page table (page size > 1)."""
    import triton_swa

    return triton_swa.max_window_pages(case.shape.window_left, case.page_size, case.context)


def build(case: Case, gen: torch.Generator, device: str) -> dict:
    """One input set: the pool's rows and mapping, the batch, the output buffers (poisoned)."""
    B = case.batch
    req_to_token, mapping = _mapping_and_rows(case, gen, device)
    x = dict(
        req_to_token=req_to_token,
        mapping=mapping,
        req_pool_indices=torch.arange(1, B + 1, dtype=torch.int64, device=device),
        seq_lens=torch.full((B,), case.context, dtype=torch.int64, device=device),
    )
    poison = lambda *shape: torch.full(shape, POISON, dtype=torch.int32, device=device)
    if case.page_size == 1:
        x["out"] = (poison(B + 1), poison(B * case.window), poison(B))
    else:
        x["out"] = (poison(B, width(case)), poison(B))
    # the full slots the plain gather reads: the window's (page size 1) or its pages' first (table)
    ps, start = case.page_size, case.window_start
    rows = x["req_pool_indices"][:, None]
    if ps == 1:
        cols = torch.arange(start, case.context, device=device)
    else:
        cols = (start // ps + torch.arange(_pages(case), device=device)) * ps
    x["full_slots"] = req_to_token[rows, cols[None, :]].reshape(-1).long()
    return x


def reference(case: Case, x: dict) -> tuple:
    """The float64 check's counterpart: the exact outputs, from ``triton_swa_reference``."""
    import triton_swa_reference as ref

    args = (x["req_to_token"], x["req_pool_indices"], x["seq_lens"])
    W = case.shape.window_left
    if case.page_size == 1:
        return ref.decode_window_indices(*args, W, x["mapping"])
    starts = ref.decode_window_start(x["seq_lens"], W)
    table = ref.window_page_table(*args[:2], starts, x["seq_lens"], case.page_size, x["mapping"], max_pages=width(case))
    return table, starts.to(torch.int32)


def check(case: Case, x: dict, call, expected) -> float:
    """Entries that differ from the reference (what ``call.result`` returns, else the outputs)."""
    for t in x["out"]:
        t.fill_(POISON)
    call()
    if hasattr(call, "result"):  # the plain gather: its translated entries only
        got = call.result()
        expected = (expected[1],) if case.page_size == 1 else (expected[0][:, : got[0].shape[1]],)
    else:
        got = x["out"]
    return float(sum(int((g.cpu().long() != w.cpu().long()).sum()) for g, w in zip(got, expected)))


def _outputs(case: Case, x: dict):
    import triton_swa

    return triton_swa.WindowIndices(*x["out"]) if case.page_size == 1 else triton_swa.WindowPageTable(*x["out"])


def _build(case: Case, x: dict, mapping, out, debug: bool | None = None):
    """The builder's call for the case's form (CSR at page size 1, page table otherwise)."""
    import triton_swa

    args = (x["req_to_token"], x["req_pool_indices"], x["seq_lens"])
    kw = dict(window_left=case.shape.window_left, mapping=mapping, out=out, **({} if debug is None else dict(debug=debug)))
    if case.page_size == 1:
        return lambda: triton_swa.build_window_indices(*args, **kw)
    return lambda: triton_swa.build_window_page_table(*args, page_size=case.page_size, **kw)


def fused(case: Case, x: dict, debug: bool | None = None):
    return _build(case, x, x["mapping"], _outputs(case, x), debug)


def two_pass(case: Case, x: dict):
    """The builder without the mapping into a buffer of its own, then the gather into the outputs."""
    out, mapping, ps = x["out"], x["mapping"], case.page_size
    full = torch.empty_like(out[-2])
    if ps == 1:
        build = _build(case, x, None, type(_outputs(case, x))(out[0], full, out[2]))
        translate = lambda: out[1].copy_(mapping[full])
    else:
        build = _build(case, x, None, type(_outputs(case, x))(full, out[1]))
        translate = lambda: out[0].copy_(mapping[full * ps] // ps)

    def call():
        build()
        translate()

    return call


def plain_gather(case: Case, x: dict):
    """``index_select`` of the mapping at the full slots (int64 out); checked as the translated entries."""
    got = torch.empty(x["full_slots"].numel(), dtype=x["mapping"].dtype, device=x["mapping"].device)

    def call():
        torch.index_select(x["mapping"], 0, x["full_slots"], out=got)

    ps = case.page_size
    call.result = lambda: (got,) if ps == 1 else ((got // ps).view(case.batch, -1),)
    return call


PROVIDERS = {
    "triton_swa": fused,
    "triton_swa_debug": lambda case, x: fused(case, x, debug=True),
    "two_pass": two_pass,
    "plain_gather": plain_gather,
}
