"""Bad input at the public boundary (NUMERICS §9): clear errors that name the value.

Array inputs go through ``xp``: both backends must raise the same exception type with the same
message, before any kernel runs.
"""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

import lowprec_moe as lpm

from conftest import requires_gpu


def _x(xp, shape=(32, 64), dtype=np.float32):
    return xp.asarray(np.random.default_rng(0).standard_normal(shape).astype(dtype))


# ------------------------------------------------------------------------------ input arrays
@pytest.mark.parametrize("dtype", [np.int32, np.int8, np.uint8, np.float64, np.bool_])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_unsupported_dtype(xp, dtype, fmt):
    x = xp.zeros((32, 64), dtype=dtype)
    name = np.dtype(dtype).name
    for q in (lambda: lpm.quantize(x, fmt),
              lambda: lpm.GroupedTensor.quantize(x, [32], fmt)):
        with pytest.raises(TypeError, match=rf"x\.dtype={name} is not supported"):
            q()


def test_not_an_array():
    with pytest.raises(TypeError, match="x must be a numpy or cupy array, got list"):
        lpm.quantize([[1.0] * 16], "nvfp4")
    with pytest.raises(TypeError, match="got float"):
        lpm.GroupedTensor.quantize(1.0, [1], "nvfp4")


@pytest.mark.parametrize("shape", [(), (64,)])
def test_rank_0_and_1(xp, shape):
    x = xp.zeros(shape, dtype=np.float32)
    with pytest.raises(ValueError, match=re.escape(f"x must have rank >= 2, got shape {shape}")):
        lpm.quantize(x, "nvfp4")
    with pytest.raises(ValueError, match=re.escape(f"got shape {shape}")):
        lpm.GroupedTensor.quantize(x, [1], "mxfp8")


@pytest.mark.parametrize("fmt, k, block", [("nvfp4", 100, 16), ("nvfp4", 8, 16),
                                           ("mxfp8", 100, 32), ("mxfp8", 48, 32)])
def test_k_not_multiple_of_block(xp, fmt, k, block):
    x = _x(xp, (32, k))
    msg = f"K={k} must be a multiple of {block} for {fmt}"
    with pytest.raises(ValueError, match=msg):
        lpm.quantize(x, fmt)
    with pytest.raises(ValueError, match=msg):
        lpm.GroupedTensor.quantize(x, [16, 16], fmt)
    with pytest.raises(ValueError, match=f"K={k}"):
        lpm.quantize(_x(xp, (2, 3, k)), fmt)   # rank 3: K is the last axis


# ------------------------------------------------------------------------------------ splits
@pytest.mark.parametrize("splits, exc, msg", [
    ([16, -1, 17], ValueError, r"splits=\[16, -1, 17\] must be non-negative"),
    ([16, 15], ValueError, r"splits=\[16, 15\] sum to 31, expected M=32"),
    ([16, 16, 1], ValueError, r"sum to 33, expected M=32"),
    ([], ValueError, r"splits=\[\] must name at least one group"),
    ([16.0, 16.0], TypeError, r"splits=\[16.0, 16.0\] must be a 1-D sequence of ints"),
    ([[16, 16]], TypeError, r"must be a 1-D sequence of ints"),
    (["a", "b"], TypeError, r"must be a 1-D sequence of ints"),
    (32, TypeError, r"splits=32 must be a 1-D sequence of ints"),
])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_bad_splits(xp, splits, exc, msg, fmt):
    x = _x(xp)
    with pytest.raises(exc, match=msg):
        lpm.GroupedTensor.quantize(x, splits, fmt)
    q = lpm.quantize(_x(np), "mxfp8")
    with pytest.raises(exc, match=msg):
        lpm.GroupedTensor.from_mxfp8_rowwise(xp.asarray(q.rowwise_data),
                                             xp.asarray(q.rowwise_scale), splits)


@pytest.mark.parametrize("splits", [[16, 16], [0, 32], [16, -1, 17], [16, 15], [], [True, 31]])
def test_splits_fast_path_matches_array_path(splits):
    """check_splits' plain-int fast path (lists / tuples of Python ints) returns and raises
    exactly what the array path does (numpy arrays, numpy integers; bools take that path)."""
    from lowprec_moe._validate import check_splits

    def outcome(v):
        try:
            got = check_splits(v, 32)
        except (TypeError, ValueError) as e:
            return type(e).__name__, str(e)
        assert all(type(g) is int for g in got)
        return "ok", got

    want = outcome(np.asarray(splits, dtype=np.int64))
    for form in (list(splits), tuple(splits), [np.int64(v) for v in splits]):
        assert outcome(form) == want, (form, want)


@requires_gpu
def test_cupy_splits():
    import cupy

    x = np.zeros((32, 64), dtype=np.float32)
    with pytest.raises(TypeError, match="splits is a cupy array but x is a numpy array"):
        lpm.GroupedTensor.quantize(x, cupy.asarray([16, 16]), "nvfp4")


@requires_gpu
def test_numpy_and_cupy_mixed():
    import cupy

    q = lpm.quantize(np.zeros((32, 64), np.float32), "mxfp8")
    with pytest.raises(TypeError, match="cannot mix NumPy and CuPy arrays"):
        lpm.GroupedTensor.from_mxfp8_rowwise(q.rowwise_data, cupy.asarray(q.rowwise_scale), [32])


def test_block_2d_splits_not_multiple(xp):
    msg = r"splits=\[16, 16\] must all be multiples of 32 for mxfp8"
    with pytest.raises(ValueError, match=msg):
        lpm.GroupedTensor.quantize(_x(xp), [16, 16], "mxfp8", block_2d=True)
    with pytest.raises(ValueError, match=r"splits=\[8, 24\] must all be multiples of 16 for nvfp4"):
        lpm.GroupedTensor.quantize(_x(xp), [8, 24], "nvfp4", block_2d=True)


# ----------------------------------------------------------------------------------- options
@pytest.mark.parametrize("fmt", ["int4", "NVFP4", "fp8", None, 3])
def test_unknown_format(xp, fmt):
    with pytest.raises(ValueError, match=re.escape(f"format={fmt!r} must be one of")):
        lpm.quantize(_x(xp), fmt)
    with pytest.raises(ValueError, match=re.escape(f"format={fmt!r}")):
        lpm.GroupedTensor.quantize(_x(xp), [32], fmt)


@pytest.mark.parametrize("fmt, opts, msg", [
    ("nvfp4", dict(row_scaled=True, block_2d=True),
     "row_scaled=True cannot be combined with block_2d=True"),
    ("nvfp4", dict(row_scaled=True, rht=True, columnwise=True),
     "row_scaled=True cannot be combined with rht=True"),
    ("nvfp4", dict(row_scaled=True, stochastic_rounding=True),
     "row_scaled=True cannot be combined with stochastic_rounding=True"),
    ("mxfp8", dict(row_scaled=True), "row_scaled=True is an nvfp4 option"),
    ("mxfp8", dict(rht=True), "rht=True is an nvfp4 option"),
    ("mxfp8", dict(stochastic_rounding=True), "stochastic_rounding=True is an nvfp4 option"),
    ("nvfp4", dict(fp8_dtype="e5m2"), "fp8_dtype='e5m2' applies to mxfp8 only"),
    ("nvfp4", dict(rowwise=False, columnwise=False),
     "rowwise=False and columnwise=False: nothing to quantize"),
    ("mxfp8", dict(rowwise=False, columnwise=False), "nothing to quantize"),
])
def test_conflicting_options(xp, fmt, opts, msg):
    x = _x(xp, dtype=ml_dtypes.bfloat16)   # bf16 so that rht itself is allowed
    with pytest.raises(ValueError, match=re.escape(msg)):
        lpm.quantize(x, fmt, **opts)
    with pytest.raises(ValueError, match=re.escape(msg)):
        lpm.GroupedTensor.quantize(x, [16, 16], fmt, **opts)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_rht_needs_bf16(xp, dtype):
    name = np.dtype(dtype).name
    with pytest.raises(ValueError, match=f"rht=True requires bfloat16 input, got dtype={name}"):
        lpm.quantize(_x(xp, dtype=dtype), "nvfp4", columnwise=True, rht=True)
    with pytest.raises(ValueError, match=f"got dtype={name}"):
        lpm.GroupedTensor.quantize(_x(xp, dtype=dtype), [32], "nvfp4", columnwise=True, rht=True)


@pytest.mark.parametrize("fmt, m, block", [("nvfp4", 20, 16), ("mxfp8", 48, 32)])
def test_block_2d_m_not_multiple(xp, fmt, m, block):
    with pytest.raises(ValueError,
                       match=f"M={m} must be a multiple of {block} for {fmt} with block_2d=True"):
        lpm.quantize(_x(xp, (m, 64)), fmt, block_2d=True)


@pytest.mark.parametrize("bad", ["e4m3fn", "E4M3", "fp8", None])
def test_bad_fp8_dtype(xp, bad):
    msg = re.escape(f"fp8_dtype={bad!r} must be one of")
    with pytest.raises(ValueError, match=msg):
        lpm.quantize(_x(xp), "mxfp8", fp8_dtype=bad)
    with pytest.raises(ValueError, match=msg):
        lpm.GroupedTensor.quantize(_x(xp), [32], "mxfp8", fp8_dtype=bad)
    q = lpm.quantize(_x(np), "mxfp8")
    with pytest.raises(ValueError, match=msg):
        lpm.GroupedTensor.from_mxfp8_rowwise(xp.asarray(q.rowwise_data),
                                             xp.asarray(q.rowwise_scale), [32], fp8_dtype=bad)


@pytest.mark.parametrize("seed, exc, msg", [
    (-1, ValueError, "seed=-1 must be in [0, 2**64)"),
    (2**64, ValueError, f"seed={2**64} must be in [0, 2**64)"),
    (1.5, TypeError, "seed=1.5 must be an int"),
    ("3", TypeError, "seed='3' must be an int"),
    (True, TypeError, "seed=True must be an int"),
    (None, TypeError, "seed=None must be an int"),
])
def test_bad_seed(xp, seed, exc, msg):
    with pytest.raises(exc, match=re.escape(msg)):
        lpm.quantize(_x(xp), "nvfp4", stochastic_rounding=True, seed=seed)
    with pytest.raises(exc, match=re.escape(msg)):
        lpm.GroupedTensor.quantize(_x(xp), [32], "nvfp4", stochastic_rounding=True, seed=seed)


def test_good_seeds_accepted():
    x = _x(np)
    for seed in (0, 2**64 - 1, np.uint64(2**64 - 1), np.int32(5)):
        assert lpm.quantize(x, "nvfp4", stochastic_rounding=True, seed=seed).seed == int(seed)


# ----------------------------------------------------------------------------- check_finite
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_check_finite(xp, bad, fmt):
    x = np.random.default_rng(0).standard_normal((32, 64)).astype(np.float32)
    x[7, 9] = bad
    for dtype in (np.float32, ml_dtypes.bfloat16):
        xa = xp.asarray(x.astype(dtype))
        with pytest.raises(ValueError, match=re.escape("x contains NaN or inf values "
                                                       "(check_finite=True)")):
            lpm.quantize(xa, fmt, check_finite=True)
        with pytest.raises(ValueError, match="check_finite=True"):
            lpm.GroupedTensor.quantize(xa, [16, 16], fmt, check_finite=True)
        # without the flag the hardware conversion rules apply
        lpm.quantize(xa, fmt)


# ------------------------------------------------------------------------------- dequantize
def test_dequantize_missing_direction(xp):
    q = lpm.quantize(_x(xp), "nvfp4")
    with pytest.raises(ValueError, match=re.escape(
            "direction='columnwise': this QuantizedTensor has no columnwise data")):
        lpm.dequantize(q, "columnwise")
    c = lpm.quantize(_x(xp), "mxfp8", rowwise=False, columnwise=True)
    with pytest.raises(ValueError, match="direction='rowwise'"):
        c.dequantize("rowwise")


@pytest.mark.parametrize("direction", ["diagonal", "row", None, 0])
def test_dequantize_bad_direction(xp, direction):
    q = lpm.quantize(_x(xp), "nvfp4", columnwise=True)
    msg = re.escape(f"direction={direction!r} must be 'rowwise' or 'columnwise'")
    with pytest.raises(ValueError, match=msg):
        lpm.dequantize(q, direction)
    g = lpm.GroupedTensor.quantize(_x(xp), [32], "nvfp4", columnwise=True)
    with pytest.raises(ValueError, match=msg):
        g.dequantize(direction)


@pytest.mark.parametrize("dtype", ["float64", "int8", "fp8", "bf16", np.float64])
def test_dequantize_bad_dtype(xp, dtype):
    q = lpm.quantize(_x(xp), "mxfp8")
    with pytest.raises(ValueError, match=re.escape(f"dtype={dtype!r} must be one of")):
        lpm.dequantize(q, dtype=dtype)
    g = lpm.GroupedTensor.quantize(_x(xp), [32], "mxfp8")
    with pytest.raises(ValueError, match=re.escape(f"dtype={dtype!r}")):
        g.dequantize(dtype=dtype)


def test_dequantize_not_a_quantized_tensor(xp):
    with pytest.raises(TypeError, match="q must be a QuantizedTensor, got ndarray"):
        lpm.dequantize(_x(xp))


# ------------------------------------------------------------------------------ wire format
def test_from_mxfp8_rowwise_bad_buffers(xp):
    q = lpm.quantize(_x(np), "mxfp8")
    data, scale = xp.asarray(q.rowwise_data), xp.asarray(q.rowwise_scale)
    with pytest.raises(TypeError, match="data.dtype=float32 must be uint8"):
        lpm.GroupedTensor.from_mxfp8_rowwise(data.astype(np.float32), scale, [32])
    with pytest.raises(TypeError, match="scale.dtype=int32 must be uint8"):
        lpm.GroupedTensor.from_mxfp8_rowwise(data, scale.astype(np.int32), [32])
    with pytest.raises(TypeError, match="data must be a numpy or cupy array, got list"):
        lpm.GroupedTensor.from_mxfp8_rowwise(data.tolist(), scale, [32])
    with pytest.raises(ValueError, match=re.escape("data must be 2-D, got shape (2048,)")):
        lpm.GroupedTensor.from_mxfp8_rowwise(data.reshape(-1), scale, [32])
    with pytest.raises(ValueError, match=re.escape("scale.shape=(32, 1) must be (32, 2)")):
        lpm.GroupedTensor.from_mxfp8_rowwise(data, scale[:, :1], [32])
    with pytest.raises(ValueError, match="K=48 must be a multiple of 32 for mxfp8"):
        lpm.GroupedTensor.from_mxfp8_rowwise(data[:, :48], scale, [32])


def test_swizzle_bad_input(xp):
    with pytest.raises(TypeError, match="scales.dtype=float32 must be uint8"):
        lpm.swizzle_scales(xp.zeros((4, 4), dtype=np.float32))
    with pytest.raises(ValueError, match=re.escape("scales must be 2-D, got shape (16,)")):
        lpm.swizzle_scales(xp.zeros(16, dtype=np.uint8))
    with pytest.raises(TypeError, match="buf.dtype=int8 must be uint8"):
        lpm.unswizzle_scales(xp.zeros(512, dtype=np.int8), (4, 4))
    q = lpm.quantize(_x(xp), "nvfp4")
    with pytest.raises(ValueError, match="direction='diagonal'"):
        lpm.swizzle_scales(q, "diagonal")
