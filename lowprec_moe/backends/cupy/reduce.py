"""CuPy launcher of the per-expert column sums (``raw_kernels/reduce/reduce.cu``).

:func:`grouped_colsum` has the signature and the semantics of
:func:`lowprec_moe.backends.numpy.reduce.grouped_colsum` (float32 products, float32 sums; a different,
fixed summation order). Two launches cover all experts: column sums of tiles of one expert each
(128 rows by default, or the tiles of a quantize kernel, see :data:`ORDERS`), then the sum of
each expert's tiles in order. The host builds the small int64 tile table from host ``splits``
and uploads it, or, for device splits, array operations build it on the device
(:func:`device_tiles`); the data never leaves the device.
"""

from __future__ import annotations

import numpy as np

from lowprec_moe import formats as F
from lowprec_moe.backends.cupy import launch_helpers as H
from lowprec_moe.backends.cupy import tables
from lowprec_moe.backends.cupy.nvfp4_layout import TILE_ROWS as _NVFP4_TILE_ROWS
from lowprec_moe.backends.cupy.splits import clamped_rows, row_tiles

__all__ = ["MODULE", "ORDERS", "TILE_ROWS", "grouped_colsum", "member_sums", "segment_sum_tiles"]

#: Kernel module (``raw_kernels/reduce/reduce.cu``).
MODULE = "reduce"
#: Rows per tile of the default order, and threads (columns) per CTA.
TILE_ROWS = 128
_THREADS = 256
_SUFFIX = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
#: Summation orders, ``like`` -> (rows per tile, interleave): None the default; ``"mxfp8"`` /
#: ``"nvfp4"`` the order in which that format's quantize kernel sums the columns of its input
#: (``GroupedTensor.quantize_with_column_sums``: MXFP8 per 32-row warp tile, the even and the
#: odd rows apart, then added; NVFP4 per 64-row tile in row order), so a bias gradient has the
#: same bits whether or not dy went through a quantize pass.
ORDERS = {None: (TILE_ROWS, 1), "mxfp8": (F.MXFP8_BLOCK, 2), "nvfp4": (_NVFP4_TILE_ROWS, 1)}


def _tiles(splits, tile_rows: int = TILE_ROWS):
    """Host int64 ``[(row_begin, row_end)] * T`` and tile offsets ``[G+1]``."""
    s = np.asarray(splits, dtype=np.int64).reshape(-1)
    row_off = np.concatenate([[0], np.cumsum(s)])
    per = -(-s // tile_rows)
    tile_off = np.concatenate([[0], np.cumsum(per)])
    g = np.repeat(np.arange(s.size), per)
    j = np.arange(int(tile_off[-1]), dtype=np.int64) - tile_off[g]
    begin = row_off[g] + j * tile_rows
    end = np.minimum(begin + tile_rows, row_off[g + 1])
    return np.stack([begin, end], axis=1).reshape(-1), tile_off


def device_tiles(xp, splits, m_total: int, tile_rows: int = TILE_ROWS):
    """:func:`_tiles` of device splits, built on the device (module
    :mod:`lowprec_moe.backends.cupy.splits`): the same tiles, padded to the most any split of
    ``M`` rows can need with empty ``(0, 0)`` tiles past the experts' last one."""
    row0, rows = clamped_rows(xp, splits, m_total)
    expert, tile, real, tile_end = row_tiles(xp, rows, m_total, tile_rows)
    begin = row0[expert] + tile * tile_rows
    end = xp.minimum(begin + tile_rows, row0[expert] + rows[expert])
    pairs = xp.stack([xp.where(real, begin, 0), xp.where(real, end, 0)], axis=1)
    tile_off = xp.concatenate([xp.zeros(1, dtype=xp.int64), tile_end])
    return pairs.reshape(-1), tile_off


def grouped_colsum(a, splits, probs=None, *, like=None):
    """float32 ``[G, N]`` per-expert column sums of ``a`` ``[M, N]`` (times ``probs`` ``[M]``).

    ``splits``: host integers, or a device integer array (the tables are then built on the
    device; NUMERICS §7.5). ``like``: a key of :data:`ORDERS`, the summation order."""
    import cupy as cp  # noqa: PLC0415

    if like not in ORDERS:
        raise ValueError(f"like={like!r} must be one of {list(ORDERS)}")
    tile_rows, interleave = ORDERS[like]
    name = np.dtype(a.dtype).name
    if name not in _SUFFIX:
        raise TypeError(f"a.dtype={name} is not supported; use one of {', '.join(_SUFFIX)}")
    with a.device:
        a = cp.ascontiguousarray(a)
        m, n = (int(v) for v in a.shape)
        if probs is not None:
            probs = cp.ascontiguousarray(probs.astype(cp.float32, copy=False))
        if isinstance(splits, cp.ndarray):
            d_tiles, d_tile_off = device_tiles(cp, splits, m, tile_rows)
            num_groups, num_tiles = int(splits.size), int(d_tiles.size) // 2
        else:
            tiles, tile_off = _tiles(splits, tile_rows)
            num_groups, num_tiles = len(tile_off) - 1, len(tiles) // 2
        if num_tiles == 0 or n == 0:
            return member_sums(None, None, num_groups, n)
        if not isinstance(splits, cp.ndarray):
            d_tiles, d_tile_off = tables.upload(tiles, tile_off)
        part = cp.empty((num_tiles, n), dtype=cp.float32)
        H.kernel(MODULE, f"lpm_colsum_tiles_{_SUFFIX[name]}")(
            (num_tiles, -(-n // _THREADS)), (_THREADS,),
            (a, np.uint64(0) if probs is None else probs, np.int64(n), d_tiles, part,
             np.int32(interleave)))
        return member_sums(part, d_tile_off, num_groups, n)


def segment_sum_tiles(part, tile_off, out) -> None:
    """``out[g, c] = sum of part[t, c]`` over the tiles of expert ``g``, in tile order (fp32).

    ``part`` float32 ``[T, N]``, ``tile_off`` device int64 ``[G + 1]`` (expert ``g`` owns tiles
    ``tile_off[g] .. tile_off[g+1] - 1``), ``out`` float32 ``[G, N]``, all C-contiguous on the
    current device; experts without tiles get 0. Also used for the activation backward's per-tile
    column sums (fc1's bias gradient).
    """
    num_groups, n = (int(v) for v in out.shape)
    if num_groups * n == 0:
        return
    H.kernel(MODULE, "lpm_segment_sum_tiles")(
        (-(-num_groups * n // _THREADS),), (_THREADS,),
        (part, np.int64(n), tile_off, np.int32(num_groups), out))


def member_sums(tile_sums, tile_off, num_groups: int, n: int):
    """float32 ``[G, N]``: the per-tile column sums a quantize launch wrote (``tile_sums``
    ``[T, N]``, or None when it had no tiles) totalled per member in tile order."""
    cp = H.cupy()
    if tile_sums is None:
        return H.zeros(num_groups * n, cp.float32).reshape(num_groups, n)
    out = cp.empty((num_groups, n), dtype=cp.float32)  # every element written
    segment_sum_tiles(tile_sums, tile_off, out)
    return out
