"""Grouped GEMM, NumPy reference (NUMERICS §7).

This is the CPU backend of :mod:`lowprec_moe.gemm` and the yardstick of the GPU kernels. It takes
a validated :class:`lowprec_moe.gemm.GemmProblem` and computes, expert by expert:

1. **Operand values, exactly.** Each operand element is decoded to float32 without the per-tensor
   (or per-row) global fp32 factors:

   * NVFP4: ``e2m1(code) * e4m3(block scale)`` -- exact in float32 (and in fp16 / bf16);
   * MXFP8: ``fp8(q) * 2**(e - 127)`` -- exact in float32 (the smallest nonzero magnitude is
     ``2**-136``; a finite input never produces a block whose largest value overflows);
   * high precision: the input values (bf16 / fp16 upcast exactly, fp32 as is).

   The stored copy is contracted as it is: NVFP4 / MXFP8 columnwise padding rows (zeros) take part
   in the wgrad contraction, and a Hadamard-transformed (RHT) columnwise copy is *not* transformed
   back -- both wgrad operands carry the transform, which leaves ``dy^T x`` unchanged.
2. **Product.** ``numpy.matmul`` of the float64 operand matrices, rounded once to float32. float64
   is exact for every product of two operand values and sums them with 53-bit precision, so the
   result is (very nearly) the correctly rounded fp32 value of the exact sum; the GPU accumulates in
   fp32 on tensor cores in another order, hence the tolerances of the GPU tests.
3. **Epilogue**, in float32 (IEEE, subnormals kept), in exactly this order:

   * NVFP4 per tensor: ``acc * alpha`` with ``alpha = (amax_a * amax_b) * fp32(1/NVFP4_GEMM_FACTOR)``;
     row-scaled (either side a vector): ``t = acc * fp32(1/NVFP4_GEMM_FACTOR)`` then
     ``t * (amax_row[m] * amax_col[n])`` (a scalar side contributes its scalar);
   * bias: ``+ bias[n]``, or ``+ bias[n] * probs[m]``;
   * cast to the output dtype (one RNE rounding), or ``out + t`` into a float32 buffer.

Empty experts: fprop / dgrad write nothing for them (they own no rows); wgrad writes exact zeros
for them (or leaves ``out`` untouched when accumulating).
"""

from __future__ import annotations

import numpy as np

from lowprec_moe import formats as F
from lowprec_moe import quant_formats
from lowprec_moe.backends.numpy.fp import e2m1_to_f32, e4m3_to_f32, unpack_fp4
from lowprec_moe.backends.numpy.mxfp8 import dequantize_mxfp8

_INV_GEMM_FACTOR = F.f32_from_bits(F.FP32_INV_NVFP4_GEMM_FACTOR_BITS)


# ------------------------------------------------------------------------------------ operands
def nvfp4_operand_values(data: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """``e2m1(code) * e4m3(scale)`` of packed NVFP4 rows, float32 ``[R, 2 * data.shape[1]]``.

    No global factor is applied (that is the GEMM epilogue's job). Every value is exact.
    """
    rows = data.shape[0]
    vals = e2m1_to_f32(unpack_fp4(data)).reshape(rows, -1, F.NVFP4_BLOCK)
    s = e4m3_to_f32(scale).reshape(rows, -1, 1)
    return (vals * s).reshape(rows, -1).astype(np.float32)


def mxfp8_operand_values(data: np.ndarray, scale: np.ndarray, *, columnwise: bool,
                         fp8_dtype: str) -> np.ndarray:
    """``fp8(q) * 2**(e - 127)`` of one stored MXFP8 copy, float32, same shape as ``data``.

    Columnwise copies keep their padding rows (zeros). Every value is exact in float32.
    """
    return dequantize_mxfp8(data, scale, columnwise=columnwise, m=None, fp8_dtype=fp8_dtype)


def _hp(a) -> np.ndarray:
    return np.asarray(a).astype(np.float64)


def _member_cw(gt, g: int) -> tuple[np.ndarray, np.ndarray]:
    q = gt.member(g)
    return q.columnwise_data, q.columnwise_scale


def _rowwise_values(gt, lo: int, hi: int) -> np.ndarray:
    """Operand values of rows ``lo:hi`` of a grouped tensor's rowwise copy (float32)."""
    d, s = gt.rowwise_data[lo:hi], gt.rowwise_scale[lo:hi]
    return quant_formats.get(gt.format).operand_values(d, s, False, gt.fp8_dtype)


def _columnwise_values(gt, g: int) -> np.ndarray:
    """Operand values of member g's columnwise copy as ``[cols of x, padded rows]`` (float32).

    NVFP4 stores it transposed already (``[K, Mp]``); MXFP8 stores ``[Mp, K]``, transposed here.
    """
    d, s = _member_cw(gt, g)
    fmt = quant_formats.get(gt.format)
    v = fmt.operand_values(d, s, True, gt.fp8_dtype)
    return v if fmt.columnwise_transposed else v.T


def operand_matrices(p, g: int) -> tuple[np.ndarray, np.ndarray]:
    """The float64 operand matrices of expert ``g``: ``A [rows, L]`` and ``B [cols, L]``.

    The product of expert g is ``A @ B.T`` (both contiguous along the contraction ``L``).
    """
    lo, hi = int(p.offsets[g]), int(p.offsets[g + 1])
    n = p.n
    if p.fmt == "hp":
        if p.mode == "fprop":
            return _hp(p.a[lo:hi]), _hp(p.b[g])
        if p.mode == "dgrad":
            return _hp(p.a[lo:hi]), _hp(p.b[g]).T
        return _hp(p.a[lo:hi]).T, _hp(p.b[lo:hi]).T
    if p.mode == "fprop":
        return (_rowwise_values(p.a, lo, hi).astype(np.float64),
                _rowwise_values(p.b, g * n, (g + 1) * n).astype(np.float64))
    if p.mode == "dgrad":
        bvals = _columnwise_values(p.b, g)  # [K, Np]
        return _rowwise_values(p.a, lo, hi).astype(np.float64), bvals[:, :n].astype(np.float64)
    return (_columnwise_values(p.a, g).astype(np.float64),
            _columnwise_values(p.b, g).astype(np.float64))


# ------------------------------------------------------------------------------------ epilogue
def amax_factors(p, g: int):
    """(amax of the A side, amax of the B side) of expert g: float32 scalars or vectors.

    A vector runs over the output rows (A) or the output columns (B) of the expert.
    """
    lo, hi = int(p.offsets[g]), int(p.offsets[g + 1])
    a, b = p.a, p.b
    if p.mode == "fprop":
        am = a.amax_rowwise[lo:hi] if a.row_scaled else a.amax_rowwise[g]
        bm = b.amax_rowwise[g * p.n:(g + 1) * p.n] if b.row_scaled else b.amax_rowwise[g]
    elif p.mode == "dgrad":
        am = a.amax_rowwise[lo:hi] if a.row_scaled else a.amax_rowwise[g]
        bm = b.amax_columnwise[g]  # (K,) when row-scaled, else a scalar
    else:
        am = a.amax_columnwise[g]
        bm = b.amax_columnwise[g]
    return np.asarray(am, dtype=np.float32), np.asarray(bm, dtype=np.float32)


def epilogue(acc: np.ndarray, *, scale_mode: int, amax_a=None, amax_b=None, bias=None,
             probs=None) -> np.ndarray:
    """Apply steps 1 and 2 of NUMERICS §7 epilogue to a float32 ``[rows, cols]`` block.

    ``scale_mode``: 0 none, 1 NVFP4 per tensor, 2 NVFP4 row-scaled. ``amax_a`` / ``amax_b`` are
    float32 scalars or vectors over rows / columns. ``bias`` is float32 ``[cols]``, ``probs``
    float32 ``[rows]``. Returns float32 (the value before the output cast / accumulation).
    """
    t = acc.astype(np.float32, copy=False)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        if scale_mode == 1:
            alpha = np.float32(np.float32(amax_a * amax_b) * _INV_GEMM_FACTOR)
            t = (t * alpha).astype(np.float32)
        elif scale_mode == 2:
            t = (t * _INV_GEMM_FACTOR).astype(np.float32)
            ra = amax_a.reshape(-1, 1) if amax_a.ndim else amax_a
            cb = amax_b.reshape(1, -1) if amax_b.ndim else amax_b
            t = (t * (ra * cb).astype(np.float32)).astype(np.float32)
        if bias is not None:
            b = bias.reshape(1, -1)
            if probs is not None:
                b = (b * probs.reshape(-1, 1)).astype(np.float32)
            t = (t + b).astype(np.float32)
    return t


def cast_out(t: np.ndarray, out_dtype: str) -> np.ndarray:
    """Round float32 values once (RNE) to ``out_dtype``."""
    if out_dtype == "float32":
        return t
    if out_dtype == "bfloat16":
        import ml_dtypes

        return t.astype(ml_dtypes.bfloat16)
    return t.astype(np.float16)


# ------------------------------------------------------------------------------------ driver
def grouped_gemm(p):
    """Compute a validated :class:`~lowprec_moe.gemm.GemmProblem` with NumPy; return ``out``."""
    out = p.out
    if out is None:
        out = np.empty(p.out_shape, dtype=np.dtype(p.out_dtype) if p.out_dtype != "bfloat16"
                       else _bf16())
    g_count = len(p.splits)
    for g in range(g_count):
        lo, hi = int(p.offsets[g]), int(p.offsets[g + 1])
        if p.mode == "wgrad":
            dst = out[g]
            if hi == lo:  # empty expert: zero dW (untouched when accumulating)
                if not p.accumulate:
                    dst[...] = 0
                continue
        else:
            if hi == lo:
                continue
            dst = out[lo:hi]
        a_mat, b_mat = operand_matrices(p, g)
        acc = np.matmul(a_mat, b_mat.T).astype(np.float32)
        kw = {}
        if p.scale_mode:
            kw["amax_a"], kw["amax_b"] = amax_factors(p, g)
        bias = p.bias[g] if p.bias is not None else None
        probs = p.probs[lo:hi] if p.probs is not None else None
        t = epilogue(acc, scale_mode=p.scale_mode, bias=bias, probs=probs, **kw)
        if p.accumulate:
            with np.errstate(over="ignore", invalid="ignore"):
                dst[...] = (dst + t).astype(np.float32)
        else:
            dst[...] = cast_out(t, p.out_dtype)
    return out


def _bf16():
    import ml_dtypes

    return ml_dtypes.bfloat16


def mx_code_range_words(codes: np.ndarray) -> np.ndarray:
    """Block-code range words of MXFP8 operand rows (the GPU range kernel's twin,
    ``grouped_gemm_sm90_mxfp8_block_code_ranges``): ``codes`` is ``uint8 [rows, blocks]`` (E8M0 codes of each row's blocks
    along the contraction); returns ``uint16 [rows]`` with each row's largest code in the low
    byte and its smallest in the high byte (0 and the NaN code for rows of no block). Integer
    max / min: NaN codes (``formats.E8M0_NAN``) count as the largest."""
    codes = np.asarray(codes, dtype=np.uint8)
    if codes.ndim != 2:
        raise ValueError(f"codes must be 2-D [rows, blocks], got shape {codes.shape}")
    if codes.shape[1] == 0:
        hi = np.zeros(codes.shape[0], np.uint16)
        lo = np.full(codes.shape[0], F.E8M0_NAN, np.uint16)
    else:
        hi = codes.max(axis=1).astype(np.uint16)
        lo = codes.min(axis=1).astype(np.uint16)
    return hi | (lo << np.uint16(8))
