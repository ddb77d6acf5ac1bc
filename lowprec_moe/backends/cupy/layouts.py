"""CuPy launchers for the scale swizzle / unswizzle kernels (``raw_kernels/layouts/swizzle.cu``).

Same signatures and results as :mod:`lowprec_moe.backends.numpy.layouts` (byte for byte), for
``cupy.ndarray`` inputs; the layout is documented there. Inputs are made C-contiguous
explicitly (a copy on the device when they are not). Grouped calls run one kernel launch for
all members. CuPy is imported lazily, so importing this module needs no GPU.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from lowprec_moe import kernels
from lowprec_moe.backends.cupy import tables
from lowprec_moe.backends.numpy.layouts import _check_shape, round_up, swizzled_size

__all__ = [
    "swizzle_scales_cp",
    "unswizzle_scales_cp",
    "swizzle_grouped_cp",
    "unswizzle_grouped_cp",
    "swizzle_grouped_buffer_cp",
]

_MODULE = "swizzle"
_THREADS = 256  # must match kSwizzleThreads in swizzle.cu
_MAX_BLOCKS_X = 4096  # grid-stride beyond this
_MAX_BLOCKS_Y = 65535
_META_FIELDS = 4  # (src offset, dst offset, rows, cols) per member


def _cupy():
    import cupy  # noqa: PLC0415

    return cupy


def _check_cupy_uint8(a: Any, name: str, ndim: int | None = None):
    cp = _cupy()
    if not isinstance(a, cp.ndarray):
        kind = "numpy.ndarray" if isinstance(a, np.ndarray) else type(a).__name__
        raise TypeError(f"{name} must be a cupy.ndarray, got {kind}")
    if a.dtype != np.uint8:
        raise TypeError(f"{name}.dtype={a.dtype} must be uint8")
    if ndim is not None and a.ndim != ndim:
        raise ValueError(f"{name}.ndim={a.ndim} (shape {tuple(a.shape)}) must be {ndim}")
    return a


def _row_shape(rows: int, cols: int, transpose: bool) -> tuple[int, int]:
    return (cols, rows) if transpose else (rows, cols)


def _blocks(work: int) -> int:
    return max(1, min(-(-work // _THREADS), _MAX_BLOCKS_X))


def swizzle_scales_cp(scale, *, transpose: bool = False):
    """Pad and swizzle a compact scale matrix on the GPU.

    Parameters
    ----------
    scale : cupy.ndarray, uint8, shape (R, C)
        Compact scale matrix (made C-contiguous if it is not).
    transpose : bool, default False
        True for the MXFP8 columnwise matrix ``[M/32, K]`` (swizzled as its transpose).

    Returns
    -------
    cupy.ndarray, uint8, shape (Rp * Cp,)
        Equal to ``swizzle_scales_np(scale.get(), transpose=transpose)``.
    """
    cp = _cupy()
    scale = _check_cupy_uint8(scale, "scale", ndim=2)
    transpose = bool(transpose)
    with scale.device:
        src = cp.ascontiguousarray(scale)
        rows, cols = _row_shape(*src.shape, transpose)
        rp, cpad = round_up(rows, 128), round_up(cols, 4)
        out = cp.empty(rp * cpad, dtype=cp.uint8)
        if out.size == 0:  # R == 0 or C == 0: nothing to write
            return out
        fn = kernels.get_function(_MODULE, "lpm_swizzle_scales")
        fn((_blocks(out.size // 4),), (_THREADS,),
           (src, out, np.int64(rows), np.int64(cols), np.int64(rp), np.int64(cpad),
            np.int32(transpose)))
        return out


def unswizzle_scales_cp(buf, shape, *, transpose: bool = False):
    """Recover a compact scale matrix from its swizzled buffer on the GPU.

    Parameters
    ----------
    buf : cupy.ndarray, uint8, shape (Rp * Cp,)
        Swizzled buffer (any shape with that many elements).
    shape : tuple of int
        ``(R, C)``, shape of the original compact matrix (before any transpose).
    transpose : bool, default False
        Must match the value used to swizzle.

    Returns
    -------
    cupy.ndarray, uint8, shape ``shape``
        A new C-contiguous compact matrix.

    Raises
    ------
    TypeError
        ``buf`` is not a uint8 cupy.ndarray.
    ValueError
        ``buf.size`` is not the swizzled size of ``shape``.
    """
    cp = _cupy()
    buf = _check_cupy_uint8(buf, "buf")
    shape = _check_shape(shape)
    transpose = bool(transpose)
    rows, cols = _row_shape(*shape, transpose)
    rp, cpad = round_up(rows, 128), round_up(cols, 4)
    if buf.size != rp * cpad:
        raise ValueError(
            f"buf.size={buf.size} does not match shape={shape} "
            f"(transpose={transpose}): expected {rp * cpad} bytes ({rp} x {cpad} padded)"
        )
    with buf.device:
        out = cp.empty(shape, dtype=cp.uint8)
        if out.size == 0:
            return out
        src = cp.ascontiguousarray(buf)
        fn = kernels.get_function(_MODULE, "lpm_unswizzle_scales")
        fn((_blocks(out.size),), (_THREADS,),
           (src, out, np.int64(rows), np.int64(cols), np.int64(rp), np.int64(cpad),
            np.int32(transpose)))
        return out


def _launch_grouped(kernel_name: str, src, dst, meta: np.ndarray, work: Sequence[int],
                    transpose: bool) -> None:
    """One launch over all members; ``work[g]`` is member g's thread count."""
    active = [g for g, w in enumerate(work) if w > 0]
    if not active:
        return
    meta = np.ascontiguousarray(meta[active], dtype=np.int64)
    (meta_d,) = tables.upload(meta)
    grid = (_blocks(max(work)), min(len(active), _MAX_BLOCKS_Y))
    fn = kernels.get_function(_MODULE, kernel_name)
    fn(grid, (_THREADS,), (src, dst, meta_d, np.int32(len(active)), np.int32(transpose)))


def swizzle_grouped_buffer_cp(src, shapes: Sequence, src_offsets=None, *,
                              transpose: bool = False):
    """Swizzle members stored in one flat buffer, in one launch (no gather copy).

    Parameters
    ----------
    src : cupy.ndarray, uint8
        Buffer holding every member's compact matrix, C-contiguous, at byte ``src_offsets[g]``
        (for instance a grouped tensor's rowwise scales ``[M_total, C]`` or its flat columnwise
        scale buffer).
    shapes : sequence of (int, int)
        Compact shape of each member (before any transpose).
    src_offsets : sequence of int, optional
        Byte offset of each member in ``src``; default: members packed back to back.
    transpose : bool, default False
        True for MXFP8 columnwise scales.

    Returns
    -------
    buf : cupy.ndarray, uint8, shape (offsets[-1],)
        Concatenation of the members' swizzled buffers.
    offsets : numpy.ndarray, int64, shape (G + 1,)
        Byte offset of each member in ``buf`` (host array).
    """
    cp = _cupy()
    src = _check_cupy_uint8(src, "src")
    transpose = bool(transpose)
    dims = [_check_shape(s, f"shapes[{g}]") for g, s in enumerate(shapes)]
    compact = [r * c for r, c in dims]
    if src_offsets is None:
        starts = np.zeros(len(dims), dtype=np.int64)
        if dims:
            starts[1:] = np.cumsum(compact[:-1], dtype=np.int64)
    else:
        starts = np.asarray(src_offsets, dtype=np.int64).reshape(-1)
        if starts.size < len(dims):
            raise ValueError(
                f"src_offsets has {starts.size} entries, need one per member ({len(dims)})"
            )
        starts = starts[: len(dims)]
    for g, (s, n) in enumerate(zip(starts, compact)):
        if n and (s < 0 or s + n > src.size):
            raise ValueError(
                f"member {g}: src_offsets[{g}]={int(s)} + {n} bytes exceeds src.size={src.size}"
            )
    sizes = [swizzled_size(r, c, transpose=transpose) for r, c in dims]
    offsets = np.zeros(len(dims) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(sizes, dtype=np.int64)
    with src.device:
        flat = cp.ascontiguousarray(src).reshape(-1)
        # every byte (padding included) is written by the kernel; a member has swizzled
        # bytes exactly when it has compact bytes (R > 0 and C > 0)
        out = cp.empty(int(offsets[-1]), dtype=cp.uint8)
        meta = np.zeros((len(dims), _META_FIELDS), dtype=np.int64)
        for g, (r, c) in enumerate(dims):
            meta[g] = (starts[g], offsets[g], *_row_shape(r, c, transpose))
        work = [size // 4 for size in sizes]
        _launch_grouped("lpm_swizzle_scales_grouped", flat, out, meta, work, transpose)
        return out, offsets


def _common_allocation(members):
    """(flat uint8 view, byte offsets) if all members are C-contiguous views of one allocation.

    The view starts at the lowest member and ends after the highest one, so every member lies
    inside it; it never reaches outside the allocation the members share.
    """
    cp = _cupy()
    nonempty = [m for m in members if m.size]
    if not nonempty:
        return None, None
    mem = nonempty[0].data.mem
    if not all(m.flags.c_contiguous and m.data.mem is mem for m in nonempty):
        return None, None
    lo = min(nonempty, key=lambda m: m.data.ptr)
    extent = max(m.data.ptr + m.nbytes for m in nonempty) - lo.data.ptr
    view = cp.ndarray((extent,), dtype=cp.uint8, memptr=lo.data)
    offs = [m.data.ptr - lo.data.ptr if m.size else 0 for m in members]
    return view, offs


def swizzle_grouped_cp(scales_list: Sequence, *, transpose: bool = False):
    """Swizzle each member separately and concatenate, in one kernel launch.

    Parameters
    ----------
    scales_list : sequence of cupy.ndarray, uint8, shape (R_g, C_g)
        One compact scale matrix per member, all on one GPU. Members that are contiguous views
        of one allocation (rows of a grouped tensor's scales) are read in place; otherwise they
        are first packed into one buffer.
    transpose : bool, default False
        Applies to every member (True for MXFP8 columnwise scales).

    Returns
    -------
    buf : cupy.ndarray, uint8, shape (offsets[-1],)
        Equal to ``swizzle_grouped_np`` of the host copies.
    offsets : numpy.ndarray, int64, shape (G + 1,)
        Byte offset of each member in ``buf`` (host array, like ``GroupedTensor.offsets``).
    """
    cp = _cupy()
    if isinstance(scales_list, (np.ndarray, cp.ndarray)):
        raise TypeError("scales_list must be a sequence of 2-D uint8 arrays, got one ndarray")
    members = [_check_cupy_uint8(s, f"scales_list[{g}]", ndim=2)
               for g, s in enumerate(scales_list)]
    if not members:
        return cp.zeros(0, dtype=cp.uint8), np.zeros(1, dtype=np.int64)
    dev = members[0].device.id
    for g, m in enumerate(members):
        if m.device.id != dev:
            raise ValueError(
                f"scales_list[{g}] is on GPU {m.device.id}, scales_list[0] on GPU {dev}"
            )
    shapes = [tuple(m.shape) for m in members]
    with members[0].device:
        base, offs = _common_allocation(members)
        if base is None:
            nonempty = [m.reshape(-1) for m in members if m.size]
            base = cp.concatenate(nonempty) if nonempty else cp.zeros(0, dtype=cp.uint8)
            offs = None  # packed back to back
        return swizzle_grouped_buffer_cp(base, shapes, offs, transpose=transpose)


def unswizzle_grouped_cp(buf, shapes: Sequence, *, transpose: bool = False):
    """Split a grouped swizzled buffer and unswizzle every member, in one kernel launch.

    Parameters
    ----------
    buf : cupy.ndarray, uint8, 1-D
        Concatenation of the members' swizzled buffers.
    shapes : sequence of (int, int)
        Compact shape of each member (before any transpose).
    transpose : bool, default False
        Must match the value used to swizzle.

    Returns
    -------
    list of cupy.ndarray, uint8
        One C-contiguous compact matrix per member (views into one new buffer).

    Raises
    ------
    ValueError
        ``buf.size`` differs from the sum of the members' swizzled sizes.
    """
    cp = _cupy()
    buf = _check_cupy_uint8(buf, "buf")
    transpose = bool(transpose)
    dims = [_check_shape(s, f"shapes[{g}]") for g, s in enumerate(shapes)]
    sizes = [swizzled_size(r, c, transpose=transpose) for r, c in dims]
    total = sum(sizes)
    if buf.size != total:
        raise ValueError(
            f"buf.size={buf.size} does not match shapes (transpose={transpose}): "
            f"expected {total} bytes, the sum of the members' swizzled sizes {sizes}"
        )
    compact = [r * c for r, c in dims]
    src_off = np.zeros(len(dims) + 1, dtype=np.int64)
    src_off[1:] = np.cumsum(sizes, dtype=np.int64)
    dst_off = np.zeros(len(dims) + 1, dtype=np.int64)
    dst_off[1:] = np.cumsum(compact, dtype=np.int64)
    with buf.device:
        src = cp.ascontiguousarray(buf).reshape(-1)
        out = cp.empty(int(dst_off[-1]), dtype=cp.uint8)
        meta = np.zeros((len(dims), _META_FIELDS), dtype=np.int64)
        for g, (r, c) in enumerate(dims):
            meta[g] = (src_off[g], dst_off[g], *_row_shape(r, c, transpose))
        _launch_grouped("lpm_unswizzle_scales_grouped", src, out, meta, compact, transpose)
        return [out[dst_off[g]:dst_off[g + 1]].reshape(dims[g]) for g in range(len(dims))]
