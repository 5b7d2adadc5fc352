"""The one loud comparison of the test suite: :func:`assert_close`."""

from __future__ import annotations

import torch

__all__ = ["DEFAULT_TOLERANCES", "assert_close"]

# (atol, rtol) by the dtype of the tensor under test: what one rounding in that dtype costs on
# attention outputs of magnitude ~1, with headroom for accumulation order.
DEFAULT_TOLERANCES = {
    torch.float64: (1e-10, 1e-10),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
    torch.float8_e4m3fn: (6e-2, 6e-2),
    torch.float8_e4m3fnuz: (6e-2, 6e-2),
}


def assert_close(
    actual: torch.Tensor, expected: torch.Tensor, *, atol: float | None = None, rtol: float | None = None, name: str = "output"
) -> None:
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
                f"got {int(actual.reshape(-1)[i])}, expected {int(expected.reshape(-1)[i])}"
            )
        return
    d_atol, d_rtol = DEFAULT_TOLERANCES.get(actual.dtype, DEFAULT_TOLERANCES[torch.float32])
    atol = d_atol if atol is None else atol
    rtol = d_rtol if rtol is None else rtol
    a = actual.detach().cpu().to(torch.float64).reshape(-1)
    e = expected.detach().cpu().to(torch.float64).reshape(-1)
    finite = torch.isfinite(a) & torch.isfinite(e)
    special_ok = torch.where(finite, torch.ones_like(finite), (torch.isnan(a) & torch.isnan(e)) | (a == e))
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
            f"first bad index {idx}: got {float(a[i])!r}, expected {float(e[i])!r}"
        )
