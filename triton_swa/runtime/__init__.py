"""What every op shares and no op owns: argument checks, device facts, the kernel launcher, the plan
cache, poisoned allocations for tests and the debug index guard.

Nothing here knows an op's meaning; ``triton_swa.ops`` builds on it, and so do the pools and the
backend (argument checks, the guard).
"""
