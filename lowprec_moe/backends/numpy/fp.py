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
    if x.dtype.name == "bfloat16":
        return bf16_bits_to_f32(np.ascontiguousarray(x).view(np.uint16))
    return x.astype(np.float32)


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """float32 values of bfloat16 bit patterns (uint16): the bits moved to the high half."""
    out = np.empty(bits.shape, np.float32)
    bf16_bits_into(bits, out)
    return out


#: Per float dtype name: the unsigned type of its width, the magnitude mask and the bits of +inf.
MAGNITUDE = {"bfloat16": (np.uint16, 0x7FFF, 0x7F80), "float16": (np.uint16, 0x7FFF, 0x7C00),
             "float32": (np.uint32, 0x7FFFFFFF, 0x7F800000)}


def magnitude_bits(x: np.ndarray, out: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """``|x|`` of a C-contiguous float32 / float16 / bfloat16 array as unsigned integers, which
    order like the magnitudes (a max over them is the max ``|x|``), and the integer of +inf:
    anything above it is a NaN. View a result back with ``x.dtype``."""
    utype, mask, inf = MAGNITUDE[x.dtype.name]
    return np.bitwise_and(x.view(utype), utype(mask), out=out), inf


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


# Fast encoders. Float32 addition rounds to the nearest even multiple of the sum's ulp. A format
# with n mantissa bits has the grid step 2**(E-n) in binade E (2**E <= |y| < 2**(E+1); below
# the smallest normal binade Emin, subnormals keep Emin's step), which is the ulp of
# 2**(E+23-n). Adding M = 2**(E+23-n) + (E-Emin) * 2**n ulps rounds |y| to the grid, ties to
# the even code, and leaves the code's magnitude (grid index + (E-Emin) * 2**n) in the low bits
# of the sum. |y| is clipped to the format's max first (satfinite), so nothing carries out.
_EXP_MASK = np.uint32(0x7F800000)


class MagicEncoder:
    """Encoder of float32 values to the codes of one small float format (see above).

    Parameters
    ----------
    mant_bits, min_exp : int
        Mantissa bits and the exponent of the smallest normal binade.
    max_value : float
        The largest finite value (larger magnitudes and infinities saturate to it).
    sign_shift : int
        Bit of the sign in the code.
    nan_code : int
        The code of NaN (whatever its sign).
    """

    def __init__(self, mant_bits: int, min_exp: int, max_value: float, sign_shift: int,
                 nan_code: int):
        max_exp = int(np.floor(np.log2(max_value)))
        self.shift = np.uint32(F.FP32_MANT_BITS - mant_bits)
        self.offset = np.uint32((int(self.shift) << F.FP32_MANT_BITS)
                                - ((F.FP32_EXP_BIAS + min_exp) << mant_bits))
        self.lo = np.uint32((F.FP32_EXP_BIAS + min_exp) << F.FP32_MANT_BITS)
        self.hi = np.uint32((F.FP32_EXP_BIAS + max_exp) << F.FP32_MANT_BITS)
        self.max_value = np.float32(max_value)
        self.sign_shift = sign_shift
        self.nan_code = np.uint8(nan_code)

    def encode_into(self, y: np.ndarray, code: np.ndarray, e: np.ndarray, t: np.ndarray,
                    nan_free: bool = False) -> None:
        """Codes of ``y`` into ``code``.

        All arguments are 1-D and C-contiguous with ``y``'s length: ``y`` float32 (overwritten),
        ``code`` uint8, ``e`` and ``t`` uint32 scratch. ``nan_free=True`` promises that ``y``
        holds no NaN and skips the NaN pass.
        """
        sign = code.view(np.bool_)
        np.signbit(y, out=sign)  # 0 / 1 bytes, shifted 8 at a time where they fill whole words
        words = code.view(np.uint64) if code.size % 8 == 0 else code
        words <<= words.dtype.type(self.sign_shift)
        nan = None
        if not nan_free:
            nan = np.isnan(y)
            if not nan.any():
                nan = None
        np.abs(y, out=y)
        with np.errstate(invalid="ignore"):
            np.clip(y, np.float32(0), self.max_value, out=y)  # inf -> max; NaN stays
        np.bitwise_and(y.view(np.uint32), _EXP_MASK, out=e)
        np.clip(e, self.lo, self.hi, out=e)
        np.right_shift(e, self.shift, out=t)
        e += t
        e += self.offset
        with np.errstate(invalid="ignore"):
            np.add(y, e.view(np.float32), out=y)
        low = t.view(np.uint8)[:y.size]
        np.copyto(low, y.view(np.uint32), casting="unsafe")  # the low byte holds the code
        code |= low
        if nan is not None:
            code[nan] = self.nan_code

    def __call__(self, y: np.ndarray, nan_free: bool = False) -> np.ndarray:
        y = np.array(y, dtype=np.float32, order="C")  # a copy: encode_into overwrites it
        flat = y.reshape(-1)
        code = np.empty(flat.size, np.uint8)
        e = np.empty(flat.size, np.uint32)
        self.encode_into(flat, code, e, np.empty_like(e), nan_free)
        return code.reshape(y.shape)


E2M1_ENCODER = MagicEncoder(1, 0, F.FP4_MAX, 3, F.E2M1_MAX_CODE)
FP8_ENCODERS = {"e4m3": MagicEncoder(F.E4M3_MANT_BITS, 1 - F.E4M3_EXP_BIAS, F.E4M3_MAX, 7,
                                     F.E4M3_NAN_CODE),
                "e5m2": MagicEncoder(F.E5M2_MANT_BITS, 1 - F.E5M2_EXP_BIAS, F.E5M2_MAX, 7,
                                     F.E5M2_NAN_CODE)}


def f32_to_e2m1_fast(y: np.ndarray, *, nan_free: bool = False) -> np.ndarray:
    """:func:`f32_to_e2m1` in a few vectorized passes (the same code for every float32).

    ``nan_free=True`` promises that ``y`` holds no NaN and skips the NaN pass.
    """
    return E2M1_ENCODER(y, nan_free)


def f32_to_fp8_fast(y: np.ndarray, fp8_dtype: str = "e4m3", *,
                    nan_free: bool = False) -> np.ndarray:
    """:func:`f32_to_fp8` in a few vectorized passes (the same byte for every float32)."""
    if fp8_dtype not in FP8_ENCODERS:
        raise ValueError(f"fp8_dtype={fp8_dtype!r} must be one of {F.FP8_DTYPES}")
    return FP8_ENCODERS[fp8_dtype](y, nan_free)


def pack_fp4_into(codes: np.ndarray, out: np.ndarray, work: np.ndarray) -> None:
    """:func:`pack_fp4` of 1-D C-contiguous codes (values < 16, even length) into ``out``
    (uint8, half the length), with ``work`` uint16 scratch of ``out``'s length."""
    pairs = codes.view("<u2")  # element 2c is the low byte
    np.right_shift(pairs, np.uint16(4), out=work)
    work |= pairs
    np.copyto(out, work, casting="unsafe")


def bf16_bits_into(bits: np.ndarray, out: np.ndarray) -> None:
    """float32 values of bfloat16 bit patterns (uint16) into float32 ``out`` (same shape)."""
    wide = out.view(np.uint32)
    np.copyto(wide, bits)
    wide <<= np.uint32(16)


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
