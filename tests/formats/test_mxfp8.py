"""MXFP8 quantization, bit for bit (NUMERICS §3).

The public-API tests take the ``xp`` fixture; on the GPU run the CuPy result is also compared
byte for byte with the NumPy reference.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import lowprec_moe as lpm
from lowprec_moe import formats as F
from lowprec_moe.backends.numpy import fp
from lowprec_moe.backends.numpy.mxfp8 import scale_exponent

from conftest import assert_bytes_equal, assert_quantized_equal, to_host

f32 = np.float32
INV_MAX = {"e4m3": f32(1.0 / 448.0), "e5m2": f32(1.0 / 57344.0)}


def _u8(values) -> np.ndarray:
    return np.asarray(values, dtype=np.uint8)


def _quantize_both(xp, x, **kw):
    q = lpm.quantize(xp.asarray(x), "mxfp8", **kw)
    if xp is not np:
        assert_quantized_equal(q, lpm.quantize(x, "mxfp8", **kw), "gpu vs numpy")
    return q


def _random(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# ------------------------------------------------------------------------------------------
# NUMERICS transcription: exponent via frexp (not via fp32 bit fields), multiplier via ldexp.
def spec_exponent(block_amax, fp8_dtype="e4m3") -> np.ndarray:
    v = (np.asarray(block_amax, dtype=np.float32) * INV_MAX[fp8_dtype]).astype(np.float32)
    out = []
    for vi in v.astype(np.float64).ravel().tolist():
        if math.isnan(vi):
            e = 255
        elif math.isinf(vi):
            e = 254
        elif vi == 0:
            e = 0
        elif vi < 2.0 ** -126:                 # float32 subnormal
            e = 0 if vi <= 2.0 ** -127 else 1
        else:
            m, ex = math.frexp(vi)             # vi = m * 2**ex, 0.5 <= m < 1
            e = (ex - 1 + 127) if m == 0.5 else (ex + 127)   # ceil(log2(vi)) + 127
            e = min(e, 254)
        out.append(e)
    return np.array(out, dtype=np.uint8).reshape(v.shape)


def spec_quantize_blocks(blocks, e, fp8_dtype):
    """``blocks`` float32 with ``e`` broadcastable over them (uint8 exponents)."""
    mult = np.ldexp(1.0, 127 - e.astype(np.int64)).astype(np.float32)  # exact, 2^-127 included
    with np.errstate(invalid="ignore", over="ignore"):
        y = (blocks * mult).astype(np.float32)
    return fp.f32_to_fp8(y, fp8_dtype)


def spec_mxfp8(x, fp8_dtype):
    m, k = x.shape
    rb = x.reshape(m, k // 32, 32)
    er = spec_exponent(np.fmax.reduce(np.abs(rb), axis=2, initial=f32(0)), fp8_dtype)
    row = spec_quantize_blocks(rb, er[:, :, None], fp8_dtype).reshape(m, k)
    mp = -(-m // 32) * 32
    xp_ = np.zeros((mp, k), np.float32)
    xp_[:m] = x
    cb = xp_.reshape(mp // 32, 32, k)
    ec = spec_exponent(np.fmax.reduce(np.abs(cb), axis=1, initial=f32(0)), fp8_dtype)
    col = spec_quantize_blocks(cb, ec[:, None, :], fp8_dtype).reshape(mp, k)
    return row, er, col, ec


# ------------------------------------------------------------------------------ scale rule
@pytest.mark.parametrize("amax, e", [
    (448.0, 127),                     # v = 448 * fp32(1/448) = 1.0000000447 -> fp32 1.0 exactly
    (449.0, 128),                     # v = 1.0022: mantissa bits set -> ceiling
    (447.99997, 127),                 # v just below 1 -> exponent 126 + 1
    (224.0, 126),
    (225.0, 127),
    (1.0, 119),                       # v = 1/448 = 1.14 * 2^-9 -> 118 + 1
    (448.0 * 2 ** 10, 137),           # v exactly 2^10
    (448.0 * 2 ** -20, 107),          # v exactly 2^-20
    (448.0 * 2 ** -126, 1),           # v exactly 2^-126, the smallest normal
    (448.0 * 2 ** -127, 0),           # v = 2^-127 exactly (a subnormal): <= 2^-127 -> 0
    (449.0 * 2 ** -127, 1),           # subnormal v above 2^-127 -> 1
    (100.0 * 2 ** -127, 0),           # subnormal v below 2^-127 -> 0
    (1e-45, 0),                       # v underflows to 0
    (0.0, 0),
    (math.inf, 254),
    (float(F.FLT_MAX), 247),          # v = FLT_MAX/448 ~ 1.14 * 2^119 -> 247, never above 254
])
def test_scale_exponent_e4m3(amax, e):
    got = scale_exponent(np.array([amax], np.float32), "e4m3")
    assert got.dtype == np.uint8
    assert int(got[0]) == e
    assert int(spec_exponent(np.array([amax], np.float32))[0]) == e


@pytest.mark.parametrize("amax, e", [
    (57344.0, 127), (57345.0, 128), (448.0, 120), (57344.0 * 2 ** -127, 0),
    (57345.0 * 2 ** -127, 1), (math.inf, 254), (float(F.FLT_MAX), 240), (0.0, 0),
])
def test_scale_exponent_e5m2(amax, e):
    assert int(scale_exponent(np.array([amax], np.float32), "e5m2")[0]) == e


def test_scale_exponent_nan_is_255():
    assert int(scale_exponent(np.array([np.nan], np.float32))[0]) == 255


def test_scale_exponent_sweep_matches_frexp_ceiling():
    rng = np.random.default_rng(0)
    amax = np.abs(rng.standard_normal(20000) * np.exp2(rng.integers(-150, 128, 20000)))
    amax = np.concatenate([amax.astype(np.float32),
                           (448 * np.exp2(np.arange(-149, 119))).astype(np.float32)])
    for name in ("e4m3", "e5m2"):
        np.testing.assert_array_equal(scale_exponent(amax, name), spec_exponent(amax, name))


def test_scale_exponent_is_not_round_to_nearest():
    """The ceiling rule differs from ml_dtypes' e8m0 cast (round to nearest): 1.1 * 2^k."""
    v = np.float32(1.1 * 448)
    assert int(scale_exponent(np.array([v]))[0]) == 128
    assert int(np.float32(1.1).astype(ml_dtypes.float8_e8m0fnu).view(np.uint8)) == 127


# -------------------------------------------------------------------------------- golden
def test_golden_e4m3(xp):
    # block 0: amax 1792 -> v = 1792 * fp32(1/448) = 4.0000002 -> fp32 4.0 -> e = 129,
    #   multiplier 2^(127-129) = 1/4; y = x / 4:
    #   448 -> 0x7E, -448 -> 0xFE, 1 -> 0x38, 1.5 -> 0x3C, 17 (tie 16|18) -> 16 = 0x58,
    #   19 (tie 18|20) -> 20 = 0x5A, 2^-10 (tie 0|2^-9) -> 0x00, 3*2^-10 (tie 1|2 x 2^-9) ->
    #   0x02, -0.0 -> 0x80, 0 -> 0x00, 250 -> 256 = 0x78, 234 -> 240 = 0x77,
    #   232 (tie 224|240) -> 224 = 0x76
    b0 = [1792, -1792, 4, 6, 68, 76, 2.0 ** -8, 3 * 2.0 ** -8, -0.0, 0, 1000, 936, 928]
    e0 = [0x7E, 0xFE, 0x38, 0x3C, 0x58, 0x5A, 0x00, 0x02, 0x80, 0x00, 0x78, 0x77, 0x76]
    # block 1: amax 448 * 2^-127 = 7 * 2^-121 -> v = 2^-127 exactly -> e = 0, multiplier 2^127.
    #   Subnormal inputs survive: 2^-127 -> 1 = 0x38; -2^-130 -> -0.125 = 0xA0; 2^-136 -> 2^-9
    #   = 0x01.
    b1 = [7 * 2.0 ** -121, 2.0 ** -127, -(2.0 ** -130), 2.0 ** -136]
    e1 = [0x7E, 0x38, 0xA0, 0x01]
    # block 2: amax 449 -> v = 1.0022 -> e = 128, multiplier 1/2:
    #   224.5 -> 224 = 0x76, 0.5 -> 0x30, -1.5 -> 0xBC, 2^-8 -> 2 x 2^-9 = 0x02
    b2 = [449, 1, -3, 2.0 ** -7]
    e2 = [0x76, 0x30, 0xBC, 0x02]
    x = np.zeros((1, 96), np.float32)
    expected = np.zeros((1, 96), np.uint8)
    for off, b, e in ((0, b0, e0), (32, b1, e1), (64, b2, e2)):
        x[0, off:off + len(b)] = b
        expected[0, off:off + len(e)] = e
    q = _quantize_both(xp, x)
    assert_bytes_equal(q.rowwise_data, expected, "data")
    assert_bytes_equal(q.rowwise_scale, _u8([[129, 0, 128]]), "scale")


def test_golden_e5m2(xp):
    # block 0: amax 57344 -> v = 1 -> e = 127, multiplier 1:
    #   57344 -> 0x7B, 1 -> 0x3C, 1.25 -> 0x3D, 1.125 (tie 1|1.25) -> 0x3C,
    #   1.375 (tie 1.25|1.5) -> 0x3E, 2^-17 (tie 0|2^-16) -> 0, 3*2^-17 -> 2^-15 = 0x02,
    #   -0.0 -> 0x80, 2^-16 -> 0x01
    b0 = [57344, -57344, 1, 1.25, 1.125, 1.375, 2.0 ** -17, 3 * 2.0 ** -17, -0.0, 2.0 ** -16]
    e0 = [0x7B, 0xFB, 0x3C, 0x3D, 0x3C, 0x3E, 0x00, 0x02, 0x80, 0x01]
    # block 1: amax 1 -> v = 1/57344 = 1.14 * 2^-16 -> e = 127 - 16 + 1 = 112, multiplier 2^15:
    #   1 -> 2^15 = 0x78, 0.75 -> 1.5 * 2^14 = 0x76, -0.5 -> -2^14 = 0xF4, 2^-20 -> 2^-5 = 0x28
    b1 = [1, 0.75, -0.5, 2.0 ** -20]
    e1 = [0x78, 0x76, 0xF4, 0x28]
    x = np.zeros((1, 64), np.float32)
    expected = np.zeros((1, 64), np.uint8)
    x[0, :len(b0)] = b0
    x[0, 32:32 + len(b1)] = b1
    expected[0, :len(e0)] = e0
    expected[0, 32:32 + len(e1)] = e1
    q = _quantize_both(xp, x, fp8_dtype="e5m2")
    assert q.fp8_dtype == "e5m2"
    assert_bytes_equal(q.rowwise_data, expected, "data")
    assert_bytes_equal(q.rowwise_scale, _u8([[127, 112]]), "scale")


@pytest.mark.parametrize("fp8_dtype", ["e4m3", "e5m2"])
def test_random_matches_spec_transcription(xp, fp8_dtype):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((40, 64)) * np.exp2(rng.integers(-40, 40, (40, 64)))
    x = x.astype(np.float32)
    x[3, :32] *= f32(2.0 ** -110)     # subnormal elements
    x[:, 5] = 0
    q = _quantize_both(xp, x, columnwise=True, fp8_dtype=fp8_dtype)
    row, er, col, ec = spec_mxfp8(x, fp8_dtype)
    assert_bytes_equal(q.rowwise_data, row, "rowwise data")
    assert_bytes_equal(q.rowwise_scale, er, "rowwise scale")
    assert_bytes_equal(q.columnwise_data, col, "columnwise data")
    assert_bytes_equal(q.columnwise_scale, ec, "columnwise scale")


# -------------------------------------------------------------------------------- layouts
def test_rowwise_and_columnwise_layouts(xp):
    x = _random((64, 96), seed=2)
    x[:, 10] *= 1000
    q = _quantize_both(xp, x, columnwise=True)
    assert to_host(q.rowwise_data).shape == (64, 96)
    assert to_host(q.rowwise_scale).shape == (64, 3)
    assert to_host(q.columnwise_data).shape == (64, 96)       # same row-major layout as x
    assert to_host(q.columnwise_scale).shape == (2, 96)
    # columnwise = rowwise quantization of x^T, transposed back
    t = lpm.quantize(np.ascontiguousarray(x.T), "mxfp8")
    assert_bytes_equal(q.columnwise_data, np.ascontiguousarray(t.rowwise_data.T))
    assert_bytes_equal(q.columnwise_scale, np.ascontiguousarray(t.rowwise_scale.T))
    # independent quantizations: not equal in general
    assert not np.array_equal(to_host(q.rowwise_data), to_host(q.columnwise_data))


def test_columnwise_m_not_multiple_of_32(xp):
    x = _random((37, 32), seed=3)
    q = _quantize_both(xp, x, columnwise=True)
    cd = to_host(q.columnwise_data)
    assert cd.shape == (64, 32) and to_host(q.columnwise_scale).shape == (2, 32)
    assert not cd[37:].any()
    padded = np.zeros((64, 32), np.float32)
    padded[:37] = x
    qp = lpm.quantize(padded, "mxfp8", columnwise=True)
    assert_bytes_equal(cd, qp.columnwise_data)
    assert_bytes_equal(q.columnwise_scale, qp.columnwise_scale)
    got = lpm.dequantize(q, "columnwise")
    assert got.shape == (37, 32)
    assert_bytes_equal(got, lpm.dequantize(qp, "columnwise")[:37])


@pytest.mark.parametrize("fp8_dtype", ["e4m3", "e5m2"])
def test_block_2d_tiles_share_scales(xp, fp8_dtype):
    x = _random((64, 64), seed=4)
    x[40, 3] = 500.0
    q = _quantize_both(xp, x, columnwise=True, block_2d=True, fp8_dtype=fp8_dtype)
    rs, cs = to_host(q.rowwise_scale), to_host(q.columnwise_scale)
    tiles = spec_exponent(np.abs(x).reshape(2, 32, 2, 32).max(axis=(1, 3)), fp8_dtype)
    np.testing.assert_array_equal(rs, np.repeat(tiles, 32, axis=0))   # [64, 2]
    np.testing.assert_array_equal(cs, np.repeat(tiles, 32, axis=1))   # [2, 64]
    # same multiplier for every element in both directions: identical data
    assert_bytes_equal(q.rowwise_data, q.columnwise_data)
    assert_bytes_equal(q.rowwise_data, spec_quantize_blocks(
        x.reshape(2, 32, 2, 32), tiles[:, None, :, None], fp8_dtype).reshape(64, 64))


# ---------------------------------------------------------------------------- non-finite
@pytest.mark.parametrize("fp8_dtype, mx", [("e4m3", 0x7E), ("e5m2", 0x7B)])
def test_nan_and_inf_elements(xp, fp8_dtype, mx):
    x = np.zeros((2, 64), np.float32)
    # block (0, 0): NaN is skipped by the block amax (448 * 2 = 896 for e4m3 -> e = 128)
    x[0, :4] = [np.nan, 896.0 if fp8_dtype == "e4m3" else 114688.0, 1.0, -np.nan]
    # block (0, 1): +-inf -> block amax inf -> e = 254, multiplier 2^-127 -> inf saturates,
    # finite neighbours become 0 (1e30 * 2^-127 ~ 6e-9)
    x[0, 32:35] = [np.inf, -np.inf, 1e30]
    # block (1, 0): all NaN -> block amax 0 -> e = 0
    x[1, :32] = np.nan
    q = _quantize_both(xp, x, fp8_dtype=fp8_dtype)
    d, s = to_host(q.rowwise_data), to_host(q.rowwise_scale)
    assert d[0, 0] == 0x7F and d[0, 3] == 0x7F
    assert d[0, 1] == mx                                  # the amax element maps to max
    assert s[0, 0] == 128 and s[0, 1] == 254 and s[1, 0] == 0
    assert list(d[0, 32:35]) == [mx, mx | 0x80, 0]
    assert (d[1, :32] == 0x7F).all()
    row, er, _, _ = spec_mxfp8(x, fp8_dtype)
    assert_bytes_equal(d, row)
    assert_bytes_equal(s, er)


def test_zero_tensor(xp):
    q = _quantize_both(xp, np.zeros((32, 32), np.float32), columnwise=True)
    for name in ("rowwise_data", "rowwise_scale", "columnwise_data", "columnwise_scale"):
        assert not to_host(getattr(q, name)).any(), name


# ----------------------------------------------------------------------------- dequantize
@pytest.mark.parametrize("fp8_dtype", ["e4m3", "e5m2"])
def test_dequantize_formula(xp, fp8_dtype):
    """value = q * 2^(e - 127), exact in float32 (built with float64 ldexp here)."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((40, 64)) * np.exp2(rng.integers(-20, 12, (40, 64)))
    x = x.astype(np.float32)
    x[0, :32] *= f32(2.0 ** -115)   # e = 0 block: products below 2^-126
    q = _quantize_both(xp, x, columnwise=True, fp8_dtype=fp8_dtype)
    rd, rs = to_host(q.rowwise_data), to_host(q.rowwise_scale)
    qv = fp.fp8_to_f32(rd, fp8_dtype).astype(np.float64)
    expected = (qv * np.ldexp(1.0, np.repeat(rs.astype(np.int64) - 127, 32, axis=1)))
    assert_bytes_equal(lpm.dequantize(q), expected.astype(np.float32), "rowwise")
    cd, cs = to_host(q.columnwise_data), to_host(q.columnwise_scale)
    qv = fp.fp8_to_f32(cd, fp8_dtype).astype(np.float64)
    expected = qv * np.ldexp(1.0, np.repeat(cs.astype(np.int64) - 127, 32, axis=0))
    assert_bytes_equal(lpm.dequantize(q, "columnwise"), expected[:40].astype(np.float32),
                       "columnwise")
    for dt, npdt in (("bfloat16", ml_dtypes.bfloat16), ("float16", np.float16)):
        assert_bytes_equal(lpm.dequantize(q, "rowwise", dtype=dt),
                           to_host(lpm.dequantize(q)).astype(npdt), dt)


def test_dequantize_accuracy(xp):
    x = _random((32, 64), seed=6)
    q = _quantize_both(xp, x, columnwise=True)
    for d in ("rowwise", "columnwise"):
        got = to_host(lpm.dequantize(q, d))
        # E4M3 relative error <= 2^-4 for normal values; tiny values below the block's
        # subnormal range lose more, bounded by the absolute subnormal step
        np.testing.assert_allclose(got, x, rtol=2.0 ** -4, atol=2.0 ** -6)


def test_input_dtypes_and_rank3(xp):
    rng = np.random.default_rng(7)
    x = (rng.integers(-127, 128, (2, 32, 64)) * 2.0 ** -5).astype(np.float32)
    ref = _quantize_both(xp, x.reshape(64, 64), columnwise=True)
    q3 = _quantize_both(xp, x, columnwise=True)
    assert q3.shape == (64, 64)
    assert_quantized_equal(q3, ref, "rank 3")
    for dt in (ml_dtypes.bfloat16, np.float16):
        assert_quantized_equal(_quantize_both(xp, x.astype(dt), columnwise=True), ref, str(dt))
