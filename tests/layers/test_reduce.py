"""Per-expert column sums (bias gradients): lowprec_moe.backends.numpy.reduce / backends.cupy.reduce."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from conftest import assert_bytes_equal, assert_colsums_close, to_host
from lowprec_moe.backends.numpy.reduce import grouped_colsum as ref_colsum

_DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def _colsum(xp):
    if xp is np:
        return ref_colsum
    from lowprec_moe.backends.cupy.reduce import grouped_colsum

    return grouped_colsum


def _data(m, n, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((m, n)).astype(np.float32).astype(_DTYPES[dtype])


@pytest.mark.parametrize("dtype", list(_DTYPES))
@pytest.mark.parametrize("with_probs", [False, True])
@pytest.mark.parametrize("like", [None, "mxfp8", "nvfp4"])
def test_matches_float64_sums(xp, dtype, with_probs, like):
    # skewed splits: an empty expert, one shorter than the unroll, several 128-row tiles, odd
    # row counts (the MXFP8 order's even / odd rows)
    splits = [0, 5, 300, 131, 0, 64]
    m, n = sum(splits), 333
    a = _data(m, n, dtype)
    p = np.random.default_rng(1).random(m).astype(np.float32) if with_probs else None
    out = _colsum(xp)(xp.asarray(a), splits, None if p is None else xp.asarray(p), like=like)
    assert_colsums_close(out, a, splits, p)
    out = to_host(out)
    assert not out[0].any() and not out[4].any(), "empty experts must give exact zeros"


def test_grouped_equals_per_expert_and_deterministic(xp):
    splits = [130, 0, 257, 7]
    a = xp.asarray(_data(sum(splits), 96, "bfloat16", seed=3))
    p = xp.asarray(np.random.default_rng(4).random(sum(splits)).astype(np.float32))
    colsum = _colsum(xp)
    full = colsum(a, splits, p)
    assert_bytes_equal(colsum(a, splits, p), full, "run-to-run")
    lo = 0
    for g, s in enumerate(splits):
        one = colsum(a[lo:lo + s], [s], p[lo:lo + s])
        assert_bytes_equal(one[0], full[g], f"expert {g} alone vs grouped")
        lo += s


def test_nan_and_inf_propagate(xp):
    a = np.ones((40, 4), dtype=np.float32)
    a[3, 1] = np.nan
    a[30, 2] = np.inf
    out = to_host(_colsum(xp)(xp.asarray(a), [20, 20]))
    assert np.isnan(out[0, 1]) and np.isinf(out[1, 2]) and out[0, 0] == 20.0


def test_reference_formula():
    # float32 products, float64 sums, one rounding to float32
    splits = [3, 0, 9]
    a = _data(12, 5, "float16", seed=7)
    p = np.linspace(0.1, 1.0, 12).astype(np.float32)
    w = a.astype(np.float32) * p[:, None]
    w = w.astype(np.float64)
    exp = np.stack([w[:3].sum(axis=0), np.zeros(5), w[3:].sum(axis=0)]).astype(np.float32)
    assert_bytes_equal(ref_colsum(a, splits, p), exp, "reference")


def test_unknown_order_refused(xp):
    with pytest.raises(ValueError, match="like="):
        _colsum(xp)(xp.ones((4, 2), dtype=xp.float32), [4], like="fp8")


def test_both_backends_know_the_same_orders():
    """``like`` takes None or a quantized format on both backends (each GPU order is a
    quantize kernel's)."""
    from lowprec_moe import formats as F
    from lowprec_moe.backends.cupy import reduce as gpu
    from lowprec_moe.backends.numpy import reduce as cpu

    assert set(gpu.ORDERS) == set(cpu.ORDERS) == {None, *F.FORMATS}
