"""The fp16-window rescale of the MXFP8 wgmma kernels (``mx_rescale``,
raw_kernels/gemm/grouped_gemm_mxf16.cuh), emulated on the CPU with float32 arithmetic (round to
nearest, no flush, as fmul.rn on the GPU).

When the tile's range of row and column e_max (``mx_tile_range``) keeps every exponent sum
``e_a + e_b - shift`` in fp32's normal range, the kernel builds each factor's bits as a row
term plus a column term and multiplies once; otherwise it takes ``mx_ldexp`` per accumulator
(one multiply inside the normal range, fp64 outside). Checked: the fast path gives
``mx_ldexp``'s bits for every accumulator of tiles that pass the test (accumulators of every
class: zeros, subnormals, normals near overflow, inf, NaN), and the test rejects the tiles
whose extreme sums leave the range.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import assert_bytes_equal, assert_source_has

from lowprec_moe import formats as F

BIAS, MANT = F.FP32_EXP_BIAS, 23


def _mx_ldexp(v: np.ndarray, x: np.ndarray) -> np.ndarray:
    """grouped_gemm_mxf16.cuh mx_ldexp: v * 2^x rounded once to fp32."""
    inside = (x >= 1 - BIAS) & (x <= BIAS)
    f32 = ((np.clip(x, 1 - BIAS, BIAS) + BIAS).astype(np.uint32) << MANT).view(np.float32)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        near = v * f32
        far = (v.astype(np.float64) * np.ldexp(1.0, x)).astype(np.float32)
    return np.where(inside, near, far)


def _fast_ok(ea, eb, shift) -> bool:
    """mx_rescale's tile test on the valid rows' and columns' e_max."""
    return (int(ea.max()) + int(eb.max()) - shift <= BIAS and
            int(ea.min()) + int(eb.min()) - shift >= 1 - BIAS)


def _fast(v, ea, eb, shift) -> np.ndarray:
    """The fast path: (e_a + 127 - shift) << 23 plus e_b << 23, one multiply."""
    rt = ((ea.astype(np.int64) + BIAS - shift) << MANT).astype(np.uint32)
    ct = (eb.astype(np.uint32) << MANT).astype(np.uint32)
    f = (rt[:, None] + ct[None, :]).astype(np.uint32).view(np.float32)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        return v * f


def _accumulators(rng, rows, cols) -> np.ndarray:
    bits = rng.integers(0, 2**32, size=(rows, cols), dtype=np.uint64).astype(np.uint32)
    v = bits.view(np.float32).copy()  # every class: subnormal, normal, inf, NaN
    special = np.array([0.0, -0.0, np.inf, -np.inf, 3.0e38, 1.0e-45, -1.1754942e-38],
                       np.float32)
    v.flat[:min(v.size, special.size)] = special[:v.size]
    return v


@pytest.mark.parametrize("shift", [2 * F.E8M0_BIAS + 7 + 7, 2 * F.E8M0_BIAS + 7,
                                   2 * F.E8M0_BIAS])
@pytest.mark.parametrize("seed", range(4))
def test_fast_rescale_is_mx_ldexp(shift, seed):
    rng = np.random.default_rng(seed)
    v = _accumulators(rng, 128, 64)
    taken = 0
    for lo, hi in ((100, 150), (1, 60), (200, 254), (0, 254), (120, 135)):
        ea = rng.integers(lo, hi + 1, size=128)
        eb = rng.integers(lo, hi + 1, size=64)
        want = _mx_ldexp(v, ea[:, None] + eb[None, :] - shift)
        if not _fast_ok(ea, eb, shift):
            x = ea[:, None] + eb[None, :] - shift
            assert ((x < 1 - BIAS) | (x > BIAS)).any(), "a rejected tile has every sum inside"
            continue
        taken += 1
        assert_bytes_equal(_fast(v, ea, eb, shift), want,
                           f"fast rescale, codes {lo}..{hi}, shift {shift}")
    assert taken >= 1


def test_fast_rescale_edges():
    """A tile whose sums reach exactly -126 and +127 takes the fast path with mx_ldexp's bits;
    one code further either way, it does not."""
    shift = 2 * F.E8M0_BIAS + 7 + 7  # E4M3 x E4M3
    ea, eb = np.array([0, 141]), np.array([142, 254])  # sums -126 .. 127
    assert _fast_ok(ea, eb, shift)
    v = _accumulators(np.random.default_rng(9), 2, 2)
    want = _mx_ldexp(v, ea[:, None] + eb[None, :] - shift)
    assert_bytes_equal(_fast(v, ea, eb, shift), want, "fast rescale at the boundary sums")
    assert not _fast_ok(np.array([0, 141]), np.array([141, 254]), shift)
    assert not _fast_ok(np.array([0, 142]), np.array([142, 254]), shift)


def test_source_has_the_emulated_rescale():
    assert_source_has(
        "grouped_gemm_mxf16.cuh",
        "const int top = static_cast<int>(range[0] + range[2]) - shift;",
        "const int bottom = static_cast<int>(range[1] + range[3]) - shift;",
        "if (top <= LPM_FP32_EXP_BIAS && bottom >= 1 - LPM_FP32_EXP_BIAS) {",
        "LPM_FP32_EXP_BIAS - shift)",
        "v = lpm_mul_rn(v, __uint_as_float(rt[mi][hf] + ct));",
        "if (x >= 1 - LPM_FP32_EXP_BIAS && x <= LPM_FP32_EXP_BIAS) {")
