"""NVFP4 quantization, bit for bit (NUMERICS §2).

Tests that go through the public API take the ``xp`` fixture: the NumPy run checks the reference
against hand-worked bytes and against a transcription of NUMERICS formulas; the CuPy run checks
the GPU kernels against the same bytes and against the NumPy reference. RHT and stochastic
rounding: ``test_nvfp4_rht_sr.py``.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import lowprec_moe as lpm
from lowprec_moe import formats as F
from lowprec_moe.tensors.quantized_tensor import _quantize_2d
from lowprec_moe.backends.numpy import fp

from conftest import assert_bytes_equal, assert_quantized_equal, to_host

f32 = np.float32
FLT_MAX = f32(F.FLT_MAX)
ONE_SIXTH = f32(1.0 / 6.0)                # fp32(1/6) == 0x3E2AAAAB
INV_2688 = f32(1.0 / 2688.0)              # fp32(1/2688), correctly rounded

_GRID = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float32)
#: the 16 E2M1 values in code order (code 8 is -0.0)
GRID16 = np.concatenate([_GRID, -_GRID])
#: bytes of the 16 codes 0..15 packed in order: (0,1) (2,3) ... (14,15)
GRID16_BYTES = [0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE]


def _u8(values) -> np.ndarray:
    return np.asarray(values, dtype=np.uint8)


def _quantize_both(xp, x, fmt="nvfp4", **kw):
    """Quantize on the backend under test; on the GPU also check it against the NumPy result."""
    q = lpm.quantize(xp.asarray(x), fmt, **kw)
    if xp is not np:
        assert_quantized_equal(q, lpm.quantize(x, fmt, **kw), "gpu vs numpy")
    return q


def _codes(data) -> np.ndarray:
    return fp.unpack_fp4(to_host(data))


# ------------------------------------------------------------------------------------------
# A transcription of NUMERICS formulas (scalar global scale or one per row), used to check
# random data. Plain float32 NumPy arithmetic; no code shared with the reference except the
# element encoders tested in test_fp.py.
def spec_s_enc(amax):
    amax = np.asarray(amax, dtype=np.float32)
    with np.errstate(divide="ignore", over="ignore"):
        s_enc = np.minimum(f32(2688) / amax, FLT_MAX)
    return np.where((amax == 0) | (s_enc == 0), f32(1), s_enc).astype(np.float32)


def spec_quantize_rows(a, amax, sr_bits=None):
    """Quantize the rows of float32 ``a`` [R, C] with global amax (shape (1,) or (R,))."""
    a = np.asarray(a, dtype=np.float32)
    rows, cols = a.shape
    s_enc = spec_s_enc(amax).reshape(-1, 1, 1)
    s_dec = (f32(1) / s_enc).astype(np.float32)
    blocks = a.reshape(rows, cols // 16, 16)
    bamax = np.fmax.reduce(np.abs(blocks), axis=2, initial=f32(0), keepdims=True)
    with np.errstate(over="ignore"):
        s = np.minimum((bamax * (s_enc * ONE_SIXTH).astype(np.float32)).astype(np.float32),
                       FLT_MAX)
    scale = fp.f32_to_fp8(s, "e4m3")
    with np.errstate(divide="ignore", over="ignore"):
        enc = np.minimum((f32(1) / (fp.e4m3_to_f32(scale) * s_dec)).astype(np.float32), FLT_MAX)
    with np.errstate(invalid="ignore", over="ignore"):
        y = (blocks * enc).astype(np.float32).reshape(rows, cols)
    if sr_bits is None:
        codes = fp.f32_to_e2m1(y)
    else:
        codes = np.array([[_sr_code(float(v), int(r)) for v, r in zip(yr, br)]
                          for yr, br in zip(y, sr_bits)], dtype=np.uint8)
    return fp.pack_fp4(codes), scale.reshape(rows, cols // 16), y


def _step(v: float) -> float:
    return 0.5 if v < 2 else (1.0 if v < 4 else 2.0)


def _sr_code(y: float, r: int) -> int:
    """NUMERICS §2.4, one element, in Python floats (exact for these magnitudes)."""
    if math.isnan(y):
        return 7
    a = abs(y)
    t = a + ((r & 0xFF) / 256.0) * _step(a)
    st = _step(t)
    q = min(math.floor(t / st) * st, 6.0) if not math.isinf(t) else 6.0
    code = int(fp.f32_to_e2m1(np.float32(q)))
    return code | (8 if math.copysign(1.0, y) < 0 else 0)


def _padded_t(x, block=16) -> np.ndarray:
    """``x^T`` as float32 with its columns zero-padded to a multiple of ``block``."""
    m, k = x.shape
    out = np.zeros((k, -(-m // block) * block), np.float32)
    out[:, :m] = np.asarray(x, dtype=np.float32).T
    return out


def _random(shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


# ------------------------------------------------------------------------------------------
# Golden table, worked by hand from NUMERICS formulas.
def test_golden_s_enc_one(xp):
    """One row, five blocks, tensor amax 2688 so that S_enc = 2688/2688 = 1 and S_dec = 1.

    The block scale is then s = block_amax * fp32(1/6) and enc = 1/scale.
    """
    # A: 448 * grid. s = 2688 * fp32(1/6) = 448.0000133 -> fp32 448 -> E4M3 0x7E (448).
    #    enc = fp32(1/448); y = x / 448 ~ grid -> codes 0..15.
    block_a = GRID16 * 448
    # B: block amax 12. s = 12 * fp32(1/6) = 2.00000006 -> fp32 2.0 -> E4M3 0x40; enc = 0.5.
    #    y = [6, .25, .75, 1.25, 1.75, 2.5, 3.5, 5] -> the E2M1 ties -> [6, 0, 1, 1, 2, 2, 4, 4]
    #    codes [7, 0, 2, 2, 4, 4, 6, 6], negated: [15, 8, 10, 10, 12, 12, 14, 14].
    half = np.array([12, 0.5, 1.5, 2.5, 3.5, 5, 7, 10], dtype=np.float32)
    block_b = np.concatenate([half, -half])
    bytes_b = [0x07, 0x22, 0x44, 0x66, 0x8F, 0xAA, 0xCC, 0xEE]
    # C: block amax 51. s = 51 * fp32(1/6) = 8.50000025 -> fp32 rounds to exactly 8.5, an E4M3
    #    tie between 8 (0x50) and 9 (0x51) -> even -> 0x50; enc = 1/8.
    #    y = [6.375 .125 .25 .5 .75 1 1.5 2.5 3.5 4.5 5.5 -.375 -1.25 -3 -5 0]
    #    codes [7 0 0 1 2 2 3 4 6 6 7 9 10 13 14 0]
    block_c = np.array([51, 1, 2, 4, 6, 8, 12, 20, 28, 36, 44, -3, -10, -24, -40, 0],
                       dtype=np.float32)
    bytes_c = [0x07, 0x10, 0x22, 0x43, 0x66, 0x97, 0xDA, 0x0E]
    # D: block amax 5 * 2^-9. s = 0.8333 * 2^-9 -> E4M3 subnormal 1 * 2^-9 (0x01); enc = 512.
    #    y = [5 -5 .5 .75 1.5 2.25 3 -.25 4.5 1 0...] -> codes [6 14 1 2 3 4 5 8 6 2 0 ...]
    block_d = np.array([5, -5, .5, .75, 1.5, 2.25, 3, -.25, 4.5, 1, 0, 0, 0, 0, 0, 0],
                       dtype=np.float32) * f32(2.0 ** -9)
    bytes_d = [0xE6, 0x21, 0x43, 0x85, 0x26, 0x00, 0x00, 0x00]
    # E: block amax 2^-12. s = 4.1e-5 < 2^-10 -> E4M3 0x00, enc = min(1/0, FLT_MAX) = FLT_MAX.
    #    Nonzero elements saturate, including subnormal inputs (no flush-to-zero):
    #    2^-129 * FLT_MAX = 0.49999997 -> 0.5 (code 1); 2^-149 * FLT_MAX ~ 2^-21 -> 0.
    #    x = [2^-12 -2^-12 2^-20 0 -0 2^-129 -2^-129 2^-149 -2^-149 0...]
    #    codes [7 15 7 0 8 1 9 0 8 0 ...]
    block_e = np.array([2.0 ** -12, -2.0 ** -12, 2.0 ** -20, 0.0, -0.0, 2.0 ** -129,
                        -2.0 ** -129, 2.0 ** -149, -2.0 ** -149] + [0.0] * 7, dtype=np.float32)
    bytes_e = [0xF7, 0x07, 0x18, 0x09, 0x08, 0x00, 0x00, 0x00]

    x = np.concatenate([block_a, block_b, block_c, block_d, block_e])[None, :]
    q = _quantize_both(xp, x)
    assert_bytes_equal(q.rowwise_data, _u8([GRID16_BYTES + bytes_b + bytes_c + bytes_d + bytes_e]),
                       "data")
    assert_bytes_equal(q.rowwise_scale, _u8([[0x7E, 0x40, 0x50, 0x01, 0x00]]), "scale")
    assert_bytes_equal(q.amax_rowwise, np.array([2688], np.float32), "amax")
    # NUMERICS transcription agrees
    d, s, _ = spec_quantize_rows(x, np.array([2688], np.float32))
    assert_bytes_equal(q.rowwise_data, d)
    assert_bytes_equal(q.rowwise_scale, s)


def test_golden_grid_times_k(xp):
    """Blocks grid, grid/2, grid/4: amax 6, S_enc = 2688 / 6 = 448 exactly.

    S_enc * fp32(1/6) = 448 * 0.16666667 = 74.66666889 -> fp32 74.66667175 (0x42955556).
    s = 6 * 74.66667175 = 448.00003 -> E4M3 0x7E (448); 3 * ... = 224.00002 -> 0x76 (224);
    1.5 * ... = 112.00001 -> 0x6E (112). enc ~ 1, 2, 4: every block encodes to codes 0..15.
    """
    assert (f32(448) * ONE_SIXTH).view(np.uint32) == 0x42955556
    x = np.concatenate([GRID16, GRID16 * 0.5, GRID16 * 0.25])[None, :]
    q = _quantize_both(xp, x)
    assert_bytes_equal(q.rowwise_data, _u8([GRID16_BYTES * 3]))
    assert_bytes_equal(q.rowwise_scale, _u8([[0x7E, 0x76, 0x6E]]))
    assert_bytes_equal(q.amax_rowwise, np.array([6], np.float32))
    # the same values scaled by 2^k (k = -20 .. 20) give the same bytes: S_enc absorbs 2^k
    for k in (-20, -3, 7, 20):
        qk = _quantize_both(xp, x * f32(2.0 ** k))
        assert_bytes_equal(qk.rowwise_data, q.rowwise_data, f"2^{k}")
        assert_bytes_equal(qk.rowwise_scale, q.rowwise_scale, f"2^{k}")


def test_golden_subnormal_s_dec(xp):
    """amax = 6 * 2^-118: S_enc = 7 * 2^124 (normal), S_dec = 1/S_enc ~ 1.14 * 2^-127 is a
    float32 subnormal (4793490 * 2^-149). With flush-to-zero S_dec would be 0 and every nonzero
    element would saturate; without it, enc ~ 2^118 and the grid comes back exactly."""
    x = (GRID16 * f32(2.0 ** -118))[None, :]
    s_enc = spec_s_enc(np.array([6 * 2.0 ** -118], np.float32))
    assert float(s_enc[0]) == 7 * 2.0 ** 124
    assert int((f32(1) / s_enc).view(np.uint32)[0]) == 4793490  # subnormal bits
    q = _quantize_both(xp, x)
    assert_bytes_equal(q.rowwise_data, _u8([GRID16_BYTES]))
    assert_bytes_equal(q.rowwise_scale, _u8([[0x7E]]))


def test_golden_tiny_amax_s_enc_saturates(xp):
    """amax = fp32(1e-40) (subnormal): 2688 / amax = inf -> S_enc = FLT_MAX, S_dec = 2^-128.

    s = 1e-40 * (FLT_MAX * fp32(1/6)) = 0.00567 = 2.9 * 2^-9 -> E4M3 subnormal 3 * 2^-9 (0x03).
    enc = 1 / (3 * 2^-9 * 2^-128) = 5.8e40 -> inf -> FLT_MAX; y = 1e-40 * FLT_MAX = 0.034 -> 0.
    So the codes are (signed) zeros: [1e-40, -1e-40] -> (0, 8) -> byte 0x80.
    """
    x = np.array([[1e-40, -1e-40, 5e-41] + [0.0] * 13], dtype=np.float32)
    assert float(spec_s_enc(np.float32(1e-40))) == F.FLT_MAX
    q = _quantize_both(xp, x)
    assert_bytes_equal(q.rowwise_data, _u8([[0x80] + [0] * 7]))
    assert_bytes_equal(q.rowwise_scale, _u8([[0x03]]))
    assert_bytes_equal(q.amax_rowwise, np.array([1e-40], np.float32))


def test_golden_huge_amax(xp):
    """amax = fp32(3e38): S_enc = 2688 / 3e38 = 8.96e-36 (normal); s = 448 -> 0x7E;
    enc = 1 / (448 * S_dec) ~ 2e-38; y = [6, -6, 2, 1] -> codes [7, 15, 4, 2]."""
    x = np.array([[3e38, -3e38, 1e38, 5e37] + [0.0] * 12], dtype=np.float32)
    q = _quantize_both(xp, x)
    assert_bytes_equal(q.rowwise_data, _u8([[0xF7, 0x24] + [0] * 6]))
    assert_bytes_equal(q.rowwise_scale, _u8([[0x7E]]))
    assert_bytes_equal(q.amax_rowwise, np.array([3e38], np.float32))


def test_zero_blocks_and_zero_tensor(xp):
    x = np.zeros((4, 32), np.float32)
    q = _quantize_both(xp, x, columnwise=True)
    for name in ("rowwise_data", "rowwise_scale", "columnwise_data", "columnwise_scale"):
        assert not to_host(getattr(q, name)).any(), name
    assert_bytes_equal(q.amax_rowwise, np.zeros(1, np.float32))
    assert float(spec_s_enc(np.float32(0))) == 1.0  # S_enc = 1 for the zero tensor
    # -0.0 keeps its sign: code 8 everywhere
    qn = _quantize_both(xp, -x)
    assert (to_host(qn.rowwise_data) == 0x88).all()
    assert not to_host(qn.rowwise_scale).any()
    # a zero block next to a nonzero one
    x2 = np.concatenate([np.zeros(16, np.float32), GRID16])[None, :]
    q2 = _quantize_both(xp, x2)
    assert_bytes_equal(q2.rowwise_data, _u8([[0] * 8 + GRID16_BYTES]))
    assert_bytes_equal(q2.rowwise_scale, _u8([[0x00, 0x7E]]))


def test_infinities(xp):
    """amax = inf -> 2688/inf = 0 -> S_enc = 1. The block holding inf: s = min(inf, FLT_MAX)
    -> E4M3 satfinite 448 (0x7E), enc = fp32(1/448): inf -> code 7, -inf -> 15, 100/448 -> 0.
    The other block is block B of the S_enc = 1 golden."""
    half = np.array([12, 0.5, 1.5, 2.5, 3.5, 5, 7, 10], dtype=np.float32)
    x = np.concatenate([[np.inf, 100, -np.inf] + [0] * 13, half, -half]).astype(np.float32)[None]
    q = _quantize_both(xp, x, columnwise=True)
    assert_bytes_equal(q.rowwise_data, _u8([[0x07, 0x0F, 0, 0, 0, 0, 0, 0,
                                             0x07, 0x22, 0x44, 0x66, 0x8F, 0xAA, 0xCC, 0xEE]]))
    assert_bytes_equal(q.rowwise_scale, _u8([[0x7E, 0x40]]))
    assert float(to_host(q.amax_rowwise)[0]) == math.inf
    assert float(to_host(q.amax_columnwise)[0]) == math.inf
    assert float(spec_s_enc(np.float32(np.inf))) == 1.0


def test_nan_ignored_by_amax_and_encodes_to_code_7(xp):
    """NaN is skipped by amax (amax = 6, S_enc = 448 as in the grid golden) and gives code 7.
    An all-NaN block has block amax 0 -> scale 0x00 -> enc = FLT_MAX, codes 7."""
    row = GRID16.copy()
    row[3] = np.nan           # code 3 -> 7
    row[12] = -np.nan         # code 12 -> 7 (the sign of a NaN is not kept)
    x = np.concatenate([row, np.full(16, np.nan, np.float32)])[None, :]
    q = _quantize_both(xp, x)
    expected = list(GRID16_BYTES)
    expected[1] = 0x72      # codes (2, 7)
    expected[6] = 0xD7      # codes (7, 13)
    assert_bytes_equal(q.rowwise_data, _u8([expected + [0x77] * 8]))
    assert_bytes_equal(q.rowwise_scale, _u8([[0x7E, 0x00]]))
    assert_bytes_equal(q.amax_rowwise, np.array([6], np.float32))
    # an all-NaN tensor: amax 0, S_enc 1, everything code 7
    qn = _quantize_both(xp, np.full((2, 16), np.nan, np.float32), columnwise=True)
    assert_bytes_equal(qn.amax_rowwise, np.zeros(1, np.float32))
    assert (to_host(qn.rowwise_data) == 0x77).all()
    assert (_codes(qn.columnwise_data)[:, :2] == 7).all()


@pytest.mark.parametrize("seed", [0, 1])
def test_random_matches_spec_transcription(xp, seed):
    """Random data over a wide dynamic range (including subnormal elements) vs NUMERICS."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((8, 64)) * np.exp2(rng.integers(-30, 30, (8, 64)))).astype(np.float32)
    x[0, :16] = rng.standard_normal(16).astype(np.float32) * f32(1e-39)  # subnormal block
    x[1, 16:32] = 0.0
    q = _quantize_both(xp, x, columnwise=True)
    amax = np.array([np.abs(x).max()], np.float32)
    d, s, _ = spec_quantize_rows(x, amax)
    assert_bytes_equal(q.rowwise_data, d, "rowwise data")
    assert_bytes_equal(q.rowwise_scale, s, "rowwise scale")
    d, s, _ = spec_quantize_rows(_padded_t(x), amax)
    assert_bytes_equal(q.columnwise_data, d, "columnwise data")
    assert_bytes_equal(q.columnwise_scale, s, "columnwise scale")


# ------------------------------------------------------------------------------- row-scaled
def test_row_scaled_with_zero_row(xp):
    x = _random((32, 48), seed=3)
    x[5] = 0.0
    x[:, 7] *= 100
    q = _quantize_both(xp, x, row_scaled=True, columnwise=True)
    amax_r, amax_c = to_host(q.amax_rowwise), to_host(q.amax_columnwise)
    assert amax_r.shape == (32,) and amax_c.shape == (48,)
    assert amax_r.dtype == np.float32 and amax_c.dtype == np.float32
    np.testing.assert_array_equal(amax_r, np.abs(x).max(axis=1))
    np.testing.assert_array_equal(amax_c, np.abs(x).max(axis=0))
    assert amax_r[5] == 0
    assert not to_host(q.rowwise_data)[5].any() and not to_host(q.rowwise_scale)[5].any()
    d, s, _ = spec_quantize_rows(x, amax_r)
    assert_bytes_equal(q.rowwise_data, d)
    assert_bytes_equal(q.rowwise_scale, s)
    d, s, _ = spec_quantize_rows(np.ascontiguousarray(x.T), amax_c)
    assert_bytes_equal(q.columnwise_data, d)
    assert_bytes_equal(q.columnwise_scale, s)
    # row i of a row-scaled tensor is the per-tensor quantization of that row alone
    for i in (0, 5, 31):
        qi = lpm.quantize(x[i:i + 1], "nvfp4")
        assert_bytes_equal(to_host(q.rowwise_data)[i:i + 1], qi.rowwise_data, f"row {i}")
        assert_bytes_equal(to_host(q.rowwise_scale)[i:i + 1], qi.rowwise_scale, f"row {i}")


# ------------------------------------------------------------------------------- columnwise
def test_per_tensor_amax_is_shared(xp):
    x = _random((32, 64), seed=4)
    q = _quantize_both(xp, x, columnwise=True)
    assert_bytes_equal(q.amax_rowwise, q.amax_columnwise)
    assert_bytes_equal(q.amax_rowwise, np.array([np.abs(x).max()], np.float32))


def test_columnwise_is_independent_quantization_of_transpose(xp):
    x = _random((48, 32), seed=5)
    x[:, 3] *= 50   # make column and row blocks see different block amaxes
    q = _quantize_both(xp, x, columnwise=True)
    assert to_host(q.columnwise_data).shape == (32, 24)
    assert to_host(q.columnwise_scale).shape == (32, 3)
    by_hand = lpm.quantize(np.ascontiguousarray(x.T), "nvfp4")  # same amax: max |x^T| = max |x|
    assert_bytes_equal(q.columnwise_data, by_hand.rowwise_data)
    assert_bytes_equal(q.columnwise_scale, by_hand.rowwise_scale)
    # in general the two copies are not transposes of each other
    assert not np.array_equal(_codes(q.columnwise_data), _codes(q.rowwise_data).T)


def test_columnwise_m_not_multiple_of_16_is_zero_padded(xp):
    x = _random((5, 32), seed=6)
    q = _quantize_both(xp, x, columnwise=True)
    cd, cs = to_host(q.columnwise_data), to_host(q.columnwise_scale)
    assert cd.shape == (32, 8) and cs.shape == (32, 1)
    assert not _codes(cd)[:, 5:].any()
    padded = np.zeros((16, 32), np.float32)
    padded[:5] = x
    qp = lpm.quantize(padded, "nvfp4", columnwise=True)
    assert_bytes_equal(cd, qp.columnwise_data)
    assert_bytes_equal(cs, qp.columnwise_scale)
    xh = to_host(lpm.dequantize(q, "columnwise"))
    assert xh.shape == (5, 32)
    np.testing.assert_array_equal(xh, lpm.dequantize(qp, "columnwise")[:5])


def test_columnwise_only(xp):
    x = _random((16, 32), seed=7)
    q = _quantize_both(xp, x, rowwise=False, columnwise=True)
    assert q.rowwise_data is None and q.rowwise_scale is None and q.amax_rowwise is None
    full = lpm.quantize(x, "nvfp4", columnwise=True)
    assert_bytes_equal(q.columnwise_data, full.columnwise_data)
    assert_bytes_equal(q.amax_columnwise, full.amax_columnwise)


# -------------------------------------------------------------------------------- 2-D blocks
def test_block_2d_columnwise_is_rowwise_transposed(xp):
    x = _random((32, 64), seed=8)
    x[3, 40] = 30.0
    q = _quantize_both(xp, x, columnwise=True, block_2d=True)
    np.testing.assert_array_equal(_codes(q.columnwise_data), _codes(q.rowwise_data).T)
    rs, cs = to_host(q.rowwise_scale), to_host(q.columnwise_scale)
    # one scale per 16x16 tile, repeated over its 16 rows (rowwise) and 16 columns (columnwise)
    tiles = rs[::16]                                    # [M/16, K/16]
    np.testing.assert_array_equal(rs, np.repeat(tiles, 16, axis=0))
    np.testing.assert_array_equal(cs, np.repeat(tiles.T, 16, axis=0))
    # tile scale = E4M3(tile_amax * (S_enc * fp32(1/6)))
    s_enc = spec_s_enc(np.abs(x).max())
    tile_amax = np.abs(x).reshape(2, 16, 4, 16).max(axis=(1, 3))
    np.testing.assert_array_equal(tiles, fp.f32_to_fp8(tile_amax * (s_enc * ONE_SIXTH), "e4m3"))
    assert rs[0, 2] == 0x7E  # the tile holding the amax


# -------------------------------------------------------------------------------- dequantize
@pytest.mark.parametrize("row_scaled", [False, True])
def test_dequantize_formula(xp, row_scaled):
    """value = e2m1(code) * ((float(scale) * amax) * fp32(1/2688)), float32, then cast once."""
    assert INV_2688.view(np.uint32) == F.FP32_INV_NVFP4_AMAX_DIVISOR_BITS
    x = _random((32, 48), seed=17) * 7
    q = _quantize_both(xp, x, columnwise=True, row_scaled=row_scaled)
    for direction in ("rowwise", "columnwise"):
        col = direction == "columnwise"
        data = to_host(q.columnwise_data if col else q.rowwise_data)
        scale = to_host(q.columnwise_scale if col else q.rowwise_scale)
        amax = to_host(q.amax_columnwise if col else q.amax_rowwise).reshape(-1, 1)
        fac = ((fp.e4m3_to_f32(scale) * amax).astype(np.float32) * INV_2688).astype(np.float32)
        vals = fp.e2m1_to_f32(fp.unpack_fp4(data))
        expected = (vals * np.repeat(fac, 16, axis=1)).astype(np.float32)
        if col:
            expected = np.ascontiguousarray(expected.T[:32])
        got = lpm.dequantize(q, direction)
        assert got.dtype == np.float32 and got.shape == (32, 48)
        assert_bytes_equal(got, expected, direction)
        for dt, npdt in (("bfloat16", ml_dtypes.bfloat16), ("float16", np.float16)):
            got_dt = lpm.dequantize(q, direction, dtype=dt)
            assert got_dt.dtype == npdt
            assert_bytes_equal(got_dt, expected.astype(npdt), f"{direction} {dt}")
        assert_bytes_equal(q.dequantize(direction), expected, f"{direction} method")


def test_dequantize_approximates_input(xp):
    x = _random((16, 64), seed=18)
    q = _quantize_both(xp, x, columnwise=True)
    for d in ("rowwise", "columnwise"):
        got = to_host(lpm.dequantize(q, d))
        # E2M1 relative rounding error <= 1/4 (0.5 step at 2..), block scale E4M3 adds 1/16
        assert np.abs(got - x).max() <= 0.25 * np.abs(x).max()


# ----------------------------------------------------------------------------- input dtypes
def test_bf16_fp16_fp32_inputs_give_the_same_bytes(xp):
    rng = np.random.default_rng(19)
    x = (rng.integers(-127, 128, (32, 64)) * 2.0 ** -4).astype(np.float32)  # exact in all three
    ref = _quantize_both(xp, x, columnwise=True)
    for dt in (ml_dtypes.bfloat16, np.float16):
        xd = x.astype(dt)
        assert np.array_equal(xd.astype(np.float32), x)
        assert_quantized_equal(_quantize_both(xp, xd, columnwise=True), ref, str(dt))


def test_rank3_input_is_flattened(xp):
    x = _random((2, 3, 32), seed=20)
    q = _quantize_both(xp, x, columnwise=True)
    assert q.shape == (6, 32)
    assert_quantized_equal(q, lpm.quantize(x.reshape(6, 32), "nvfp4", columnwise=True))


def test_non_contiguous_input(xp):
    x = _random((32, 64), seed=21)
    view = xp.asarray(x)[:, ::2]
    q = lpm.quantize(view, "nvfp4", columnwise=True)
    assert_quantized_equal(q, lpm.quantize(np.ascontiguousarray(x[:, ::2]), "nvfp4",
                                           columnwise=True))


def test_empty_tensor(xp):
    x = np.zeros((0, 32), np.float32)
    q = _quantize_both(xp, x, columnwise=True)
    assert to_host(q.rowwise_data).shape == (0, 16) and to_host(q.rowwise_scale).shape == (0, 2)
    assert to_host(q.columnwise_data).shape == (32, 0)
    assert_bytes_equal(q.amax_rowwise, np.zeros(1, np.float32))


def test_member_index_only_changes_sr():
    x = _random((16, 32), seed=22)
    kw = dict(rowwise=True, columnwise=True, row_scaled=False, block_2d=False, rht=False,
              seed=3, fp8_dtype="e4m3")
    a = _quantize_2d(x, "nvfp4", stochastic_rounding=True, member=0, **kw)
    b = _quantize_2d(x, "nvfp4", stochastic_rounding=True, member=1, **kw)
    assert not np.array_equal(a.rowwise_data, b.rowwise_data)
    assert_quantized_equal(_quantize_2d(x, "nvfp4", stochastic_rounding=False, member=0, **kw),
                           _quantize_2d(x, "nvfp4", stochastic_rounding=False, member=5, **kw))
