"""Scale layouts: compact, padded and GEMM-swizzled (NUMERICS §4), NumPy reference.

Every block-scale matrix is ``uint8`` and exists in three layouts.

Compact
    The logical, unpadded, row-major scale matrix a ``QuantizedTensor`` holds: NVFP4 rowwise
    ``[M, K/16]``, NVFP4 columnwise ``[K, M/16]``, MXFP8 rowwise ``[M, K/32]`` (the "row"
    matrices) and MXFP8 columnwise ``[M/32, K]`` (the "transposed" matrix).

Padded
    TE's allocation. A row matrix ``(R, C)`` is zero-padded to
    ``(round_up(R, 128), round_up(C, 4))``. The MXFP8 columnwise matrix ``(M/32, K)`` is
    zero-padded to ``(round_up(M/32, 4), round_up(K, 128))``; select it with ``transpose=True``.

GEMM-swizzled
    The cuBLAS / Blackwell block-scaled layout, a flat ``uint8`` buffer. Take the row matrix
    (for ``transpose=True`` first take the transpose of the compact matrix, so that
    ``r`` = column of ``x`` and ``c`` = M-block), pad it to ``(Rp, Cp) = (round_up(R, 128),
    round_up(C, 4))`` with zeros and cut it into 128 x 4 tiles, stored row-major over
    ``(Rp/128, Cp/4)``, 512 bytes each. Entry ``(r, c)`` lives at byte::

        ((r // 128) * (Cp // 4) + c // 4) * 512      # tile
        + (r % 32) * 16                              # row inside a 32-row sub-tile
        + ((r % 128) // 32) * 4                      # which of the 4 sub-tiles
        + c % 4                                      # column inside the tile

    i.e. the padded matrix viewed as ``(Rp/128, 4, 32, Cp/4, 4)`` with axes
    ``(tile_r, sub, r32, tile_c, cc)`` is stored in axis order ``(tile_r, tile_c, r32, sub, cc)``.
    The buffer holds ``Rp * Cp`` bytes, padding bytes are 0.

Grouped
    A grouped tensor's scales are swizzled member by member (each member padded and swizzled
    on its own) and the buffers concatenated in member order; the byte offset of member ``g``
    is ``offsets[g]``, with ``offsets`` an int64 array of ``G + 1`` entries starting at 0.

All functions are vectorized (reshape / transpose); the only Python loops run over the members
of a group.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from lowprec_moe import formats as F

__all__ = [
    "round_up",
    "padded_scale_shape",
    "swizzled_size",
    "pad_scales",
    "swizzle_scales_np",
    "unswizzle_scales_np",
    "swizzle_grouped_np",
    "unswizzle_grouped_np",
]

_SUB = F.SWIZZLE_SUBTILE_ROWS  # 32
_SUBS_PER_TILE = F.SWIZZLE_TILE_ROWS // F.SWIZZLE_SUBTILE_ROWS  # 4
_TR = F.SWIZZLE_TILE_ROWS  # 128
_TC = F.SWIZZLE_TILE_COLS  # 4


def round_up(n: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is ``>= n`` (``n >= 0``)."""
    return -(-n // multiple) * multiple


def _check_dim(name: str, value) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name}={value!r} must be an int")
    value = int(value)
    if value < 0:
        raise ValueError(f"{name}={value} must be non-negative")
    return value


def _check_shape(shape, name: str = "shape") -> tuple[int, int]:
    try:
        dims = tuple(shape)
    except TypeError:
        raise TypeError(f"{name}={shape!r} must be a (rows, cols) tuple") from None
    if len(dims) != 2:
        raise ValueError(f"{name}={shape!r} must have 2 entries (rows, cols), got {len(dims)}")
    return _check_dim(f"{name}[0]", dims[0]), _check_dim(f"{name}[1]", dims[1])


def _check_scale(scale, name: str = "scale") -> np.ndarray:
    if not isinstance(scale, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(scale).__name__}")
    if scale.dtype != np.uint8:
        raise TypeError(f"{name}.dtype={scale.dtype} must be uint8")
    if scale.ndim != 2:
        raise ValueError(f"{name}.ndim={scale.ndim} (shape {scale.shape}) must be 2")
    return scale


def _row_shape(rows: int, cols: int, transpose: bool) -> tuple[int, int]:
    """Shape of the row matrix (the one the swizzle formula indexes) for a compact shape."""
    return (cols, rows) if transpose else (rows, cols)


def padded_scale_shape(rows: int, cols: int, *, transpose: bool = False) -> tuple[int, int]:
    """Padded allocation shape of a compact scale matrix ``(rows, cols)``.

    Parameters
    ----------
    rows, cols : int
        Shape of the compact scale matrix, as stored.
    transpose : bool, default False
        False for a "row" matrix (NVFP4 rowwise ``[M, K/16]`` or columnwise ``[K, M/16]``,
        MXFP8 rowwise ``[M, K/32]``); True for the MXFP8 columnwise matrix ``[M/32, K]``.

    Returns
    -------
    tuple of int
        ``(round_up(rows, 128), round_up(cols, 4))`` for a row matrix,
        ``(round_up(rows, 4), round_up(cols, 128))`` when ``transpose`` is True. The shape is in
        the orientation of the compact matrix; ``rows * cols`` of the result is the size of the
        swizzled buffer.
    """
    rows = _check_dim("rows", rows)
    cols = _check_dim("cols", cols)
    if transpose:
        return round_up(rows, F.SCALE_PAD_COLS), round_up(cols, F.SCALE_PAD_ROWS)
    return round_up(rows, F.SCALE_PAD_ROWS), round_up(cols, F.SCALE_PAD_COLS)


def swizzled_size(rows: int, cols: int, *, transpose: bool = False) -> int:
    """Number of bytes of the swizzled (or padded) buffer of a compact ``(rows, cols)`` matrix."""
    pr, pc = padded_scale_shape(rows, cols, transpose=transpose)
    return pr * pc


def pad_scales(scale: np.ndarray, *, transpose: bool = False) -> np.ndarray:
    """Zero-pad a compact scale matrix to its padded allocation shape.

    Parameters
    ----------
    scale : numpy.ndarray, uint8, shape (R, C)
        Compact scale matrix.
    transpose : bool, default False
        True for the MXFP8 columnwise matrix ``[M/32, K]`` (see :func:`padded_scale_shape`).

    Returns
    -------
    numpy.ndarray, uint8, shape ``padded_scale_shape(R, C, transpose=transpose)``
        A new C-contiguous array; ``out[:R, :C] == scale`` and every other byte is 0.
    """
    scale = _check_scale(scale)
    pr, pc = padded_scale_shape(*scale.shape, transpose=transpose)
    out = np.zeros((pr, pc), dtype=np.uint8)
    out[: scale.shape[0], : scale.shape[1]] = scale
    return out


def swizzle_scales_np(scale: np.ndarray, *, transpose: bool = False) -> np.ndarray:
    """Pad and swizzle a compact scale matrix into the GEMM (cuBLAS block-scaled) layout.

    Parameters
    ----------
    scale : numpy.ndarray, uint8, shape (R, C)
        Compact scale matrix (any strides).
    transpose : bool, default False
        True for the MXFP8 columnwise matrix ``[M/32, K]``: it is swizzled as its transpose
        ``[K, M/32]``.

    Returns
    -------
    numpy.ndarray, uint8, shape (Rp * Cp,)
        The swizzled buffer, where ``(Rp, Cp)`` is the padded shape of the row matrix
        (``scale`` or ``scale.T``); see the module docstring for the byte of each entry.
    """
    scale = _check_scale(scale)
    row = scale.T if transpose else scale
    r, c = row.shape
    rp, cp = round_up(r, _TR), round_up(c, _TC)
    padded = np.zeros((rp, cp), dtype=np.uint8)
    padded[:r, :c] = row
    tiles = padded.reshape(rp // _TR, _SUBS_PER_TILE, _SUB, cp // _TC, _TC)
    # (tile_r, sub, r32, tile_c, cc) -> (tile_r, tile_c, r32, sub, cc)
    return np.ascontiguousarray(tiles.transpose(0, 3, 2, 1, 4)).reshape(-1)


def unswizzle_scales_np(buf: np.ndarray, shape, *, transpose: bool = False) -> np.ndarray:
    """Recover a compact scale matrix from its swizzled buffer.

    Inverse of :func:`swizzle_scales_np`.

    Parameters
    ----------
    buf : numpy.ndarray, uint8, shape (Rp * Cp,)
        Swizzled buffer (any shape with that many elements is accepted and flattened).
    shape : tuple of int
        ``(R, C)``, the shape of the original compact matrix (before any transpose).
    transpose : bool, default False
        Must match the value used to swizzle.

    Returns
    -------
    numpy.ndarray, uint8, shape ``shape``
        A new C-contiguous compact matrix; the padding is cropped.

    Raises
    ------
    TypeError
        ``buf`` is not a uint8 ndarray.
    ValueError
        ``buf.size`` is not the swizzled size of ``shape``.
    """
    if not isinstance(buf, np.ndarray):
        raise TypeError(f"buf must be a numpy.ndarray, got {type(buf).__name__}")
    if buf.dtype != np.uint8:
        raise TypeError(f"buf.dtype={buf.dtype} must be uint8")
    rows, cols = _check_shape(shape)
    r, c = _row_shape(rows, cols, transpose)
    rp, cp = round_up(r, _TR), round_up(c, _TC)
    if buf.size != rp * cp:
        raise ValueError(
            f"buf.size={buf.size} does not match shape={(rows, cols)} "
            f"(transpose={transpose}): expected {rp * cp} bytes ({rp} x {cp} padded)"
        )
    tiles = buf.reshape(rp // _TR, cp // _TC, _SUB, _SUBS_PER_TILE, _TC)
    # (tile_r, tile_c, r32, sub, cc) -> (tile_r, sub, r32, tile_c, cc)
    padded = tiles.transpose(0, 3, 2, 1, 4).reshape(rp, cp)
    row = padded[:r, :c]
    return np.ascontiguousarray(row.T if transpose else row)


def swizzle_grouped_np(
    scales_list: Sequence[np.ndarray], *, transpose: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Swizzle each member's compact scale matrix separately and concatenate the buffers.

    Parameters
    ----------
    scales_list : sequence of numpy.ndarray, uint8, shape (R_g, C_g)
        One compact scale matrix per member (shapes may differ; empty members allowed).
    transpose : bool, default False
        Applies to every member (True for MXFP8 columnwise scales).

    Returns
    -------
    buf : numpy.ndarray, uint8, shape (offsets[-1],)
        ``concatenate([swizzle_scales_np(s, transpose=transpose) for s in scales_list])``.
    offsets : numpy.ndarray, int64, shape (G + 1,)
        Byte offset of each member's buffer in ``buf``; ``offsets[0] == 0``.
    """
    if isinstance(scales_list, np.ndarray):
        raise TypeError("scales_list must be a sequence of 2-D uint8 arrays, got one ndarray")
    parts = [swizzle_scales_np(_check_scale(s, f"scales_list[{g}]"), transpose=transpose)
             for g, s in enumerate(scales_list)]
    offsets = np.zeros(len(parts) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([p.size for p in parts], dtype=np.int64)
    buf = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint8)
    return buf, offsets


def unswizzle_grouped_np(
    buf: np.ndarray, shapes: Sequence, *, transpose: bool = False
) -> list[np.ndarray]:
    """Split a grouped swizzled buffer and unswizzle each member.

    Parameters
    ----------
    buf : numpy.ndarray, uint8, 1-D
        Concatenation of the members' swizzled buffers, as :func:`swizzle_grouped_np` returns.
    shapes : sequence of (int, int)
        Compact shape of each member (before any transpose).
    transpose : bool, default False
        Must match the value used to swizzle.

    Returns
    -------
    list of numpy.ndarray, uint8
        One compact matrix per member, of shape ``shapes[g]``.

    Raises
    ------
    ValueError
        ``buf.size`` differs from the sum of the members' swizzled sizes.
    """
    if not isinstance(buf, np.ndarray):
        raise TypeError(f"buf must be a numpy.ndarray, got {type(buf).__name__}")
    if buf.dtype != np.uint8:
        raise TypeError(f"buf.dtype={buf.dtype} must be uint8")
    dims = [_check_shape(s, f"shapes[{g}]") for g, s in enumerate(shapes)]
    sizes = [swizzled_size(r, c, transpose=transpose) for r, c in dims]
    total = sum(sizes)
    if buf.size != total:
        raise ValueError(
            f"buf.size={buf.size} does not match shapes (transpose={transpose}): "
            f"expected {total} bytes, the sum of the members' swizzled sizes {sizes}"
        )
    flat = buf.reshape(-1)
    out = []
    start = 0
    for dim, size in zip(dims, sizes):
        out.append(unswizzle_scales_np(flat[start : start + size], dim, transpose=transpose))
        start += size
    return out
