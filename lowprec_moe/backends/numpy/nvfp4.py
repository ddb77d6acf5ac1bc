"""NVFP4 quantization and dequantization, NumPy reference (NUMERICS §2).

Input ``x`` ``[M, K]`` (float32, float16 or bfloat16; upcast to float32 exactly), ``K % 16 == 0``.
All arithmetic is IEEE float32 with subnormals (no flush-to-zero).

Global scale (per tensor, or per row when row-scaled)::

    amax  = max |x|                (NaN ignored; an all-NaN or empty tensor gives 0)
    S_enc = min(NVFP4_AMAX_DIVISOR / amax, FLT_MAX);  S_enc = 1 if amax == 0 or S_enc == 0 (amax = inf)
    S_dec = 1 / S_enc

Block scale (16 consecutive elements; one 16x16 tile with ``block_2d``)::

    s     = min(block_amax * (S_enc * fp32(1/6)), FLT_MAX)
    scale = E4M3 satfinite RNE of s               (0x7F never occurs: s is finite and >= 0)

Elements::

    enc  = min(1 / (float(scale) * S_dec), FLT_MAX)     (scale 0 -> enc = FLT_MAX)
    code = E2M1(x * enc)   RNE ties-to-even, saturating at +-6, sign kept on zero, NaN -> +6
           or, with stochastic rounding, the SR rule of NUMERICS §2.4 (NaN -> +6, +-inf -> +-6).

Packing: byte ``c`` of a row holds element ``2c`` in its low nibble and ``2c+1`` in its high one.

Columnwise storage quantizes ``x^T`` ``[K, Mp]`` (``Mp = roundup(M, 16)``, padded with zeros)
with the same recipe: data ``[K, Mp/2]``, scale ``[K, Mp/16]``. Per-tensor scaling uses the same
amax in both directions (with RHT, the columnwise amax is taken after the transform); row-scaled
uses ``amax_columnwise[k] = max_i |x[i, k]|``.

Dequantization (as TE)::

    value = e2m1(code) * ((float(scale) * amax) * fp32(1/NVFP4_AMAX_DIVISOR))
"""

from __future__ import annotations

import numpy as np

from lowprec_moe import formats as F
from lowprec_moe.backends.numpy.chunks import (Scratch, block_max_bits, chunk_rows,
                                              halving_max, load_f32, row_chunks)
from lowprec_moe.backends.numpy.fp import (E2M1_ENCODER, FP8_ENCODERS, as_float32, e2m1_to_f32,
                                          e4m3_to_f32, f32_to_e2m1, pack_fp4_into, unpack_fp4)
from lowprec_moe.backends.numpy.philox import sr_random_bits
from lowprec_moe.backends.numpy.rht import rht_forward, rht_inverse

_FLT_MAX = np.float32(F.FLT_MAX)
_ONE_SIXTH = F.fp32_one_sixth()
_INV_2688 = F.f32_from_bits(F.FP32_INV_NVFP4_AMAX_DIVISOR_BITS)
_B = F.NVFP4_BLOCK
_E4M3_VALUES = e4m3_to_f32(np.arange(256, dtype=np.uint8))  # decode table of the block scales


def amax_f32(a: np.ndarray, axis=None) -> np.ndarray:
    """max |a| along ``axis`` ignoring NaN (fmax semantics), starting from 0, as float32."""
    return np.fmax.reduce(np.abs(a), axis=axis, initial=np.float32(0)).astype(np.float32)


def encode_scale(amax: np.ndarray) -> np.ndarray:
    """``S_enc`` from ``amax`` (float32 array), with the zero / inf / tiny-amax rules."""
    amax = np.asarray(amax, dtype=np.float32)
    with np.errstate(divide="ignore", over="ignore"):
        s_enc = np.float32(F.NVFP4_AMAX_DIVISOR) / amax
    s_enc = np.minimum(s_enc, _FLT_MAX)
    return np.where((amax == 0) | (s_enc == 0), np.float32(1), s_enc).astype(np.float32)


def _sr_round(y: np.ndarray, rbits: np.ndarray) -> np.ndarray:
    """Stochastically round float32 ``y`` to E2M1 codes with random words ``rbits``."""
    a = np.abs(y)
    u = (rbits & np.uint32(0xFF)).astype(np.float32) * np.float32(1.0 / 256.0)

    def step(v):
        return np.where(v < 2, np.float32(0.5), np.where(v < 4, np.float32(1.0), np.float32(2.0)))

    with np.errstate(invalid="ignore", over="ignore"):
        t = (a + u * step(a)).astype(np.float32)
        st = step(t)
        q = np.minimum(np.floor(t / st) * st, np.float32(F.FP4_MAX)).astype(np.float32)
    code = f32_to_e2m1(q) | (np.signbit(y).astype(np.uint8) << 3)
    return np.where(np.isnan(y), np.uint8(F.E2M1_MAX_CODE), code).astype(np.uint8)


def _chunk_block_amax(x: np.ndarray, out: np.ndarray, scratch: Scratch) -> bool:
    """float32 ``[R, C/16]`` block amax of the rows ``x`` into ``out``; whether ``x`` is free
    of NaN."""
    mx, inf = block_max_bits(x, _B, scratch)
    if not (mx > inf).any():
        load_f32(mx.view(x.dtype), out)
        return True
    # NaN present: fmax ignores it (an all-NaN block gives 0)
    a = np.abs(as_float32(x))
    bam = halving_max(a.reshape(out.shape + (_B,)), np.fmax, np.empty(a.size, np.float32))
    np.fmax(bam, np.float32(0), out=out)
    return False


def _block_amax(a: np.ndarray, block_2d: bool) -> tuple[np.ndarray, bool]:
    rows, cols = a.shape
    bam = np.empty((rows, cols // _B), np.float32)
    scratch = Scratch(chunk_rows(cols, _B) * cols)
    nan_free = True
    for r0, r1 in row_chunks(rows, cols, _B):
        nan_free &= _chunk_block_amax(a[r0:r1], bam[r0:r1], scratch)
    if block_2d:
        tiles = np.fmax.reduce(bam.reshape(rows // _B, _B, cols // _B), axis=1)  # [R/16, nb]
        bam = np.repeat(tiles, _B, axis=0)
    return bam, nan_free


def block_amax(a: np.ndarray, block_2d: bool = False) -> np.ndarray:
    """float32 ``[R, C/16]`` amax of each 16-element block (or its 16x16 tile, repeated) of a
    float32 / float16 / bfloat16 matrix; NaN is ignored (an all-NaN block gives 0)."""
    return _block_amax(np.ascontiguousarray(a), block_2d)[0]


def quantize_matrix(a: np.ndarray, amax: np.ndarray, *, block_2d: bool = False,
                    sr_bits: np.ndarray | None = None,
                    bamax: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Quantize the rows of a matrix with 16-element blocks.

    Parameters
    ----------
    a : numpy.ndarray
        ``[R, C]`` float32 / float16 / bfloat16 (upcast exactly), ``C % 16 == 0`` (and
        ``R % 16 == 0`` when ``block_2d``).
    amax : numpy.ndarray
        float32 global amax, shape ``(1,)`` (per tensor) or ``(R,)`` (per row).
    block_2d : bool
        One block amax per 16x16 tile instead of per 16 elements of a row.
    sr_bits : numpy.ndarray, optional
        uint32 ``[R, C]`` random words; when given, elements are stochastically rounded.
    bamax : numpy.ndarray, optional
        Precomputed :func:`block_amax` of ``a`` (saves a pass over the data).

    Returns
    -------
    data : numpy.ndarray
        uint8 ``[R, C/2]`` packed E2M1 codes.
    scale : numpy.ndarray
        uint8 ``[R, C/16]`` E4M3 block scales.
    """
    a = np.ascontiguousarray(a)
    nan_free = False
    if bamax is None and a.size:
        bamax, nan_free = _block_amax(a, block_2d)
    return _quantize_rows(a, amax, bamax, sr_bits, nan_free)


def _quantize_rows(a, amax, bamax, sr_bits, nan_free):
    rows, cols = a.shape
    nb = cols // _B
    data = np.zeros((rows, cols // 2), np.uint8)
    scale = np.zeros((rows, nb), np.uint8)
    if rows == 0 or cols == 0:
        return data, scale
    s_enc = encode_scale(amax).reshape(-1, 1)  # (1,1) or (R,1)
    s_dec = (np.float32(1) / s_enc).astype(np.float32)
    with np.errstate(over="ignore"):
        s_fac = (s_enc * _ONE_SIXTH).astype(np.float32)
    per_row = s_enc.shape[0] > 1
    scratch = Scratch(chunk_rows(cols, _B) * cols)
    for r0, r1 in row_chunks(rows, cols, _B):
        g = slice(r0, r1) if per_row else slice(None)
        with np.errstate(over="ignore"):
            s = bamax[r0:r1] * s_fac[g]
        np.minimum(s, _FLT_MAX, out=s)  # finite, never NaN
        sc = FP8_ENCODERS["e4m3"](s, nan_free=True)
        scale[r0:r1] = sc
        dec = _E4M3_VALUES[sc]
        dec *= s_dec[g]
        with np.errstate(divide="ignore", over="ignore"):
            enc = np.float32(1) / dec
        np.minimum(enc, _FLT_MAX, out=enc)
        part = a[r0:r1]
        n = part.size
        y = scratch.get("y", n, np.float32)
        blocks = y.reshape(r1 - r0, nb, _B)
        if part.dtype == np.float32:
            src = part.reshape(blocks.shape)
        else:
            load_f32(part, y.reshape(part.shape))
            src = blocks
        with np.errstate(invalid="ignore", over="ignore"):
            np.multiply(src, enc[:, :, None], out=blocks)
        if sr_bits is None:
            codes = scratch.get("codes", n, np.uint8)
            E2M1_ENCODER.encode_into(y, codes, scratch.get("e", n, np.uint32),
                                     scratch.get("t", n, np.uint32), nan_free)
        else:
            codes = _sr_round(y.reshape(part.shape), sr_bits[r0:r1]).reshape(-1)
        pack_fp4_into(codes, data[r0:r1].reshape(-1), scratch.get("pack", n // 2, np.uint16))
    return data, scale


def dequantize_matrix(data: np.ndarray, scale: np.ndarray, amax: np.ndarray) -> np.ndarray:
    """Dequantize packed NVFP4 rows to float32 ``[R, C]`` (TE's formula, with amax)."""
    rows, cols = data.shape[0], data.shape[1] * 2
    vals = e2m1_to_f32(unpack_fp4(data))
    amax = np.asarray(amax, dtype=np.float32).reshape(-1, 1)
    f = ((e4m3_to_f32(scale) * amax).astype(np.float32) * _INV_2688).astype(np.float32)
    out = vals.reshape(rows, cols // _B, _B) * f[:, :, None]
    return out.reshape(rows, cols).astype(np.float32)


def quantize_nvfp4(x: np.ndarray, *, rowwise: bool = True, columnwise: bool = False,
                   row_scaled: bool = False, block_2d: bool = False, rht: bool = False,
                   stochastic_rounding: bool = False, seed: int = 0, member: int = 0) -> dict:
    """Quantize a validated 2-D array to NVFP4 (see the module docstring for the rules).

    Parameters
    ----------
    x : numpy.ndarray
        ``[M, K]`` float32 / float16 / bfloat16, ``K % 16 == 0``; ``M % 16 == 0`` with block_2d.
    rowwise, columnwise : bool
        Which copies to produce.
    row_scaled : bool
        Per-row (rowwise) / per-column (columnwise) amax instead of one per tensor.
    block_2d : bool
        16x16 tiles share one block amax (weights).
    rht : bool
        Apply the random Hadamard transform to the columnwise copy (bf16 input).
    stochastic_rounding : bool
        Round elements stochastically with the Philox stream of ``(seed, member, direction)``.
    seed, member : int
        Stochastic-rounding key and member index.

    Returns
    -------
    dict
        ``rowwise_data [M, K/2]``, ``rowwise_scale [M, K/16]``, ``columnwise_data [K, Mp/2]``,
        ``columnwise_scale [K, Mp/16]`` (uint8, or None when not requested), ``amax_rowwise``,
        ``amax_columnwise`` (float32 ``(1,)``, or ``(M,)`` / ``(K,)`` when row-scaled).
    """
    a = np.ascontiguousarray(x)  # rows are upcast to float32 chunk by chunk
    m, k = a.shape
    out = dict(rowwise_data=None, rowwise_scale=None, columnwise_data=None,
               columnwise_scale=None, amax_rowwise=None, amax_columnwise=None)
    # Global amaxes are taken as the max of block amaxes (the same value, one pass fewer).
    bam_row, nan_free_row = _block_amax(a, block_2d) if rowwise else (None, False)
    at = bam_col = None
    if columnwise:
        mp = -(-m // _B) * _B
        at = np.zeros((k, mp), dtype=np.float32)
        at[:, :m] = a.T
        bam_col, nan_free_col = _block_amax(at, block_2d)
    if row_scaled:
        amax_row = amax_f32(bam_row, axis=1) if rowwise else None
        amax_col = amax_f32(bam_col, axis=1) if columnwise else None
    else:
        amax_row = amax_f32(bam_row if rowwise else bam_col).reshape(1)
        amax_col = amax_row
    if rowwise:
        bits = sr_random_bits(seed, member, 0, (m, k)) if stochastic_rounding else None
        d, s = _quantize_rows(a, amax_row, bam_row, bits, nan_free_row)
        out.update(rowwise_data=d, rowwise_scale=s, amax_rowwise=amax_row)
    if columnwise:
        if rht:
            at = rht_forward(at).astype(np.float32)
            bam_col, nan_free_col = _block_amax(at, block_2d)
            amax_col = amax_f32(bam_col).reshape(1)
        bits = sr_random_bits(seed, member, 1, (k, mp)) if stochastic_rounding else None
        d, s = _quantize_rows(at, amax_col, bam_col, bits, nan_free_col)
        out.update(columnwise_data=d, columnwise_scale=s, amax_columnwise=amax_col)
        if not rowwise:
            out["amax_rowwise"] = None
    return out


def dequantize_nvfp4(data: np.ndarray, scale: np.ndarray, amax: np.ndarray, *,
                     columnwise: bool = False, m: int | None = None, rht: bool = False) -> np.ndarray:
    """Dequantize one stored NVFP4 copy to float32 ``[M, K]``.

    Rowwise: ``data [M, K/2]``, ``amax`` ``(1,)`` or ``(M,)``. Columnwise: ``data [K, Mp/2]``,
    ``amax`` ``(1,)`` or ``(K,)``; the result is transposed back, padding rows are cropped to
    ``m`` and, with ``rht``, the inverse transform is applied first.
    """
    vals = dequantize_matrix(data, scale, amax)
    if not columnwise:
        return vals
    if rht:
        vals = rht_inverse(vals)
    vals = vals.T
    return np.ascontiguousarray(vals[: (vals.shape[0] if m is None else m)])
