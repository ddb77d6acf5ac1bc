"""GroupedTensor.quantize_with_column_sums: the quantized tensor of GroupedTensor.quantize and each
member's column sums (a bias gradient) from the same pass, on both backends."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from conftest import (assert_bytes_equal, assert_colsums_close, assert_quantized_equal,
                      requires_gpu, to_host)
from lowprec_moe import GroupedTensor

# an empty member, members shorter than a 32-row tile, several 32- and 64-row tiles, ragged ends
SPLITS = (0, 5, 100, 33, 0, 64, 130)
K = 192

CASES = {
    "mxfp8-row+col": dict(format="mxfp8", columnwise=True),
    "mxfp8-e5m2-col": dict(format="mxfp8", rowwise=False, columnwise=True, fp8_dtype="e5m2"),
    "nvfp4-row": dict(format="nvfp4"),
    "nvfp4-row+col": dict(format="nvfp4", columnwise=True),
    "nvfp4-row-scaled-col": dict(format="nvfp4", rowwise=False, columnwise=True, row_scaled=True),
    "nvfp4-row+col-rht-sr": dict(format="nvfp4", columnwise=True, rht=True,
                                 stochastic_rounding=True, seed=11),
}


def _dy(m, k, seed=0, dtype=ml_dtypes.bfloat16):
    return np.random.default_rng(seed).standard_normal((m, k)).astype(np.float32).astype(dtype)


def _probs(m, seed=1):
    return np.random.default_rng(seed).random(m).astype(np.float32)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("with_probs", [False, True], ids=["plain", "probs"])
def test_tensor_as_quantize_and_sums_within_rounding(xp, case, with_probs):
    opts = CASES[case]
    m = sum(SPLITS)
    x = _dy(m, K)
    p = _probs(m) if with_probs else None
    gt, sums = GroupedTensor.quantize_with_column_sums(
        xp.asarray(x), SPLITS, probs=None if p is None else xp.asarray(p), **opts)
    plain = GroupedTensor.quantize(xp.asarray(x), SPLITS, **opts)
    assert_quantized_equal(gt, plain, case)
    assert_colsums_close(sums, x, SPLITS, p)
    assert isinstance(sums, xp.ndarray)  # on x's backend


def _dy_and_probs(xp, seed: int):
    """dy ``[sum(SPLITS), K]`` and its probs on ``xp`` (seeds ``seed`` and ``seed + 1``)."""
    m = sum(SPLITS)
    return xp.asarray(_dy(m, K, seed=seed)), xp.asarray(_probs(m, seed=seed + 1))


@pytest.mark.parametrize("case", list(CASES))
def test_sums_deterministic_and_per_member(xp, case):
    opts = CASES[case]
    x, p = _dy_and_probs(xp, 3)
    _, full = GroupedTensor.quantize_with_column_sums(x, SPLITS, probs=p, **opts)
    _, again = GroupedTensor.quantize_with_column_sums(x, SPLITS, probs=p, **opts)
    assert_bytes_equal(again, full, "run to run")
    lo = 0
    for g, s in enumerate(SPLITS):
        if s:  # a member's sums depend on its own rows only
            _, one = GroupedTensor.quantize_with_column_sums(x[lo:lo + s], [s], probs=p[lo:lo + s],
                                                             **opts)
            assert_bytes_equal(one[0], full[g], f"member {g} alone vs grouped")
        lo += s


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("k", [K, 96])  # 96: a partial column tile for every input type
def test_other_input_dtypes(xp, fmt, dtype, k):
    m = sum(SPLITS)
    x = _dy(m, k, seed=5, dtype=np.dtype(dtype))
    _, sums = GroupedTensor.quantize_with_column_sums(xp.asarray(x), SPLITS, fmt)
    assert_colsums_close(sums, x, SPLITS, None)


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_nan_and_inf_propagate(xp, fmt):
    x = np.ones((80, 64), dtype=np.float32)
    x[3, 1] = np.nan
    x[70, 2] = np.inf
    _, sums = GroupedTensor.quantize_with_column_sums(xp.asarray(x), [40, 40], fmt)
    sums = to_host(sums)
    assert np.isnan(sums[0, 1]) and np.isinf(sums[1, 2]) and sums[0, 0] == 40.0


def test_probs_validated(xp):
    x = xp.asarray(_dy(10, 64))
    with pytest.raises(ValueError, match="probs.shape"):
        GroupedTensor.quantize_with_column_sums(x, [10], "mxfp8", probs=xp.ones(9, xp.float32))
    with pytest.raises(TypeError):
        GroupedTensor.quantize_with_column_sums(x, [10], "mxfp8", probs=3.0)


@requires_gpu
@pytest.mark.gpu
def test_gpu_probs_on_the_host_refused(cp):
    with pytest.raises(TypeError):
        GroupedTensor.quantize_with_column_sums(cp.asarray(_dy(10, 64)), [10], "nvfp4",
                                                probs=np.ones(10, np.float32))


@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("case", list(CASES))
def test_gpu_device_splits_equal_host_splits(cp, case):
    opts = CASES[case]
    x, p = _dy_and_probs(cp, 6)
    gt_h, sums_h = GroupedTensor.quantize_with_column_sums(x, SPLITS, probs=p, **opts)
    gt_d, sums_d = GroupedTensor.quantize_with_column_sums(
        x, cp.asarray(SPLITS, dtype=cp.int64), probs=p, **opts)
    assert_bytes_equal(sums_d, sums_h, f"{case} sums, device vs host splits")
    assert_quantized_equal(gt_d.with_host_splits(), gt_h, f"{case}, device vs host splits")


@requires_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "float16"])
@pytest.mark.parametrize("device_splits", [False, True], ids=["host", "device"])
def test_gpu_equal_to_the_reduce_kernel_in_the_quantizer_order(cp, fmt, dtype, device_splits):
    """grouped_colsum(like=fmt) sums in the quantize kernel's order: the same bits, so a layer's
    dbias does not depend on whether dy went through a quantize pass."""
    from lowprec_moe.backends.cupy.reduce import grouped_colsum

    m = sum(SPLITS)
    dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    x, p = cp.asarray(_dy(m, K, seed=8, dtype=dt)), cp.asarray(_probs(m, seed=9))
    splits = cp.asarray(SPLITS, dtype=cp.int64) if device_splits else SPLITS
    for probs in (None, p):
        _, fused = GroupedTensor.quantize_with_column_sums(x, splits, fmt, probs=probs)
        assert_bytes_equal(grouped_colsum(x, splits, probs, like=fmt), fused,
                           f"{fmt} {dtype} probs={probs is not None}")
