"""The random Hadamard transform of 16-value chunks on the GPU (``q_rht16`` in
``raw_kernels/nvfp4/nvfp4_codes.cuh``, through the test kernel ``lpm_nvfp4_rht16_bf16``) vs the
NumPy reference, value by value, on every summation path: the fp32 butterfly, the float64
butterfly and the ordered float64 fallback. The quantizers' RHT outputs are tested in
``test_gpu_nvfp4.py``.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from conftest import assert_bytes_equal, requires_gpu

pytestmark = [pytest.mark.gpu, requires_gpu]


# bf16 bits of chunks whose sum, taken in fp32 by the butterfly, rounds to other bf16 values than
# the exact sum (found by search): with exponent spreads of 14-23 they must not take an fp32 path.
_RHT_FP32_INEXACT = np.array([
    (0x3FF6, 0x3FED, 0x3F95, 0xBF93, 0x3F88, 0xBFB0, 0xBF89, 0xBFD0, 0xBFC2, 0xB89D, 0xBF88, 0x3FFC, 0xBFBA, 0x3FFB, 0xBFE1, 0xBFC0),  # spread 14
    (0x3FE0, 0x3FEA, 0x3FD0, 0xBFE0, 0x3FB2, 0xB881, 0xBF8C, 0xBF98, 0xBFD2, 0xBF9C, 0xBF82, 0x3F8D, 0xBF97, 0x3F86, 0xBFF0, 0xBFC4),  # spread 14
    (0x3FB9, 0x3F85, 0x3FFF, 0xBFC9, 0x3FBF, 0xBFCE, 0xBFA0, 0xBFCD, 0xBFFA, 0xBFE1, 0xBFF0, 0x379D, 0xBF9A, 0x3FEE, 0xBFAA, 0xBFA5),  # spread 16
    (0x3FEB, 0x3FA3, 0x3FD0, 0xBFCA, 0x3FDD, 0xBFAC, 0xBFC7, 0xBF92, 0xBFC7, 0xBFA5, 0xBFC3, 0x3F93, 0xBFEA, 0x3FEF, 0xB78F, 0xBFA3),  # spread 16
    (0x3FFF, 0x3FB7, 0x3F8F, 0xBF99, 0x3F92, 0xBFF5, 0xBFC4, 0xBFEA, 0xBFFA, 0xBFEA, 0xBFDB, 0x3FB0, 0xBFB3, 0x35F8, 0xBFE6, 0xBF97),  # spread 20
    (0x3FE2, 0x3FAB, 0x3F8B, 0xBFCF, 0x3FEF, 0xB5F7, 0xBF98, 0xBFC8, 0xBFC4, 0xBF8C, 0xBFE9, 0x3FC3, 0xBFFA, 0x3FCE, 0xBFE0, 0xBFEC),  # spread 20
    (0x340A, 0x3FF5, 0x3FA7, 0xBF99, 0x3FF5, 0xBFF6, 0xBF96, 0xBFAB, 0xBF80, 0xBFB6, 0xBFCE, 0x3FFB, 0xBFC8, 0x3FEB, 0xBFDF, 0xBFE7),  # spread 23
    (0x3FA8, 0x3FE1, 0x3F8C, 0xBFF4, 0x3FAF, 0xBFD9, 0xBFF0, 0xBFD1, 0xBFED, 0xBFE8, 0xBF99, 0x3409, 0xBF87, 0x3FB5, 0xBFD2, 0xBFA7),  # spread 23
], dtype=np.uint16)


def _rht_path_chunks(seed=3):
    """bf16 chunks of 16 values at the edges of the RHT's summation paths: exponent spreads
    around the fp32-exact (12) and float64-exact (41) limits, smallest magnitudes around the
    fp32 path's lower limit (2^-117) and subnormals, magnitudes where an fp32 sum would overflow,
    chunks an fp32 sum gets wrong, signed zeros, inf / NaN."""
    rng = np.random.default_rng(seed)
    chunks = []
    for spread in (0, 1, 11, 12, 13, 14, 40, 41, 42, 43, 60):
        for top in (0, 60, -60, 121, 122, 123, 127, -110, -114, -117, -118, -120):
            for _ in range(24):
                e = rng.integers(top - spread, top + 1, size=16)
                hi, lo = rng.choice(16, size=2, replace=False)
                e[hi], e[lo] = top, top - spread
                mant = 1.0 + rng.integers(0, 128, size=16) / 128.0  # 8 significant bits
                mant[rng.random(16) < 0.3] = 255 / 128
                v = np.ldexp(mant, e) * rng.choice([-1.0, 1.0], size=16)
                chunks.append(v)
    for k in (13, 16, 17, 20, 24, 25, 30, 40, 41, 42):
        # 1 + 2^-8 (a bf16 tie) + 2^-k: only an exact sum rounds it up
        for lead in (1.0, np.ldexp(1.0, 100), np.ldexp(1.0, -100)):
            v = np.zeros(16)
            v[:3] = lead * np.array([1.0, 2.0**-8, 2.0**-k])
            chunks.append(v)
            chunks.append(v[::-1].copy())
    big = np.float64(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    chunks.append(np.full(16, big))                                  # sum/4 overflows bf16
    chunks.append(np.where(np.arange(16) % 2, big, -big / 4))
    tiny = np.ldexp(1.0, -133)                                       # smallest bf16 subnormal
    chunks.append(tiny * rng.integers(-127, 128, size=16))
    chunks.append(np.concatenate([tiny * rng.integers(1, 128, size=8), np.ldexp(1.5, -122) * np.ones(8)]))
    chunks.append(np.zeros(16))
    chunks.append(-np.zeros(16))
    chunks.append(np.where(np.arange(16) < 8, 0.0, -0.0))
    chunks.append(np.concatenate([[np.inf], np.ones(15)]))
    chunks.append(np.concatenate([[np.inf, -np.inf], np.ones(14)]))
    chunks.append(np.concatenate([[np.nan], np.ones(15)]))
    return np.concatenate([np.stack(chunks).astype(ml_dtypes.bfloat16),
                           _RHT_FP32_INEXACT.view(ml_dtypes.bfloat16)])


def test_rht16_every_summation_path_matches_reference(cp):
    """The RHT of single chunks (fp32 butterfly, float64 butterfly, ordered fallback) gives the
    reference's bf16 values bit for bit (NaN payloads aside)."""
    from lowprec_moe import kernels
    from lowprec_moe.backends.numpy.rht import rht_forward

    x = _rht_path_chunks()
    ref = rht_forward(x).view(np.uint16)
    xin = cp.asarray(x.view(np.uint16))
    out = cp.empty_like(xin)
    n = x.shape[0]
    kernels.get_function("nvfp4_ext", "lpm_nvfp4_rht16_bf16")(
        ((n + 127) // 128,), (128,), (xin, out, np.int64(n)))
    got = cp.asnumpy(out)
    nan = (got & 0x7FFF) > 0x7F80
    assert np.array_equal(nan, (ref & 0x7FFF) > 0x7F80)
    assert_bytes_equal(np.where(nan, 0, got), np.where(nan, 0, ref), "rht16 chunks")
