"""Public ``swizzle_scales`` / ``unswizzle_scales`` (NUMERICS §4).

Converts compact block-scale matrices to and from the GEMM-swizzled (cuBLAS / Blackwell
block-scaled) layout, for single tensors and grouped tensors (each member swizzled separately,
buffers concatenated). The layout itself is documented in :mod:`lowprec_moe.backends.numpy.layouts`.
"""

from __future__ import annotations

import numpy as np

from lowprec_moe import quant_formats
from lowprec_moe._validate import check_direction
from lowprec_moe.backend import is_cupy_array
from lowprec_moe.tensors.grouped_tensor import GroupedTensor, columnwise_sizes
from lowprec_moe.tensors.quantized_tensor import QuantizedTensor
from lowprec_moe.backends.numpy import layouts as L

def _impl(name: str, on_gpu: bool):
    if not on_gpu:
        return getattr(L, name + "_np")
    from lowprec_moe.backends.cupy import layouts

    return getattr(layouts, name + "_cp")


def _check_uint8_array(name, a):
    if not (isinstance(a, np.ndarray) or is_cupy_array(a)):
        raise TypeError(f"{name} must be a numpy or cupy array, got {type(a).__name__}")
    if a.dtype != np.uint8:
        raise TypeError(f"{name}.dtype={a.dtype} must be uint8")


def swizzle_scales(scales, direction: str | None = None, *, transpose: bool = False):
    """Swizzle block scales into the GEMM layout.

    Parameters
    ----------
    scales : uint8 array ``[R, C]``, QuantizedTensor or GroupedTensor
        A compact scale matrix, or a tensor whose ``direction`` scales are swizzled.
    direction : {"rowwise", "columnwise"}, optional
        Required for tensors. MXFP8 columnwise scales ``[M/32, K]`` are swizzled as their
        transpose (``transpose`` is set automatically).
    transpose : bool
        For a raw matrix: True for an MXFP8 columnwise scale matrix.

    Returns
    -------
    uint8 array ``[Rp * Cp]``
        For an array or QuantizedTensor.
    (uint8 array, int64 numpy array ``[G+1]``)
        For a GroupedTensor: the concatenated buffer and each member's byte offset.
    """
    if isinstance(scales, (QuantizedTensor, GroupedTensor)):
        check_direction(direction)
        transpose = (direction == "columnwise"
                     and not quant_formats.get(scales.format).columnwise_transposed)
        if isinstance(scales, QuantizedTensor):
            s = scales.columnwise_scale if direction == "columnwise" else scales.rowwise_scale
            if s is None:
                raise ValueError(f"direction={direction!r}: the tensor has no {direction} scales")
            return _impl("swizzle_scales", is_cupy_array(s))(s, transpose=transpose)
        members = _grouped_scale_list(scales, direction)
        on_gpu = any(is_cupy_array(s) for s in members)
        return _impl("swizzle_grouped", on_gpu)(members, transpose=transpose)
    _check_uint8_array("scales", scales)
    if scales.ndim != 2:
        raise ValueError(f"scales must be 2-D, got shape {tuple(scales.shape)}")
    return _impl("swizzle_scales", is_cupy_array(scales))(scales, transpose=transpose)


def unswizzle_scales(buf, shape, *, transpose: bool = False):
    """Inverse of :func:`swizzle_scales`.

    Parameters
    ----------
    buf : uint8 array
        A swizzled buffer.
    shape : (R, C) or list of (R, C)
        Compact shape (before any transpose); a list means a grouped buffer with one shape per
        member, and a list of compact matrices is returned.
    transpose : bool
        True for MXFP8 columnwise scales.
    """
    _check_uint8_array("buf", buf)
    on_gpu = is_cupy_array(buf)
    if isinstance(shape, (list, tuple)) and shape and isinstance(shape[0], (list, tuple)):
        return _impl("unswizzle_grouped", on_gpu)(buf, shape, transpose=transpose)
    return _impl("unswizzle_scales", on_gpu)(buf, shape, transpose=transpose)


def _grouped_scale_list(g: GroupedTensor, direction: str) -> list:
    g._require_host_splits("swizzling a grouped tensor's scales")
    if direction == "rowwise":
        if g.rowwise_scale is None:
            raise ValueError("direction='rowwise': the grouped tensor has no rowwise scales")
        return [g.rowwise_scale[int(g.offsets[i]):int(g.offsets[i + 1])]
                for i in range(g.num_groups)]
    if g.columnwise_scale is None:
        raise ValueError("direction='columnwise': the grouped tensor has no columnwise scales")
    out = []
    for i in range(g.num_groups):
        _, _, _, sshape = columnwise_sizes(g.format, g.splits[i], g.shape[1])
        s0, s1 = int(g.columnwise_scale_offsets[i]), int(g.columnwise_scale_offsets[i + 1])
        out.append(g.columnwise_scale[s0:s1].reshape(sshape))
    return out
