"""Host cost of the backend's per-step metadata (pytest-benchmark), on the GPU machine.

Run: ``python3 -m pytest bench/test_metadata_host.py --benchmark-only`` (skipped without CUDA).
It times ``init_forward_metadata`` for a decode step of B requests: the Python work plus the launches
of the two fused index builds (full and sliding layers), with a synchronisation so that each round
also includes the kernels.
"""

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("batch", [1, 64, 256])
def test_init_forward_metadata_host_cost(benchmark, batch):
    from bench.bench_step import build
    from triton_swa.backend import TritonSWAAttnBackend

    runner, _, fb = build(batch, 4096, 1023, n_sliding=1, n_full=1)
    backend = TritonSWAAttnBackend(runner)

    def once():
        backend.init_forward_metadata(fb)
        torch.cuda.synchronize()

    once()
    benchmark(once)
