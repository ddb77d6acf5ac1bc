"""``QuantizedTensor`` and the public ``quantize`` / ``dequantize`` functions (NUMERICS §6)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any


from lowprec_moe import _validate as V
from lowprec_moe import quant_formats
from lowprec_moe.backend import get_xp, is_cupy_array


@dataclass(frozen=True)
class QuantizedTensor:
    """One quantized 2-D tensor ``[M, K]`` with rowwise and/or columnwise copies.

    Attributes
    ----------
    format : {"nvfp4", "mxfp8"}
    shape : (M, K)
        Logical shape (a rank > 2 input is flattened to ``[prod(shape[:-1]), shape[-1]]``).
    fp8_dtype : {"e4m3", "e5m2"} or None
        MXFP8 element type; None for nvfp4.
    rowwise_data, rowwise_scale : uint8 arrays or None
        nvfp4: ``[M, K/2]`` packed E2M1 and ``[M, K/16]`` E4M3 scales.
        mxfp8: ``[M, K]`` fp8 bytes and ``[M, K/32]`` E8M0 scales.
    columnwise_data, columnwise_scale : uint8 arrays or None
        nvfp4: the transpose, ``[K, Mp/2]`` and ``[K, Mp/16]`` with ``Mp = roundup(M, 16)``.
        mxfp8: same layout as x, ``[Mp, K]`` and ``[Mp/32, K]`` with ``Mp = roundup(M, 32)``.
        Rows past M (padding) hold quantized zeros.
    amax_rowwise, amax_columnwise : float32 arrays or None
        nvfp4 global amax: shape ``(1,)`` per tensor, ``(M,)`` / ``(K,)`` when row-scaled.
        None for mxfp8.
    row_scaled, block_2d, rht, stochastic_rounding, seed
        The options the tensor was quantized with (``rht`` marks the columnwise copy as
        Hadamard-transformed; dequantization undoes it).
    """

    format: str
    shape: tuple
    fp8_dtype: str | None = None
    rowwise_data: Any = None
    rowwise_scale: Any = None
    columnwise_data: Any = None
    columnwise_scale: Any = None
    amax_rowwise: Any = None
    amax_columnwise: Any = None
    row_scaled: bool = False
    block_2d: bool = False
    rht: bool = False
    stochastic_rounding: bool = False
    seed: int = 0
    member_index: int = field(default=0, repr=False)

    @property
    def has_rowwise(self) -> bool:
        return self.rowwise_data is not None

    @property
    def has_columnwise(self) -> bool:
        return self.columnwise_data is not None

    @property
    def is_cuda(self) -> bool:
        arr = self.rowwise_data if self.has_rowwise else self.columnwise_data
        return is_cupy_array(arr)

    @property
    def nbytes(self) -> int:
        """Bytes of every stored array (data, scales, amaxes)."""
        return sum(int(a.nbytes) for a in (self.rowwise_data, self.rowwise_scale,
                                            self.columnwise_data, self.columnwise_scale,
                                            self.amax_rowwise, self.amax_columnwise)
                   if a is not None)

    def dequantize(self, direction: str = "rowwise", dtype="float32"):
        """Same as :func:`dequantize` ``(self, direction, dtype)``."""
        return dequantize(self, direction=direction, dtype=dtype)

    def replace(self, **changes) -> "QuantizedTensor":
        """A copy with some fields replaced (arrays are shared, not copied)."""
        return replace(self, **changes)


def quantize(x, format: str, *, rowwise: bool = True, columnwise: bool = False,
             row_scaled: bool = False, block_2d: bool = False, rht: bool = False,
             stochastic_rounding: bool = False, seed: int = 0, fp8_dtype: str = "e4m3",
             check_finite: bool = False) -> QuantizedTensor:
    """Quantize ``x`` to NVFP4 or MXFP8.

    Parameters
    ----------
    x : numpy.ndarray or cupy.ndarray
        float32 / float16 / bfloat16, rank >= 2, viewed as ``[M, K]``. K must be a multiple of
        16 (nvfp4) or 32 (mxfp8); with ``block_2d`` M must be a multiple of the block too.
    format : {"nvfp4", "mxfp8"}
    rowwise, columnwise : bool
        Which copies to produce (see :class:`QuantizedTensor` for the layouts).
    row_scaled : bool
        nvfp4 only: per-row amax for the rowwise copy, per-column amax for the columnwise one.
    block_2d : bool
        16x16 (nvfp4) or 32x32 (mxfp8) tiles share one block scale.
    rht : bool
        nvfp4 only, bfloat16 input: random Hadamard transform on the columnwise copy.
    stochastic_rounding : bool
        nvfp4 only: stochastic rounding of elements with the Philox stream of ``seed``.
    seed : int
        64-bit seed for stochastic rounding.
    fp8_dtype : {"e4m3", "e5m2"}
        mxfp8 element type.
    check_finite : bool
        Reject inputs that contain NaN or inf with a ``ValueError``.

    Returns
    -------
    QuantizedTensor
        Arrays of the same kind (NumPy or CuPy) as ``x``.
    """
    V.check_array("x", x)
    V.check_format(format)
    x2 = V.as_2d(x)
    m, k = x2.shape
    V.check_k(k, format)
    V.check_options(format, rowwise=rowwise, columnwise=columnwise, row_scaled=row_scaled,
                    block_2d=block_2d, rht=rht, stochastic_rounding=stochastic_rounding,
                    fp8_dtype=fp8_dtype, dtype=x.dtype)
    if block_2d and m % V.block_size(format):
        raise ValueError(f"M={m} must be a multiple of {V.block_size(format)} for {format} "
                         "with block_2d=True")
    seed = V.check_seed(seed)
    if check_finite:
        V.check_finite("x", x2)
    return _quantize_2d(x2, format, rowwise=rowwise, columnwise=columnwise,
                        row_scaled=row_scaled, block_2d=block_2d, rht=rht,
                        stochastic_rounding=stochastic_rounding, seed=seed, fp8_dtype=fp8_dtype)


def _quantize_2d(x2, format, *, rowwise, columnwise, row_scaled, block_2d, rht,
                 stochastic_rounding, seed, fp8_dtype, member=0) -> QuantizedTensor:
    """Quantize an already validated ``[M, K]`` array (no checks)."""
    fmt = quant_formats.get(format)
    parts = fmt.quantize(x2, is_cupy_array(x2), rowwise=rowwise, columnwise=columnwise,
                         row_scaled=row_scaled, block_2d=block_2d, rht=rht,
                         stochastic_rounding=stochastic_rounding, seed=seed, fp8_dtype=fp8_dtype,
                         member=member)
    fp8 = fmt.element_type(fp8_dtype)
    return QuantizedTensor(format=format, shape=tuple(int(s) for s in x2.shape), fp8_dtype=fp8,
                           row_scaled=row_scaled, block_2d=block_2d,
                           rht=bool(rht and columnwise), stochastic_rounding=stochastic_rounding,
                           seed=seed, member_index=member, **parts)


def dequantize(q: QuantizedTensor, direction: str = "rowwise", dtype="float32"):
    """Dequantize one copy of ``q`` to ``[M, K]``.

    Parameters
    ----------
    q : QuantizedTensor
    direction : {"rowwise", "columnwise"}
        Which stored copy to decode. The columnwise copy is transposed back (nvfp4), cropped to
        M rows and, when it was Hadamard-transformed, transformed back.
    dtype : {"float32", "bfloat16", "float16"}
        Output dtype; values are computed in float32 and rounded once (RNE).

    Returns
    -------
    array ``[M, K]`` of ``dtype``, NumPy or CuPy like ``q``'s data.
    """
    if not isinstance(q, QuantizedTensor):
        raise TypeError(f"q must be a QuantizedTensor, got {type(q).__name__}")
    V.check_direction(direction)
    dtype = V.check_dequant_dtype(dtype)
    col = direction == "columnwise"
    data = q.columnwise_data if col else q.rowwise_data
    if data is None:
        raise ValueError(f"direction={direction!r}: this QuantizedTensor has no {direction} data")
    fmt = quant_formats.get(q.format)
    fmt.check_copy(q, col)
    out = fmt.dequantize(q, col, is_cupy_array(data))
    return _cast(out, dtype)


def _cast(out, dtype: str):
    if dtype == "float32":
        return out
    if dtype == "bfloat16":
        import ml_dtypes

        return out.astype(ml_dtypes.bfloat16)
    return out.astype(get_xp(out).float16)
