"""NVFP4 random Hadamard transform and stochastic rounding, bit for bit (NUMERICS §§2.3-2.4).

The RHT matrix, its forward (one rounding of the float64 product) and inverse; the columnwise-only
transform; stochastic rounding against NUMERICS rule driven by the reference Philox stream, its
neighbouring-grid-point property and unbiasedness. Public-API tests run on both backends (``xp``).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import lowprec_moe as lpm
from lowprec_moe.backends.numpy import fp
from lowprec_moe.backends.numpy.philox import sr_random_bits
from lowprec_moe.backends.numpy.rht import rht_forward, rht_inverse, rht_matrix

from conftest import assert_bytes_equal, assert_quantized_equal, to_host
from test_nvfp4 import (_GRID, INV_2688, _codes, _padded_t, _quantize_both, _random,
                        spec_quantize_rows)


# ---------------------------------------------------------------------------------------- RHT
def test_rht_matrix_is_orthogonal():
    t = rht_matrix()
    np.testing.assert_allclose(t @ t.T, np.eye(16), atol=1e-15)
    assert set(np.abs(t).ravel().tolist()) == {0.25}


def test_rht_forward_is_one_rounding_of_the_float64_product():
    v = _random((8, 64), seed=9).astype(ml_dtypes.bfloat16)
    got = rht_forward(v)
    assert got.dtype == ml_dtypes.bfloat16
    exact = (v.astype(np.float64).reshape(8, 4, 16) @ rht_matrix()).reshape(8, 64)
    np.testing.assert_array_equal(got.view(np.uint16), fp.f64_to_bf16(exact).view(np.uint16))


def test_rht_inverse_undoes_forward():
    v = _random((4, 32), seed=10).astype(ml_dtypes.bfloat16).astype(np.float32)
    back = rht_inverse(rht_forward(v))
    assert back.dtype == np.float32
    np.testing.assert_allclose(back, v, rtol=0, atol=2 ** -7 * np.abs(v).max())


def test_rht_only_touches_columnwise(xp):
    x = _random((40, 32), seed=11).astype(ml_dtypes.bfloat16)
    q = _quantize_both(xp, x, columnwise=True, rht=True)
    plain = lpm.quantize(x, "nvfp4", columnwise=True)
    assert q.rht and not plain.rht
    assert_bytes_equal(q.rowwise_data, plain.rowwise_data)
    assert_bytes_equal(q.rowwise_scale, plain.rowwise_scale)
    assert_bytes_equal(q.amax_rowwise, plain.amax_rowwise)
    assert not np.array_equal(to_host(q.columnwise_data), plain.columnwise_data)
    # the columnwise copy quantizes rht(x^T, zero-padded to 48 columns) with its own amax
    w = rht_forward(_padded_t(x)).astype(np.float32)   # x^T zero-padded to 48 columns
    amax_c = np.array([np.abs(w).max()], np.float32)
    assert_bytes_equal(q.amax_columnwise, amax_c)
    assert float(amax_c[0]) != float(to_host(q.amax_rowwise)[0])
    d, s, _ = spec_quantize_rows(w, amax_c)
    assert_bytes_equal(q.columnwise_data, d)
    assert_bytes_equal(q.columnwise_scale, s)
    # rowwise-only with rht=True: nothing to transform, identical to plain
    qr = _quantize_both(xp, x, rht=True)
    assert not qr.rht
    assert_quantized_equal(qr, lpm.quantize(x, "nvfp4"))


def test_rht_dequantize_applies_the_inverse(xp):
    x = _random((32, 32), seed=12).astype(ml_dtypes.bfloat16)
    q = _quantize_both(xp, x, columnwise=True, rht=True)
    got = to_host(lpm.dequantize(q, "columnwise"))
    assert got.shape == (32, 32)
    xf = x.astype(np.float32)
    # NVFP4 relative error ~ 1/4 per element at most; the transform spreads it but keeps norms
    err = np.linalg.norm(got - xf) / np.linalg.norm(xf)
    assert err < 0.15, err
    # exactly: inverse transform of the plain decode of the stored (transformed) copy
    vals = fp.e2m1_to_f32(_codes(q.columnwise_data)).reshape(32, 2, 16)
    amax = to_host(q.amax_columnwise).reshape(1, 1, 1)
    fac = ((fp.e4m3_to_f32(to_host(q.columnwise_scale))[:, :, None] * amax).astype(np.float32)
           * INV_2688).astype(np.float32)
    plain = (vals * fac).reshape(32, 32)
    np.testing.assert_allclose(got, rht_inverse(plain).T, rtol=1e-6, atol=1e-7)


def test_rht_requires_bf16(xp):
    x = xp.asarray(_random((16, 16)))
    with pytest.raises(ValueError, match="rht=True requires bfloat16 input, got dtype=float32"):
        lpm.quantize(x, "nvfp4", columnwise=True, rht=True)


# ------------------------------------------------------------------------ stochastic rounding
def test_sr_same_seed_same_bytes_different_seed_different_bytes(xp):
    x = _random((32, 32), seed=13)
    a = _quantize_both(xp, x, columnwise=True, stochastic_rounding=True, seed=1234)
    b = _quantize_both(xp, x, columnwise=True, stochastic_rounding=True, seed=1234)
    c = _quantize_both(xp, x, columnwise=True, stochastic_rounding=True, seed=1235)
    assert_quantized_equal(a, b, "same seed")
    assert not np.array_equal(to_host(a.rowwise_data), to_host(c.rowwise_data))
    assert not np.array_equal(to_host(a.columnwise_data), to_host(c.columnwise_data))
    # scales and amaxes do not depend on the seed
    assert_bytes_equal(a.rowwise_scale, c.rowwise_scale)
    assert_bytes_equal(a.columnwise_scale, c.columnwise_scale)
    rne = lpm.quantize(x, "nvfp4", columnwise=True)
    assert_bytes_equal(a.rowwise_scale, rne.rowwise_scale)
    assert_bytes_equal(a.columnwise_scale, rne.columnwise_scale)


def test_sr_matches_spec_rule_and_philox_stream(xp):
    """Every code equals NUMERICS §2.4 rule applied with r = Philox(seed, member 0, direction,
    linear index of the stored matrix), including NaN, +-inf, zeros and the saturation."""
    seed = 0xDEADBEEF12345
    x = _random((20, 32), seed=14) * 3
    x[0, :4] = [np.nan, -np.inf, 0.0, -0.0]
    x[1, 0] = np.inf
    q = _quantize_both(xp, x, columnwise=True, stochastic_rounding=True, seed=seed)
    amax = np.array([np.inf], np.float32)
    d, s, _ = spec_quantize_rows(x, amax, sr_bits=sr_random_bits(seed, 0, 0, (20, 32)))
    assert_bytes_equal(q.rowwise_data, d, "rowwise")
    assert_bytes_equal(q.rowwise_scale, s)
    d, s, _ = spec_quantize_rows(_padded_t(x), amax, sr_bits=sr_random_bits(seed, 0, 1, (32, 32)))
    assert_bytes_equal(q.columnwise_data, d, "columnwise")
    assert_bytes_equal(q.columnwise_scale, s)


def test_sr_codes_are_neighbouring_grid_points(xp):
    x = _random((16, 64), seed=15)
    amax = np.array([np.abs(x).max()], np.float32)
    _, _, y = spec_quantize_rows(x, amax)
    mags = _GRID.astype(np.float64)
    a = np.abs(y).astype(np.float64)
    lo = mags[np.searchsorted(mags, a, side="right") - 1]
    hi = mags[np.minimum(np.searchsorted(mags, a, side="left"), 7)]
    for seed in range(5):
        q = _quantize_both(xp, x, stochastic_rounding=True, seed=seed)
        codes = _codes(q.rowwise_data)
        val = np.abs(fp.e2m1_to_f32(codes)).astype(np.float64)
        assert ((val == lo) | (val == hi)).all()
        np.testing.assert_array_equal(np.signbit(fp.e2m1_to_f32(codes)), np.signbit(y))


def test_sr_is_unbiased():
    """Mean of the dequantized values over 200 seeds -> x (within 5 standard errors, plus the
    1/256-step granularity of the 8 random bits)."""
    n = 200
    x = _random((4, 32), seed=16)
    amax = np.array([np.abs(x).max()], np.float32)
    _, _, y = spec_quantize_rows(x, amax)
    deq = np.stack([lpm.dequantize(lpm.quantize(x, "nvfp4", stochastic_rounding=True, seed=s))
                    for s in range(n)]).astype(np.float64)
    q0 = lpm.quantize(x, "nvfp4")
    fac = (fp.e4m3_to_f32(q0.rowwise_scale) * amax[0] * INV_2688).astype(np.float64)
    fac = np.repeat(fac, 16, axis=1)                     # dequantization factor per element
    a = np.abs(y).astype(np.float64)
    step = np.where(a < 2, 0.5, np.where(a < 4, 1.0, 2.0))
    p = (a - np.floor(a / step) * step) / step           # probability of rounding up
    se = step * fac * np.sqrt(p * (1 - p) / n)
    err = np.abs(deq.mean(axis=0) - x)
    bound = 5 * se + step * fac / 256 + 1e-6 * np.abs(x)
    # |y| can exceed 6 where the E4M3 block scale rounded down: those saturate, skip them
    inside = a <= 6
    assert inside.mean() > 0.9
    assert (err <= bound)[inside].all(), float((err / bound)[inside].max())
    # and it is genuinely stochastic: the mean beats round-to-nearest on average
    rne_err = np.abs(lpm.dequantize(q0) - x)
    assert err[inside].mean() < 0.5 * rne_err[inside].mean()
