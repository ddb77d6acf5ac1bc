"""GPU backend entry points for ``GroupedTensor`` (one kernel launch covers all members)."""

from __future__ import annotations

from lowprec_moe import quant_formats
from lowprec_moe.backends.cupy import mxfp8 as _mx


def grouped_quantize(x2d, splits, format, *, rowwise, columnwise, row_scaled, block_2d, rht,
                     stochastic_rounding, seed, fp8_dtype, first_member: int = 0,
                     column_sums: bool = False, probs=None) -> dict:
    """Quantize every member of ``x2d`` ``[M_total, K]`` in one launch per kernel stage
    (``column_sums``: also each member's column sums of ``x`` times ``probs``, same pass;
    ``probs`` validated by the caller)."""
    if probs is not None:
        import cupy as cp  # noqa: PLC0415

        probs = cp.ascontiguousarray(probs.astype(cp.float32, copy=False))
    return quant_formats.get(format).grouped_quantize(
        x2d, splits, rowwise=rowwise, columnwise=columnwise, row_scaled=row_scaled,
        block_2d=block_2d, rht=rht, stochastic_rounding=stochastic_rounding, seed=seed,
        fp8_dtype=fp8_dtype, first_member=first_member, column_sums=column_sums, probs=probs)


def grouped_dequantize(gt, direction: str, dtype: str):
    """Dequantize all members of a GroupedTensor to ``[M_total, K]`` of ``dtype``."""
    from lowprec_moe.tensors.quantized_tensor import _cast

    if direction == "rowwise" and gt.rowwise_data is None or \
            direction == "columnwise" and gt.columnwise_data is None:
        raise ValueError(f"direction={direction!r}: this GroupedTensor has no {direction} data")
    return _cast(quant_formats.get(gt.format).grouped_dequantize(gt, direction), dtype)


def grouped_mxfp8_columnwise_from_rowwise(gt, fp8_dtype: str) -> dict:
    """Fused wire-format path of ``GroupedTensor.with_columnwise`` (columnwise fields only)."""
    parts = _mx.grouped_mxfp8_columnwise_from_rowwise(gt, fp8_dtype)
    return {k: v for k, v in parts.items() if k.startswith("columnwise")}
