"""Element formats and constants, defined once.

Every number that describes a format (maximum magnitudes, block sizes, exponent biases, the
NVFP4 GEMM factor, the Philox constants, the Hadamard sign mask) lives here and nowhere else in
the Python code. ``raw_kernels/common/lpm_formats.cuh`` mirrors these values for the CUDA kernels;
``tests/formats/test_formats.py`` checks that the two agree and that they agree with ``ml_dtypes``.

Formats (NUMERICS §1)
------------------------
E2M1 (fp4)
    4 bits, codes 0..7 are +{0, 0.5, 1, 1.5, 2, 3, 4, 6}, codes 8..15 the negatives (bit 3 is
    the sign, code 8 is -0). Maximum 6.
E4M3 (fp8 "fn")
    8 bits, no infinities, 0x7F / 0xFF are NaN, maximum 448, subnormals down to 2**-9.
E5M2 (fp8)
    8 bits, IEEE-like (has inf and NaN), maximum 57344.
UE8M0 (scale)
    8 bits, code ``e`` means ``2**(e - 127)``; code 255 is NaN, code 0 is ``2**-127`` (not zero).
"""

from __future__ import annotations

import numpy as np

# --------------------------------------------------------------------------------------------
# Element maxima
FP4_MAX = 6.0
E4M3_MAX = 448.0
E5M2_MAX = 57344.0
FLT_MAX = float(np.finfo(np.float32).max)

#: ``FP4_MAX * E4M3_MAX``: the largest magnitude one NVFP4 block can represent before the global
#: scale, i.e. the numerator of the NVFP4 global encode scale ``S_enc = 2688 / amax``.
NVFP4_AMAX_DIVISOR = FP4_MAX * E4M3_MAX  # 2688
#: ``(FP4_MAX * E4M3_MAX) ** 2``: the NVFP4 GEMM epilogue divides ``amax_a * amax_b`` by this.
NVFP4_GEMM_FACTOR = NVFP4_AMAX_DIVISOR * NVFP4_AMAX_DIVISOR  # 7225344

#: fp32(1/6) as raw bits; the block-scale formula multiplies by exactly this value.
FP32_ONE_SIXTH_BITS = 0x3E2AAAAB
#: fp32(1/2688) (correctly rounded) as raw bits; NVFP4 dequantization multiplies by it.
FP32_INV_NVFP4_AMAX_DIVISOR_BITS = 0x39C30C31
#: fp32(1/7225344) (correctly rounded) as raw bits; the NVFP4 GEMM epilogue multiplies by it.
FP32_INV_NVFP4_GEMM_FACTOR_BITS = 0x34149B93
#: fp32(1/448) and fp32(1/57344) as raw bits; the MXFP8 scale rule multiplies by them.
FP32_INV_E4M3_MAX_BITS = 0x3B124925
FP32_INV_E5M2_MAX_BITS = 0x37924925

# --------------------------------------------------------------------------------------------
# Block sizes
NVFP4_BLOCK = 16
MXFP8_BLOCK = 32

# --------------------------------------------------------------------------------------------
# E2M1 code table: magnitude of codes 0..7.
E2M1_NUM_CODES = 16
E2M1_SIGN_BIT = 0x8
E2M1_MAX_CODE = 0x7  # +6; NaN inputs encode to this code
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)

# --------------------------------------------------------------------------------------------
# E4M3 / E5M2 byte facts
#: canonical NaN bytes written by the quantizers (the sign of a NaN input is not kept).
E4M3_NAN_CODE = 0x7F
E5M2_NAN_CODE = 0x7F
E4M3_EXP_BIAS = 7
E4M3_MANT_BITS = 3
E5M2_EXP_BIAS = 15
E5M2_MANT_BITS = 2

# --------------------------------------------------------------------------------------------
# UE8M0 scale
E8M0_BIAS = 127
E8M0_NAN = 255
E8M0_MAX_FINITE = 254

# fp32 layout (used for bit-level exponent arithmetic)
FP32_EXP_BIAS = 127
FP32_MANT_BITS = 23
FP32_EXP_MASK = 0xFF
FP32_MANT_MASK = (1 << FP32_MANT_BITS) - 1

# fp16 layout (the MXFP8 GEMM's fp16 operand window)
FP16_EXP_BIAS = 15
FP16_MANT_BITS = 10

# --------------------------------------------------------------------------------------------
# Random Hadamard transform (NVFP4 columnwise, NUMERICS §2.3)
RHT_SIZE = 16
#: bit i set where the sign s_i of the diagonal is -1.
RHT_SIGN_MASK = 0xD7E8
#: the transform is ``v @ (diag(s) @ H16) / RHT_NORM``; ``RHT_NORM = sqrt(16)``.
RHT_NORM = 4.0

# --------------------------------------------------------------------------------------------
# Philox4x32-10 (stochastic rounding, NUMERICS §2.4)
PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9
PHILOX_W1 = 0xBB67AE85
PHILOX_ROUNDS = 10
#: stochastic rounding uses this many random bits per element (``u = (r & 0xFF) / 256``).
SR_RANDOM_BITS = 8

# --------------------------------------------------------------------------------------------
# Scale layouts (NUMERICS §4)
SCALE_PAD_ROWS = 128
SCALE_PAD_COLS = 4
SWIZZLE_TILE_ROWS = 128
SWIZZLE_TILE_COLS = 4
SWIZZLE_TILE_BYTES = SWIZZLE_TILE_ROWS * SWIZZLE_TILE_COLS  # 512
SWIZZLE_SUBTILE_ROWS = 32

# --------------------------------------------------------------------------------------------
# Names accepted by the public API
FORMATS = ("nvfp4", "mxfp8")
FP8_DTYPES = ("e4m3", "e5m2")
FP8_MAX = {"e4m3": E4M3_MAX, "e5m2": E5M2_MAX}
DEQUANT_DTYPES = ("float32", "bfloat16", "float16")


def fp32_one_sixth() -> np.float32:
    """Return fp32(1/6), the exact value the NVFP4 block-scale formula uses."""
    return f32_from_bits(FP32_ONE_SIXTH_BITS)


def f32_from_bits(bits: int) -> np.float32:
    """The float32 whose raw bits are ``bits``."""
    return np.array([bits], dtype=np.uint32).view(np.float32)[0]


def fp8_inv_max(fp8_dtype: str) -> np.float32:
    """fp32(1 / max) of ``fp8_dtype``, as used by the MXFP8 scale rule."""
    bits = {"e4m3": FP32_INV_E4M3_MAX_BITS, "e5m2": FP32_INV_E5M2_MAX_BITS}
    if fp8_dtype not in bits:
        raise ValueError(f"fp8_dtype={fp8_dtype!r} must be one of {FP8_DTYPES}")
    return f32_from_bits(bits[fp8_dtype])


def fp8_max(fp8_dtype: str) -> float:
    """Largest finite magnitude of ``fp8_dtype`` ("e4m3" or "e5m2")."""
    try:
        return FP8_MAX[fp8_dtype]
    except KeyError:
        raise ValueError(f"fp8_dtype={fp8_dtype!r} must be one of {FP8_DTYPES}") from None


def ml_fp8_dtype(fp8_dtype: str):
    """The ``ml_dtypes`` type of ``fp8_dtype`` ("e4m3" -> float8_e4m3fn, "e5m2" -> float8_e5m2)."""
    import ml_dtypes

    if fp8_dtype == "e4m3":
        return ml_dtypes.float8_e4m3fn
    if fp8_dtype == "e5m2":
        return ml_dtypes.float8_e5m2
    raise ValueError(f"fp8_dtype={fp8_dtype!r} must be one of {FP8_DTYPES}")


def rht_signs() -> np.ndarray:
    """The 16 diagonal signs of the RHT as float32 (+1 / -1), from ``RHT_SIGN_MASK``."""
    bits = (RHT_SIGN_MASK >> np.arange(RHT_SIZE)) & 1
    return np.where(bits == 1, -1.0, 1.0).astype(np.float32)


def hadamard16() -> np.ndarray:
    """Sylvester Hadamard matrix ``H16[i, j] = (-1) ** popcount(i & j)`` as float32."""
    i = np.arange(RHT_SIZE)
    anded = i[:, None] & i[None, :]
    pop = np.zeros_like(anded)
    for b in range(4):
        pop += (anded >> b) & 1
    return np.where(pop % 2 == 1, -1.0, 1.0).astype(np.float32)
