"""``QuantizedTensor``, ``quantize`` / ``dequantize``, ``swizzle_scales`` (NUMERICS §§4, 6)."""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest

import lowprec_moe as lpm
from lowprec_moe.backends.numpy import layouts as L

from conftest import assert_bytes_equal, assert_quantized_equal, to_host


def _random(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _check_array(xp, a, shape, dtype):
    assert isinstance(a, xp.ndarray), type(a)
    assert tuple(a.shape) == shape
    assert a.dtype == dtype


M, K = 40, 64  # M is not a multiple of 16 or 32: padded columnwise copies


@pytest.mark.parametrize("row_scaled", [False, True])
def test_nvfp4_fields(xp, row_scaled):
    q = lpm.quantize(xp.asarray(_random((M, K))), "nvfp4", columnwise=True,
                     row_scaled=row_scaled)
    assert isinstance(q, lpm.QuantizedTensor)
    assert q.format == "nvfp4"
    assert q.shape == (M, K) and all(type(s) is int for s in q.shape)
    assert q.fp8_dtype is None
    _check_array(xp, q.rowwise_data, (M, K // 2), np.uint8)
    _check_array(xp, q.rowwise_scale, (M, K // 16), np.uint8)
    _check_array(xp, q.columnwise_data, (K, 48 // 2), np.uint8)
    _check_array(xp, q.columnwise_scale, (K, 48 // 16), np.uint8)
    _check_array(xp, q.amax_rowwise, (M,) if row_scaled else (1,), np.float32)
    _check_array(xp, q.amax_columnwise, (K,) if row_scaled else (1,), np.float32)
    assert q.row_scaled is row_scaled
    assert not q.block_2d and not q.rht and not q.stochastic_rounding and q.seed == 0
    assert q.has_rowwise and q.has_columnwise
    assert q.is_cuda == (xp is not np)
    assert q.nbytes == sum(int(a.nbytes) for a in (q.rowwise_data, q.rowwise_scale,
                                                   q.columnwise_data, q.columnwise_scale,
                                                   q.amax_rowwise, q.amax_columnwise))


@pytest.mark.parametrize("fp8_dtype", ["e4m3", "e5m2"])
def test_mxfp8_fields(xp, fp8_dtype):
    q = lpm.quantize(xp.asarray(_random((M, K))), "mxfp8", columnwise=True, fp8_dtype=fp8_dtype)
    assert q.format == "mxfp8"
    assert q.shape == (M, K)
    assert q.fp8_dtype == fp8_dtype
    _check_array(xp, q.rowwise_data, (M, K), np.uint8)
    _check_array(xp, q.rowwise_scale, (M, K // 32), np.uint8)
    _check_array(xp, q.columnwise_data, (64, K), np.uint8)
    _check_array(xp, q.columnwise_scale, (2, K), np.uint8)
    assert q.amax_rowwise is None and q.amax_columnwise is None


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_rowwise_only_and_columnwise_only(xp, fmt):
    x = xp.asarray(_random((64, K)))
    r = lpm.quantize(x, fmt)
    assert r.has_rowwise and not r.has_columnwise
    assert r.columnwise_data is None and r.columnwise_scale is None and r.amax_columnwise is None
    c = lpm.quantize(x, fmt, rowwise=False, columnwise=True)
    assert c.has_columnwise and not c.has_rowwise
    assert c.rowwise_data is None and c.rowwise_scale is None and c.amax_rowwise is None
    both = lpm.quantize(x, fmt, columnwise=True)
    assert_bytes_equal(r.rowwise_data, both.rowwise_data)
    assert_bytes_equal(c.columnwise_data, both.columnwise_data)
    assert_bytes_equal(c.columnwise_scale, both.columnwise_scale)
    with pytest.raises(ValueError, match="direction='columnwise'"):
        lpm.dequantize(r, "columnwise")
    with pytest.raises(ValueError, match="direction='rowwise'"):
        lpm.dequantize(c, "rowwise")


def test_options_are_recorded(xp):
    x = xp.asarray(_random((32, 32)).astype(ml_dtypes.bfloat16))
    q = lpm.quantize(x, "nvfp4", columnwise=True, rht=True, stochastic_rounding=True, seed=77)
    assert q.rht and q.stochastic_rounding and q.seed == 77 and not q.row_scaled
    q2 = lpm.quantize(x, "nvfp4", block_2d=True)
    assert q2.block_2d and not q2.rht


def test_frozen_and_replace_shares_arrays(xp):
    q = lpm.quantize(xp.asarray(_random((32, 32))), "nvfp4", columnwise=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        q.format = "mxfp8"
    r = q.replace(columnwise_data=None, columnwise_scale=None, amax_columnwise=None)
    assert r.rowwise_data is q.rowwise_data and not r.has_columnwise


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_dequantize_method_and_function_agree(xp, fmt):
    q = lpm.quantize(xp.asarray(_random((M, K))), fmt, columnwise=True)
    for d in ("rowwise", "columnwise"):
        for dt in ("float32", "bfloat16", "float16"):
            a = lpm.dequantize(q, d, dtype=dt)
            assert isinstance(a, xp.ndarray) and a.shape == (M, K)
            assert_bytes_equal(a, q.dequantize(d, dt), f"{d} {dt}")
    # dtype objects are accepted as well as names
    assert_bytes_equal(lpm.dequantize(q, dtype=np.float16), lpm.dequantize(q, dtype="float16"))
    assert lpm.dequantize(q, dtype=ml_dtypes.bfloat16).dtype == ml_dtypes.bfloat16


def test_dequantize_defaults_rowwise_float32(xp):
    q = lpm.quantize(xp.asarray(_random((32, 32))), "mxfp8", columnwise=True)
    a = lpm.dequantize(q)
    assert a.dtype == np.float32
    assert_bytes_equal(a, lpm.dequantize(q, "rowwise", "float32"))


# ------------------------------------------------------------------------------- swizzling
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
@pytest.mark.parametrize("direction", ["rowwise", "columnwise"])
def test_swizzle_round_trip_quantized_tensor(xp, fmt, direction):
    q = lpm.quantize(xp.asarray(_random((200, 96))), fmt, columnwise=True)
    scale = q.rowwise_scale if direction == "rowwise" else q.columnwise_scale
    transpose = fmt == "mxfp8" and direction == "columnwise"
    buf = lpm.swizzle_scales(q, direction)
    assert isinstance(buf, xp.ndarray) and buf.dtype == np.uint8 and buf.ndim == 1
    assert buf.size == L.swizzled_size(*scale.shape, transpose=transpose)
    # the same bytes as swizzling the raw matrix, and as the NumPy reference
    assert_bytes_equal(buf, lpm.swizzle_scales(scale, transpose=transpose))
    assert_bytes_equal(buf, L.swizzle_scales_np(to_host(scale), transpose=transpose))
    back = lpm.unswizzle_scales(buf, tuple(scale.shape), transpose=transpose)
    assert isinstance(back, xp.ndarray)
    assert_bytes_equal(back, scale)


def test_swizzle_missing_direction(xp):
    q = lpm.quantize(xp.asarray(_random((32, 32))), "nvfp4")
    with pytest.raises(ValueError, match="direction='columnwise'"):
        lpm.swizzle_scales(q, "columnwise")
    with pytest.raises(ValueError, match="direction=None"):
        lpm.swizzle_scales(q)


def test_public_names():
    for name in ("quantize", "dequantize", "QuantizedTensor", "GroupedTensor", "swizzle_scales",
                 "unswizzle_scales"):
        assert hasattr(lpm, name)
    fields = {f.name for f in dataclasses.fields(lpm.QuantizedTensor)}
    assert {"format", "shape", "fp8_dtype", "rowwise_data", "rowwise_scale", "columnwise_data",
            "columnwise_scale", "amax_rowwise", "amax_columnwise"} <= fields


def test_quantize_is_deterministic(xp):
    x = xp.asarray(_random((48, 64)))
    for fmt in ("nvfp4", "mxfp8"):
        assert_quantized_equal(lpm.quantize(x, fmt, columnwise=True),
                               lpm.quantize(x, fmt, columnwise=True), fmt)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_dequantize_checks_hand_built_fields(fmt):
    """A hand-built QuantizedTensor whose fields contradict its format and shape is refused
    by dequantize with a ValueError naming the field (never decoded as garbage)."""
    import dataclasses

    import lowprec_moe as lpm

    x = np.random.default_rng(0).standard_normal((32, 64)).astype(np.float32)
    q = lpm.quantize(x, fmt, columnwise=True)
    bad = [
        (dict(rowwise_scale=q.rowwise_scale[:, :-1]), "rowwise_scale.shape"),
        (dict(rowwise_data=q.rowwise_data.astype(np.int16)), "rowwise_data.dtype"),
        (dict(shape=(32, 128)), "rowwise_data.shape"),
        (dict(format="mxfp4"), "format="),
    ]
    if fmt == "nvfp4":
        bad.append((dict(amax_rowwise=None), "amax_rowwise"))
    for change, match in bad:
        with pytest.raises(ValueError, match=match):
            lpm.dequantize(dataclasses.replace(q, **change))
    with pytest.raises(ValueError, match="columnwise_scale.shape"):
        lpm.dequantize(dataclasses.replace(q, columnwise_scale=q.columnwise_scale[:, :1]),
                       "columnwise")
