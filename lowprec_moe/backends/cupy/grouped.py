"""GPU backend entry points for ``GroupedTensor`` (one kernel launch covers all members)."""

from __future__ import annotations

from lowprec_moe.backends.cupy import mxfp8 as _mx
from lowprec_moe.backends.cupy import nvfp4 as _nv


def grouped_quantize(x2d, splits, format, *, rowwise, columnwise, row_scaled, block_2d, rht,
                     stochastic_rounding, seed, fp8_dtype) -> dict:
    """Quantize every member of ``x2d`` ``[M_total, K]`` in one launch per kernel stage."""
    if format == "nvfp4":
        return _nv.grouped_quantize_nvfp4(
            x2d, splits, rowwise=rowwise, columnwise=columnwise, row_scaled=row_scaled,
            block_2d=block_2d, rht=rht, stochastic_rounding=stochastic_rounding, seed=seed)
    return _mx.grouped_quantize_mxfp8(x2d, splits, rowwise=rowwise, columnwise=columnwise,
                                      block_2d=block_2d, fp8_dtype=fp8_dtype)


def grouped_dequantize(gt, direction: str, dtype: str):
    """Dequantize all members of a GroupedTensor to ``[M_total, K]`` of ``dtype``."""
    from lowprec_moe.tensors.quantized_tensor import _cast

    if direction == "rowwise" and gt.rowwise_data is None or \
            direction == "columnwise" and gt.columnwise_data is None:
        raise ValueError(f"direction={direction!r}: this GroupedTensor has no {direction} data")
    if gt.format == "nvfp4":
        out = _nv.grouped_dequantize_nvfp4(gt, direction)
    else:
        out = _mx.grouped_dequantize_mxfp8(gt, direction)
    return _cast(out, dtype)


def grouped_mxfp8_columnwise_from_rowwise(gt, fp8_dtype: str) -> dict:
    """Fused wire-format path of ``GroupedTensor.with_columnwise`` (columnwise fields only)."""
    parts = _mx.grouped_mxfp8_columnwise_from_rowwise(gt, fp8_dtype)
    return {k: v for k, v in parts.items() if k.startswith("columnwise")}
