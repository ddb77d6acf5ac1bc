"""Expert splits are checked as Python ints: int64 / uint64 sums that wrap around are refused."""

from __future__ import annotations

import numpy as np
import pytest

import lowprec_moe as lpm


@pytest.mark.parametrize("dtype", [np.int64, np.uint64])
def test_wrapping_splits_are_refused(dtype):
    x = np.ones((32, 64), np.float32)
    splits = np.array([2**63 - 1, 2**63 - 1, 34], dtype)  # wraps to 32 in 64-bit arithmetic
    assert int(splits.sum()) == 32
    with pytest.raises(ValueError, match="sum to 18446744073709551648, expected M=32"):
        lpm.GroupedTensor.quantize(x, splits, "nvfp4")


def test_uint64_near_max_is_refused():
    x = np.ones((32, 64), np.float32)
    with pytest.raises(ValueError, match="expected M=32"):
        lpm.GroupedTensor.quantize(x, np.array([2**64 - 1, 33], np.uint64), "mxfp8")


def test_numpy_splits_still_accepted():
    x = np.ones((32, 64), np.float32)
    g = lpm.GroupedTensor.quantize(x, np.array([16, 0, 16], np.int64), "nvfp4")
    assert g.splits == (16, 0, 16) and all(type(s) is int for s in g.splits)
