"""The testing helpers users rely on: assert_close must be loud and must not pass NaN."""

import pytest
import torch

from triton_swa.testing import assert_close, make_pool_state

pytestmark = pytest.mark.reference


def test_assert_close_reports_the_first_bad_index():
    want = torch.zeros(2, 3, dtype=torch.float64)
    got = want.clone().float()
    got[1, 2] = 0.5
    with pytest.raises(AssertionError, match=r"1 of 6 elements mismatch.*first bad index \(1, 2\)"):
        assert_close(got, want)


def test_assert_close_fails_on_nan_where_reference_is_finite():
    with pytest.raises(AssertionError, match="NaN in actual 1"):
        assert_close(torch.tensor([1.0, float("nan")]), torch.tensor([1.0, 2.0]))
    assert_close(torch.tensor([float("nan"), float("inf")]), torch.tensor([float("nan"), float("inf")]))
    with pytest.raises(AssertionError):
        assert_close(torch.tensor([float("inf")]), torch.tensor([float("-inf")]))


def test_assert_close_per_dtype_defaults_and_integers():
    want = torch.tensor([1.0], dtype=torch.float64)
    assert_close(torch.tensor([1.001], dtype=torch.float16), want)
    with pytest.raises(AssertionError):
        assert_close(torch.tensor([1.001], dtype=torch.float32), want)
    with pytest.raises(AssertionError, match="integers differ"):
        assert_close(torch.tensor([1, 2], dtype=torch.int32), torch.tensor([1, 3]))
    with pytest.raises(AssertionError, match="shape"):
        assert_close(torch.zeros(2), torch.zeros(3))


def test_make_pool_state_rejects_bad_new_tokens():
    with pytest.raises(ValueError, match="new_tokens"):
        make_pool_state(seq_lens=[3], window_left=2, new_tokens=[4])
