"""Bit-exact element conversions of ``lowprec_moe.backends.numpy.fp`` (NUMERICS §1).

These are the NumPy building blocks every backend is checked against, so they are checked here
value by value: every code of every format, every rounding tie NUMERICS lists, saturation,
signed zeros, NaN and subnormals.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from lowprec_moe import formats as F
from lowprec_moe.backends.numpy import fp

f32 = np.float32


def _f32(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float32)


# ------------------------------------------------------------------------------------ E2M1
E2M1_TABLE = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
              -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def test_e2m1_decode_all_16_codes():
    got = fp.e2m1_to_f32(np.arange(16, dtype=np.uint8))
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, _f32(E2M1_TABLE))
    # code 8 is -0.0, not +0.0
    assert np.signbit(got[8]) and not np.signbit(got[0])


def test_e2m1_decode_ignores_high_nibble():
    codes = np.arange(256, dtype=np.uint8)
    np.testing.assert_array_equal(fp.e2m1_to_f32(codes), fp.e2m1_to_f32(codes & 0xF))


def test_e2m1_round_trip_all_16_codes():
    codes = np.arange(16, dtype=np.uint8)
    np.testing.assert_array_equal(fp.f32_to_e2m1(fp.e2m1_to_f32(codes)), codes)


@pytest.mark.parametrize("x, code", [
    # ties go to the even code (values in the comment)
    (0.25, 0),   # 0 | 0.5   -> 0
    (0.75, 2),   # 0.5 | 1   -> 1
    (1.25, 2),   # 1 | 1.5   -> 1
    (1.75, 4),   # 1.5 | 2   -> 2
    (2.5, 4),    # 2 | 3     -> 2
    (3.5, 6),    # 3 | 4     -> 4
    (5.0, 6),    # 4 | 6     -> 4
    # just off the ties
    (0.2500001, 1), (0.7499999, 1), (1.2500001, 3), (1.7499999, 3),
    (2.5000002, 5), (3.4999998, 5), (5.0000005, 7), (4.9999995, 6),
    # saturation
    (6.0, 7), (7.0, 7), (1e30, 7), (math.inf, 7), (float(F.FLT_MAX), 7),
    # tiny values, zero
    (0.0, 0), (1e-45, 0), (0.2, 0),
])
def test_e2m1_rounding_and_saturation(x, code):
    got = fp.f32_to_e2m1(_f32([x, -x]))
    assert got.dtype == np.uint8
    assert int(got[0]) == code, f"{x} -> {int(got[0])}, expected {code}"
    assert int(got[1]) == code | 8, f"{-x} -> {int(got[1])}, expected {code | 8}"


def test_e2m1_negative_zero_and_tiny_negative_keep_sign():
    got = fp.f32_to_e2m1(_f32([-0.0, -0.1, -1e-45, -0.25]))
    np.testing.assert_array_equal(got, [8, 8, 8, 8])


def test_e2m1_nan_gives_code_7_whatever_its_sign():
    nan_bits = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFFFFFFF], dtype=np.uint32)
    got = fp.f32_to_e2m1(nan_bits.view(np.float32))
    np.testing.assert_array_equal(got, [7, 7, 7, 7])


def test_e2m1_encode_matches_nearest_search_on_a_dense_sweep():
    """Every float32 in a dense sweep encodes to the nearest code (ties to even), sign kept."""
    mags = _f32(E2M1_TABLE[:8])
    x = np.linspace(-7, 7, 14001, dtype=np.float32)
    got = fp.f32_to_e2m1(x)
    d = np.abs(np.abs(x)[:, None] - mags[None, :])
    best = d.min(axis=1, keepdims=True)
    cands = d == best
    # among equally near codes, the even one wins (there are at most two candidates)
    even = cands & (np.arange(8)[None, :] % 2 == 0)
    mag_code = np.where(even.any(axis=1), even.argmax(axis=1), cands.argmax(axis=1))
    expected = mag_code | (np.signbit(x).astype(np.int64) << 3)
    np.testing.assert_array_equal(got, expected.astype(np.uint8))


def test_pack_unpack_fp4():
    codes = np.arange(32, dtype=np.uint8).reshape(2, 16) % 16
    packed = fp.pack_fp4(codes)
    assert packed.shape == (2, 8) and packed.dtype == np.uint8
    # even element in the low nibble
    assert int(packed[0, 0]) == 0x10 and int(packed[0, 7]) == 0xFE
    np.testing.assert_array_equal(fp.unpack_fp4(packed), codes)


# ------------------------------------------------------------------------------ E4M3 / E5M2
FP8 = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}


@pytest.mark.parametrize("name", ["e4m3", "e5m2"])
def test_fp8_decode_all_256_bytes_matches_ml_dtypes(name):
    b = np.arange(256, dtype=np.uint8)
    got = fp.fp8_to_f32(b, name)
    expected = b.view(FP8[name]).astype(np.float32)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got.view(np.uint32)[~np.isnan(expected)],
                                  expected.view(np.uint32)[~np.isnan(expected)])
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))


@pytest.mark.parametrize("name", ["e4m3", "e5m2"])
def test_fp8_encode_of_decoded_gives_the_byte_back(name):
    b = np.arange(256, dtype=np.uint8)
    vals = fp.fp8_to_f32(b, name)
    got = fp.f32_to_fp8(vals, name)
    assert got.dtype == np.uint8
    for byte, v, g in zip(b.tolist(), vals.tolist(), got.tolist()):
        if math.isnan(v):
            assert g == 0x7F, f"{name} NaN byte 0x{byte:02x} encodes to 0x{g:02x}, expected 0x7f"
        elif math.isinf(v):  # e5m2 only: inf saturates
            assert g == (0x7B if v > 0 else 0xFB), f"{name} inf byte 0x{byte:02x} -> 0x{g:02x}"
        else:
            assert g == byte, f"{name} byte 0x{byte:02x} ({v}) encodes to 0x{g:02x}"


def test_fp8_nan_bytes():
    assert [b for b in range(256) if np.isnan(fp.fp8_to_f32(np.uint8(b), "e4m3"))] == [0x7F, 0xFF]
    e5_nans = [b for b in range(256) if np.isnan(fp.fp8_to_f32(np.uint8(b), "e5m2"))]
    assert e5_nans == [0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF]


@pytest.mark.parametrize("x, byte", [
    (448.0, 0x7E),
    (464.0, 0x7E),    # tie between 448 (mantissa 110) and 480 (111, the NaN pattern): RNE -> 448
    (480.0, 0x7E),
    (500.0, 0x7E),
    (1e30, 0x7E),
    (float(F.FLT_MAX), 0x7E),
    (math.inf, 0x7E),
    (432.0, 0x7E),    # tie between 416 (101) and 448 (110): even -> 448
    (431.0, 0x7D),    # below the tie -> 416
    (240.0, 0x77),
    (1.0, 0x38),
    (2.0 ** -9, 0x01),            # smallest subnormal
    (2.0 ** -10, 0x00),           # tie between 0 and 2^-9 -> 0
    (2.0 ** -10 * 1.0001, 0x01),  # just above the tie
    (3 * 2.0 ** -11, 0x01),       # 0.75 * 2^-9 -> 2^-9
    (3 * 2.0 ** -10, 0x02),       # tie between 1 and 2 (x 2^-9) -> 2
    (5 * 2.0 ** -10, 0x02),       # tie between 2 and 3 (x 2^-9) -> 2
    (15 * 2.0 ** -10, 0x08),      # tie between 7 x 2^-9 and 2^-6 (0x08) -> 0x08
    (0.0, 0x00),
])
def test_e4m3_rounding_and_saturation(x, byte):
    got = fp.f32_to_fp8(_f32([x, -x]), "e4m3")
    assert int(got[0]) == byte, f"{x} -> 0x{int(got[0]):02x}, expected 0x{byte:02x}"
    assert int(got[1]) == byte | 0x80, f"{-x} -> 0x{int(got[1]):02x}, expected 0x{byte | 0x80:02x}"


@pytest.mark.parametrize("x, byte", [
    (57344.0, 0x7B),
    (61440.0, 0x7B),    # tie with 65536 (= inf): satfinite
    (65536.0, 0x7B),
    (1e30, 0x7B),
    (math.inf, 0x7B),
    (1.0, 0x3C),
    (1.125, 0x3C),      # tie between 1 (00) and 1.25 (01) -> 1
    (1.375, 0x3E),      # tie between 1.25 (01) and 1.5 (10) -> 1.5
    (2.0 ** -16, 0x01),
    (2.0 ** -17, 0x00),  # tie -> 0
    (3 * 2.0 ** -17, 0x02),
])
def test_e5m2_rounding_and_saturation(x, byte):
    got = fp.f32_to_fp8(_f32([x, -x]), "e5m2")
    assert int(got[0]) == byte, f"{x} -> 0x{int(got[0]):02x}, expected 0x{byte:02x}"
    assert int(got[1]) == byte | 0x80, f"{-x} -> 0x{int(got[1]):02x}, expected 0x{byte | 0x80:02x}"


@pytest.mark.parametrize("name", ["e4m3", "e5m2"])
def test_fp8_nan_and_negative_zero(name):
    x = np.array([0x7FC00000, 0xFFC00000], dtype=np.uint32).view(np.float32)
    np.testing.assert_array_equal(fp.f32_to_fp8(x, name), [0x7F, 0x7F])
    assert int(fp.f32_to_fp8(_f32([-0.0]), name)[0]) == 0x80


@pytest.mark.parametrize("name", ["e4m3", "e5m2"])
def test_fp8_encode_matches_ml_dtypes_inside_the_range(name):
    """Inside +-max (no overflow) our RNE encoder equals ml_dtypes' cast."""
    rng = np.random.default_rng(0)
    mx = F.fp8_max(name)
    x = np.concatenate([rng.uniform(-mx, mx, 4000), rng.standard_normal(4000) * 2.0 ** -8,
                        rng.standard_normal(2000) * 2.0 ** -14]).astype(np.float32)
    np.testing.assert_array_equal(fp.f32_to_fp8(x, name), x.astype(FP8[name]).view(np.uint8))


# ------------------------------------------------------------------------------------ E8M0
def test_e8m0_decode_all_256_codes():
    codes = np.arange(256, dtype=np.uint8)
    got = fp.e8m0_to_f32(codes)
    assert got.dtype == np.float32
    for e in range(255):
        assert float(got[e]) == 2.0 ** (e - 127), f"code {e} -> {float(got[e])}"
    assert float(got[0]) == 2.0 ** -127  # a subnormal float32, not zero
    assert np.isnan(got[255])
    # and ml_dtypes agrees
    ref = codes.view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    np.testing.assert_array_equal(got[:255], ref[:255])


def test_e8m0_inverse_all_codes():
    codes = np.arange(256, dtype=np.uint8)
    got = fp.e8m0_inverse_f32(codes)
    for e in range(255):
        assert float(got[e]) == 2.0 ** (127 - e), f"code {e} -> {float(got[e])}"
    assert float(got[254]) == 2.0 ** -127
    assert np.isnan(got[255])


# ---------------------------------------------------------------------------------- f64->bf16
def _bf16_f64(x) -> list[float]:
    return fp.f64_to_bf16(np.asarray(x, dtype=np.float64)).astype(np.float64).tolist()


def test_f64_to_bf16_single_rounding_vs_double_rounding():
    x = 1 + 2.0 ** -8 + 2.0 ** -30
    # double rounding through float32 lands on the tie 1 + 2^-8 and goes to even (1.0) ...
    assert float(np.float32(x).astype(ml_dtypes.bfloat16)) == 1.0
    # ... a single rounding of the float64 value goes up
    assert _bf16_f64([x, -x]) == [1 + 2.0 ** -7, -(1 + 2.0 ** -7)]


def test_f64_to_bf16_ties_to_even():
    # bf16 has 8 significant bits: spacing 2^-7 in [1, 2)
    assert _bf16_f64([1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, 1 + 2.0 ** -8 - 2.0 ** -40]) == \
        [1.0, 1 + 2.0 ** -6, 1.0]


def test_f64_to_bf16_subnormals():
    tiny = 2.0 ** -133  # smallest bf16 subnormal
    got = _bf16_f64([tiny, 2.0 ** -134, 2.0 ** -134 + 2.0 ** -160, 3 * 2.0 ** -134,
                     5 * 2.0 ** -134, 2.0 ** -140, 127 * tiny, 2.0 ** -126 - 2.0 ** -134])
    assert got == [tiny, 0.0, tiny, 2 * tiny, 2 * tiny, 0.0, 127 * tiny, 2.0 ** -126]
    neg = fp.f64_to_bf16(np.array([-(2.0 ** -134)]))
    assert float(neg[0]) == 0.0 and np.signbit(neg[0].astype(np.float32))


def test_f64_to_bf16_overflow():
    bmax = float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)  # (2 - 2^-7) * 2^127
    half_ulp = 2.0 ** 119
    got = _bf16_f64([bmax, bmax + half_ulp * 0.99, bmax + half_ulp, 1e300, -1e300,
                     math.inf, -math.inf, float(F.FLT_MAX)])
    assert got == [bmax, bmax, math.inf, math.inf, -math.inf, math.inf, -math.inf, math.inf]
    assert np.isnan(fp.f64_to_bf16(np.array([math.nan]))).all()


def test_f64_to_bf16_matches_float32_cast_when_exact_in_float32():
    """For float64 values exactly representable in float32 there is no double rounding."""
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(5000) * np.exp2(rng.integers(-140, 120, 5000))).astype(np.float32)
    got = fp.f64_to_bf16(x.astype(np.float64))
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(got.view(np.uint16), x.astype(ml_dtypes.bfloat16).view(np.uint16))


# --------------------------------------------------------------------- fast encoders, bf16 bits
def _sweep() -> np.ndarray:
    """Every float32 whose low 16 bits are one of a few patterns: every exponent and sign, the
    top 7 mantissa bits in full, exact ties (low bits 0 and 0x8000) and their neighbours."""
    high = np.arange(1 << 16, dtype=np.uint32) << 16
    low = np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF], dtype=np.uint32)
    return (high[:, None] | low[None, :]).reshape(-1).view(np.float32)


def _same_or_both_nan_code(got, expected):
    np.testing.assert_array_equal(got, expected)
    assert got.dtype == np.uint8


def test_f32_to_e2m1_fast_equals_reference_on_a_bit_sweep():
    x = _sweep()
    _same_or_both_nan_code(fp.f32_to_e2m1_fast(x), fp.f32_to_e2m1(x))
    finite = x[~np.isnan(x)]
    _same_or_both_nan_code(fp.f32_to_e2m1_fast(finite, nan_free=True), fp.f32_to_e2m1(finite))


@pytest.mark.parametrize("name", ["e4m3", "e5m2"])
def test_f32_to_fp8_fast_equals_reference_on_a_bit_sweep(name):
    x = _sweep()
    _same_or_both_nan_code(fp.f32_to_fp8_fast(x, name), fp.f32_to_fp8(x, name))
    finite = x[~np.isnan(x)]
    _same_or_both_nan_code(fp.f32_to_fp8_fast(finite, name, nan_free=True),
                           fp.f32_to_fp8(finite, name))


def test_fast_encoders_keep_shape_and_input():
    x = _f32([[0.25, -0.75, np.nan], [5.0, -0.0, 1e-45]])
    before = x.copy()
    np.testing.assert_array_equal(fp.f32_to_e2m1_fast(x), [[0, 10, 7], [6, 8, 0]])
    np.testing.assert_array_equal(x.view(np.uint32), before.view(np.uint32))
    assert fp.f32_to_fp8_fast(x, "e4m3").shape == (2, 3)
    assert int(fp.f32_to_e2m1_fast(np.float32(-3.5))) == 14
    with pytest.raises(ValueError, match="fp8_dtype"):
        fp.f32_to_fp8_fast(x, "e3m4")


def test_pack_fp4_into_equals_pack_fp4():
    codes = np.random.default_rng(0).integers(0, 16, (7, 48)).astype(np.uint8)
    out = np.empty((7, 24), np.uint8)
    fp.pack_fp4_into(codes.reshape(-1), out.reshape(-1), np.empty(out.size, np.uint16))
    np.testing.assert_array_equal(out, fp.pack_fp4(codes))


def test_bf16_bits_upcast_equals_ml_dtypes_for_every_pattern():
    bits = np.arange(1 << 16, dtype=np.uint16)
    expected = bits.view(ml_dtypes.bfloat16).astype(np.float32).view(np.uint32)
    np.testing.assert_array_equal(fp.bf16_bits_to_f32(bits).view(np.uint32), expected)
    np.testing.assert_array_equal(fp.as_float32(bits.view(ml_dtypes.bfloat16)).view(np.uint32),
                                  expected)


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16, np.float32])
def test_magnitude_bits_order_like_magnitudes(dtype):
    x = np.array([0.0, -0.0, 1e-3, -2.5, 3.0, -np.inf, np.inf, np.nan], dtype=dtype)
    mag, inf = fp.magnitude_bits(x)
    finite = np.abs(x[:5].astype(np.float32))
    assert (mag[:5].argsort(kind="stable") == finite.argsort(kind="stable")).all()
    assert mag[5] == mag[6] == inf and mag[7] > inf
