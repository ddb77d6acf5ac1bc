"""Bit-exact element conversions shared by the NVFP4 and MXFP8 references (NumPy only).

Rules
-----
* fp32 -> E2M1 (:func:`f32_to_e2m1`): round to nearest, ties to the even code, saturating at
  +-6. Ties: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4. The sign survives on zero
  (-0.0 and -0.1 give code 8). NaN gives code 7 (+6) whatever its sign bit.
* fp32 -> E4M3 / E5M2 (:func:`f32_to_fp8`): round to nearest even, "satfinite" (values beyond
  +-max, infinities included, clamp to +-max), NaN becomes the canonical NaN byte 0x7F
  (both E4M3 and E5M2; the sign of a NaN is not kept).
  ``ml_dtypes`` would turn overflow into NaN, so values are clamped first.
* float64 -> bf16 (:func:`f64_to_bf16`): a single round to nearest even of the float64 value,
  subnormals kept, overflow to inf (no double rounding through float32).
* No flush-to-zero anywhere: NumPy float32 arithmetic keeps subnormals.

All functions take and return NumPy arrays; they never loop over elements in Python.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from lowprec_moe import formats as F

_E2M1_MAG = np.array(F.E2M1_MAGNITUDES, dtype=np.float32)
#: value of each of the 16 E2M1 codes, as float32 (code 8 is -0.0).
E2M1_VALUES = np.concatenate([_E2M1_MAG, -_E2M1_MAG]).astype(np.float32)

# Midpoints between consecutive magnitudes, and whether a tie at that midpoint rounds up
# (the upper code is even) or down (the upper code is odd).
_E2M1_MIDS = ((_E2M1_MAG[1:] + _E2M1_MAG[:-1]) / 2).astype(np.float32)
_E2M1_TIE_UP = np.array([(c + 1) % 2 == 0 for c in range(len(_E2M1_MIDS))])


def as_float32(x: np.ndarray) -> np.ndarray:
    """Upcast a float32 / float16 / bfloat16 array to float32 exactly (float32 is not copied)."""
    if x.dtype == np.float32:
        return x
    return x.astype(np.float32)


def f32_to_e2m1(y: np.ndarray) -> np.ndarray:
    """Encode float32 values as E2M1 codes (uint8 in 0..15), RNE, satfinite, NaN -> 7."""
    y = np.asarray(y, dtype=np.float32)
    a = np.abs(y)
    code = np.zeros(y.shape, dtype=np.uint8)
    for mid, tie_up in zip(_E2M1_MIDS, _E2M1_TIE_UP):
        code += (a >= mid) if tie_up else (a > mid)
    code |= np.signbit(y).astype(np.uint8) << 3
    nan = np.isnan(y)
    if nan.any():
        code[nan] = F.E2M1_MAX_CODE
    return code


def e2m1_to_f32(codes: np.ndarray) -> np.ndarray:
    """Decode E2M1 codes (uint8, low 4 bits used) to float32."""
    return E2M1_VALUES[np.asarray(codes) & 0xF]


def pack_fp4(codes: np.ndarray) -> np.ndarray:
    """Pack codes ``[..., 2n]`` into bytes ``[..., n]``: even element in the low nibble."""
    codes = np.asarray(codes, dtype=np.uint8)
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def unpack_fp4(packed: np.ndarray) -> np.ndarray:
    """Inverse of :func:`pack_fp4`: bytes ``[..., n]`` -> codes ``[..., 2n]``."""
    packed = np.asarray(packed, dtype=np.uint8)
    out = np.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), dtype=np.uint8)
    out[..., 0::2] = packed & 0xF
    out[..., 1::2] = packed >> 4
    return out


def f32_to_fp8(y: np.ndarray, fp8_dtype: str = "e4m3") -> np.ndarray:
    """Encode float32 values as E4M3 / E5M2 bytes (uint8), RNE, satfinite, NaN -> NaN."""
    mx = np.float32(F.fp8_max(fp8_dtype))
    y = np.asarray(y, dtype=np.float32)
    with np.errstate(invalid="ignore"):
        clamped = np.clip(y, -mx, mx)  # NaN passes through np.clip unchanged
    out = clamped.astype(F.ml_fp8_dtype(fp8_dtype)).view(np.uint8)
    nan_code = F.E4M3_NAN_CODE if fp8_dtype == "e4m3" else F.E5M2_NAN_CODE
    return np.where(np.isnan(y), np.uint8(nan_code), out).astype(np.uint8)


def fp8_to_f32(b: np.ndarray, fp8_dtype: str = "e4m3") -> np.ndarray:
    """Decode E4M3 / E5M2 bytes (uint8) to float32 exactly."""
    return np.asarray(b, dtype=np.uint8).view(F.ml_fp8_dtype(fp8_dtype)).astype(np.float32)


def e4m3_to_f32(b: np.ndarray) -> np.ndarray:
    """Decode E4M3 bytes to float32."""
    return fp8_to_f32(b, "e4m3")


def f32_bits(x: np.ndarray) -> np.ndarray:
    """Raw bits of float32 values as uint32."""
    return np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)


def bits_f32(b: np.ndarray) -> np.ndarray:
    """float32 values from raw uint32 bits."""
    return np.ascontiguousarray(b, dtype=np.uint32).view(np.float32)


def e8m0_to_f32(e: np.ndarray) -> np.ndarray:
    """Decode UE8M0 codes: ``2**(e - 127)`` (code 0 -> 2**-127, a subnormal), code 255 -> NaN."""
    e = np.asarray(e, dtype=np.uint8).astype(np.uint32)
    # 2**(e-127) for e >= 1 is the normal float with biased exponent e; e == 0 is 2**-127,
    # the subnormal with mantissa bit 22 set.
    bits = np.where(e == 0, np.uint32(1 << (F.FP32_MANT_BITS - 1)), e << F.FP32_MANT_BITS)
    bits = np.where(e == F.E8M0_NAN, np.uint32(0x7FC00000), bits)
    return bits_f32(bits.astype(np.uint32))


def e8m0_inverse_f32(e: np.ndarray) -> np.ndarray:
    """``2**(127 - e)`` as float32, built from exponent bits; e = 254 -> 2**-127, e = 255 -> NaN.

    For e = 0 the value is 2**127 (largest power of two below FLT_MAX).
    """
    e = np.asarray(e, dtype=np.uint8).astype(np.int64)
    return _pow2_f32(F.E8M0_BIAS - e, nan=(e == F.E8M0_NAN))


def _pow2_f32(k: np.ndarray, nan: np.ndarray) -> np.ndarray:
    """Exact float32 ``2**k`` for integer k in [-149, 127] from bits; NaN where ``nan``."""
    k = np.asarray(k, dtype=np.int64)
    normal = k >= -126
    bits_n = ((k + F.FP32_EXP_BIAS).clip(1, 254) << F.FP32_MANT_BITS)
    bits_s = np.left_shift(1, (k + 149).clip(0, 22))
    bits = np.where(normal, bits_n, bits_s).astype(np.uint32)
    bits = np.where(nan, np.uint32(0x7FC00000), bits).astype(np.uint32)
    return bits_f32(bits)


def f64_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round float64 values once to bfloat16 (RNE, subnormals kept, overflow -> inf)."""
    x = np.asarray(x, dtype=np.float64)
    out = np.empty(x.shape, dtype=np.float64)
    finite = np.isfinite(x) & (x != 0)
    xf = x[finite]
    _, e = np.frexp(xf)  # xf = m * 2**e, 0.5 <= |m| < 1
    # bf16 has 8 significant bits; ulp exponent is (e - 1) - 7, floored at the subnormal ulp.
    ulp_exp = np.maximum(e - 8, -133)
    r = np.ldexp(np.rint(np.ldexp(xf, -ulp_exp)), ulp_exp)
    bf16_max = float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    r = np.where(np.abs(r) > bf16_max, np.copysign(np.inf, r), r)
    out[finite] = r
    out[~finite] = x[~finite]
    return out.astype(np.float32).astype(ml_dtypes.bfloat16)
