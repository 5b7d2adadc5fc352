"""Test-side SGLang plugin: the allocators' free counts each time the scheduler is idle.

SGLang loads it in every engine process when ``tests/engine/plugins`` is on ``PYTHONPATH`` and
``SGLANG_PLUGINS`` names ``triton_swa_pool_probe`` (the load-and-fault scenario's servers do). It
wraps ``Scheduler.on_idle``: when the scheduler is fully idle, it appends a line to the file named by
``TRITON_SWA_POOL_PROBE_LOG`` whenever the counts changed since its last line::

    IDLE full=<free full slots> swa=<free SWA slots> req=<free request rows> cached=<evictable full> swa_cached=<evictable SWA>

``swa`` and ``swa_cached`` are -1 without an SWA allocator / SWA radix side. Nothing else changes.
"""

from __future__ import annotations

import os


def _counts(scheduler) -> dict:
    alloc = scheduler.token_to_kv_pool_allocator
    full = getattr(alloc, "full_available_size", alloc.available_size)()
    swa = alloc.swa_available_size() if hasattr(alloc, "swa_available_size") else -1
    tree = scheduler.tree_cache
    cached = int(tree.evictable_size()) if hasattr(tree, "evictable_size") else -1
    swa_cached = int(tree.swa_evictable_size()) if hasattr(tree, "swa_evictable_size") else -1
    return {
        "full": int(full),
        "swa": int(swa),
        "req": len(scheduler.req_to_token_pool.free_slots),
        "cached": cached,
        "swa_cached": swa_cached,
    }


def register() -> None:
    path = os.environ.get("TRITON_SWA_POOL_PROBE_LOG")
    if not path:
        return
    from sglang.srt.managers.scheduler import Scheduler

    original = Scheduler.on_idle
    last: list = [None]

    def on_idle(self):
        result = original(self)
        if self.is_fully_idle():
            counts = _counts(self)
            if counts != last[0]:
                last[0] = counts
                with open(path, "a") as f:
                    f.write("IDLE " + " ".join(f"{k}={v}" for k, v in counts.items()) + "\n")
        return result

    Scheduler.on_idle = on_idle
