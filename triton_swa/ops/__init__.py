"""The ops: one package or module per op, each a public launcher (check -> plan -> launch) over its
Triton kernel and its heuristics; ``_common`` holds what their kernels share.

- ``decode/``: :func:`~triton_swa.swa_decode`; ``extend/``: :func:`~triton_swa.swa_extend`;
- ``indices``: window indices, page tables and SWA write slots; ``kv_store``: K/V stores.
"""
