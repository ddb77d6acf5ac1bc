"""MXFP8 quantization and dequantization, NumPy reference (NUMERICS §3).

Input ``x`` ``[M, K]`` (float32, float16 or bfloat16, upcast exactly), element type E4M3
(max E4M3_MAX) or E5M2 (max E5M2_MAX), blocks of 32 elements with one UE8M0 scale each.

Scale exponent (a ceiling, as TE and torchao's RCEIL mode; computed from fp32 bits)::

    v = fp32(block_amax) * fp32(1/max)          (block_amax ignores NaN; an all-NaN block is 0)
    NaN -> 255; inf -> 254; 0 -> 0
    else e = biased exponent of v, +1 if its mantissa bits are nonzero
         (exponent 254 is never increased; a subnormal v <= 2**-127 gives 0, a larger one 1)
    clamp to [0, 254]

Data: ``q = fp8_satfinite_rne(x * 2**(127 - e))`` with the multiplier built from exponent bits
(e = 254 gives the subnormal 2**-127). NaN elements give the canonical NaN byte 0x7F; +-inf
saturate to +-max; -0.0 keeps its sign. Dequantization: ``q * 2**(e - 127)`` in float32.

Rowwise: blocks along K, data ``[M, K]``, scale ``[M, K/32]``. Columnwise: blocks along M, data
in the same row-major layout ``[Mp, K]`` (``Mp = roundup(M, 32)``, padding rows are zeros),
scale ``[Mp/32, K]``. 2-D: one block amax per 32x32 tile, shared by both directions.
"""

from __future__ import annotations

import numpy as np

from lowprec_moe import formats as F
from lowprec_moe.backends.numpy.chunks import (Scratch, block_max_bits, chunk_rows, load_f32,
                                              row_chunks)
from lowprec_moe.backends.numpy.fp import (FP8_ENCODERS, MAGNITUDE, as_float32, e8m0_inverse_f32,
                                          e8m0_to_f32, f32_bits, fp8_to_f32, magnitude_bits)
from lowprec_moe.backends.numpy.nvfp4 import amax_f32

_B = F.MXFP8_BLOCK


def scale_exponent(block_amax: np.ndarray, fp8_dtype: str = "e4m3") -> np.ndarray:
    """UE8M0 exponent codes (uint8) for float32 block amaxes (the ceiling rule above)."""
    v = (np.asarray(block_amax, dtype=np.float32) * F.fp8_inv_max(fp8_dtype)).astype(np.float32)
    bits = f32_bits(v).astype(np.int64)
    exp = (bits >> F.FP32_MANT_BITS) & F.FP32_EXP_MASK
    mant = bits & F.FP32_MANT_MASK
    e = np.where((mant != 0) & (exp < F.E8M0_MAX_FINITE), exp + 1, exp)
    # subnormal v: v <= 2**-127 (mantissa <= 2**22) gives 0, anything larger rounds up to 1
    e = np.where(exp == 0, np.where(mant > (1 << (F.FP32_MANT_BITS - 1)), 1, 0), e)
    e = np.where(np.isinf(v), F.E8M0_MAX_FINITE, e)
    e = np.where(v == 0, 0, e)
    e = np.clip(e, 0, F.E8M0_MAX_FINITE)
    e = np.where(np.isnan(v), F.E8M0_NAN, e)
    return e.astype(np.uint8)


def _bits_amax(mx: np.ndarray, inf: int, dtype) -> np.ndarray | None:
    """float32 amaxes from max magnitude bits; None when a block holds a NaN."""
    if (mx > inf).any():
        return None
    out = np.empty(mx.shape, np.float32)
    load_f32(mx.view(dtype), out)
    return out


def _row_exponents(part, fp8_dtype, scratch) -> tuple[np.ndarray, bool]:
    """``[R, K/32]`` exponents of the rows ``part`` (blocks along K); whether it has no NaN."""
    rows, k = part.shape
    amax = _bits_amax(*block_max_bits(part, _B, scratch), part.dtype)
    if amax is None:  # fmax ignores NaN (an all-NaN block gives 0)
        return scale_exponent(amax_f32(as_float32(part).reshape(rows, k // _B, _B), axis=2),
                              fp8_dtype), False
    return scale_exponent(amax, fp8_dtype), True


def _column_exponents(groups, fp8_dtype, scratch) -> tuple[np.ndarray, bool]:
    """``[G, K]`` exponents of ``groups`` ``[G, 32, K]`` (blocks along M); whether no NaN."""
    utype = MAGNITUDE[groups.dtype.name][0]
    mag, inf = magnitude_bits(groups, out=scratch.get("mag", groups.size, utype).reshape(
        groups.shape))
    amax = _bits_amax(np.maximum.reduce(mag, axis=1), inf, groups.dtype)
    if amax is None:
        return scale_exponent(amax_f32(as_float32(groups), axis=1), fp8_dtype), False
    return scale_exponent(amax, fp8_dtype), True


def _encode_into(part, mult, out, fp8_dtype, nan_free, scratch) -> None:
    """fp8 bytes of ``part * mult`` into ``out`` (``mult``: powers of two, broadcast to the
    blocked shape of ``part``; ``out``: uint8, ``part``'s size)."""
    n = part.size
    y = scratch.get("y", n, np.float32)
    blocks = y.reshape(part.shape)
    if part.dtype == np.float32:
        src = part
    else:
        load_f32(part, blocks)
        src = blocks
    with np.errstate(invalid="ignore", over="ignore"):
        np.multiply(src, mult, out=blocks)
    FP8_ENCODERS[fp8_dtype].encode_into(y, out.reshape(-1), scratch.get("e", n, np.uint32),
                                        scratch.get("t", n, np.uint32), nan_free)


def quantize_mxfp8(x: np.ndarray, *, rowwise: bool = True, columnwise: bool = False,
                   block_2d: bool = False, fp8_dtype: str = "e4m3") -> dict:
    """Quantize a validated 2-D array to MXFP8.

    Parameters
    ----------
    x : numpy.ndarray
        ``[M, K]`` float32 / float16 / bfloat16, ``K % 32 == 0`` (``M % 32 == 0`` with block_2d).
    rowwise, columnwise : bool
        Which copies to produce.
    block_2d : bool
        32x32 tiles share one scale (weights).
    fp8_dtype : {"e4m3", "e5m2"}
        Element type.

    Returns
    -------
    dict
        ``rowwise_data [M, K]``, ``rowwise_scale [M, K/32]``, ``columnwise_data [Mp, K]``,
        ``columnwise_scale [Mp/32, K]`` (uint8 or None); ``amax_rowwise`` / ``amax_columnwise``
        are None.
    """
    a = np.ascontiguousarray(x)
    m, k = a.shape
    mp = -(-m // _B) * _B
    nb = k // _B
    out = dict(rowwise_data=None, rowwise_scale=None, columnwise_data=None,
               columnwise_scale=None, amax_rowwise=None, amax_columnwise=None)
    if rowwise:
        out.update(rowwise_data=np.empty((m, k), np.uint8),
                   rowwise_scale=np.empty((m, nb), np.uint8))
    if columnwise:
        out.update(columnwise_data=np.empty((mp, k), np.uint8),
                   columnwise_scale=np.empty((mp // _B, k), np.uint8))
    # Chunks of whole 32-row groups, each quantized in both directions while in cache; the
    # columnwise copy's padding rows (past M) are zeros.
    scratch = Scratch(chunk_rows(k, _B) * k)
    for r0, r1 in row_chunks(mp if columnwise else m, k, _B):
        part = a[r0:min(r1, m)]
        rows = part.shape[0]
        if block_2d:
            amax = amax_f32(as_float32(part).reshape(rows // _B, _B, nb, _B), axis=(1, 3))
            e_tile = scale_exponent(amax, fp8_dtype)  # [rows/32, K/32]
            nan_free = False
        if rowwise:
            if block_2d:
                e = np.repeat(e_tile, _B, axis=0)
            else:
                e, nan_free = _row_exponents(part, fp8_dtype, scratch)
            mult = e8m0_inverse_f32(e)[:, :, None]
            _encode_into(part.reshape(rows, nb, _B), mult, out["rowwise_data"][r0:r0 + rows],
                         fp8_dtype, nan_free, scratch)
            out["rowwise_scale"][r0:r0 + rows] = e
        if columnwise:
            if r1 > m:
                padded = np.zeros((r1 - r0, k), part.dtype)
                padded[:rows] = part
                part = padded
            groups = part.reshape(-1, _B, k)
            if block_2d:
                e = np.repeat(e_tile, _B, axis=1)
            else:
                e, nan_free = _column_exponents(groups, fp8_dtype, scratch)
            _encode_into(groups, e8m0_inverse_f32(e)[:, None, :], out["columnwise_data"][r0:r1],
                         fp8_dtype, nan_free, scratch)
            out["columnwise_scale"][r0 // _B:r1 // _B] = e
    return out


def dequantize_mxfp8(data: np.ndarray, scale: np.ndarray, *, columnwise: bool = False,
                     m: int | None = None, fp8_dtype: str = "e4m3") -> np.ndarray:
    """Dequantize one stored MXFP8 copy to float32 ``[M, K]`` (``q * 2**(e - 127)``).

    Rowwise: ``data [M, K]``, ``scale [M, K/32]``. Columnwise: ``data [Mp, K]``,
    ``scale [Mp/32, K]``; padding rows are cropped to ``m``.
    """
    rows, cols = data.shape
    vals = fp8_to_f32(data, fp8_dtype)
    f = e8m0_to_f32(scale)
    if columnwise:
        out = (vals.reshape(rows // _B, _B, cols) * f[:, None, :]).reshape(rows, cols)
        return np.ascontiguousarray(out[: (rows if m is None else m)]).astype(np.float32)
    out = vals.reshape(rows, cols // _B, _B) * f[:, :, None]
    return out.reshape(rows, cols).astype(np.float32)
