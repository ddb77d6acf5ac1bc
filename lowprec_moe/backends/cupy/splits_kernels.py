"""Launchers of ``raw_kernels/layouts/splits.cu``: the grouped GEMM's tables from device splits
in two launches (NumPy / CuPy twins: :mod:`.splits`, :mod:`.gemm.device_splits`).

* :func:`offsets` -- clamped row offsets and up to four tile-offset tables ``[G+1]`` (one CTA,
  one launch);
* :func:`gemm_tables` -- the descriptor table (affine in each expert's first row, row count
  and, for block-padded quantized operands, block counts) and, for an M-grouped launch, the
  padded tile table.

Both enqueue on the current stream and read nothing back.
"""

from __future__ import annotations

import numpy as np

from lowprec_moe.backends.cupy import launch_helpers as H

MODULE = "splits"
#: threads per CTA (kSplitsThreads)
THREADS = 256
#: words per descriptor (kDescWords)
DESC_WORDS = 16
#: tile-offset tables one offsets launch writes (kMaxTileTables)
MAX_TILE_TABLES = 4


def offsets(splits, m_total: int, *tables):
    """Row offsets and tile offsets of device splits, in one launch: int64 ``[1 + T, G+1]``.

    Row 0 holds the clamped row offsets; row ``j + 1`` the tile offsets of ``tables[j]``, either
    ``rows_per_tile`` or a pair ``(rows_per_tile, unit)``: the tile offsets times ``unit`` (1
    when not given). Each row equals :func:`lowprec_moe.backends.cupy.splits.member_tables`'
    (times the unit); the rows are one contiguous buffer.
    """
    words = _table_words(tables)
    import cupy as cp

    if splits.dtype == np.int64 or splits.dtype == np.int32:
        s = cp.ascontiguousarray(splits)
    else:
        s = cp.ascontiguousarray(splits.astype(cp.int64))
    g = int(s.size)
    out = cp.empty((len(tables) + 1, g + 1), dtype=cp.int64)
    H.kernel(MODULE, "lpm_splits_offsets")(
        (1,), (THREADS,), (s, np.int32(s.dtype == np.int64), np.int64(g), np.int64(m_total),
                           *words, out))
    return out


_words_of: dict = {}


def _table_words(tables: tuple) -> tuple:
    """The kernel's table arguments (count, then rows / unit pairs), memoized: a call's
    host time is what device splits cost."""
    words = _words_of.get(tables)
    if words is None:
        if not 1 <= len(tables) <= MAX_TILE_TABLES:
            raise ValueError(f"tables={tables!r}: one to {MAX_TILE_TABLES} tile tables per "
                             "launch")
        specs = [t if isinstance(t, tuple) else (t, 1) for t in tables]
        flat = [np.int32(len(specs))]
        for rows, unit in specs + [(1, 0)] * (MAX_TILE_TABLES - len(specs)):
            flat += [np.int64(rows), np.int64(unit)]
        words = _words_of[tables] = tuple(flat)
    return words


def gemm_tables(row_off, tile_off, m_total: int, static_desc, coef, bm: int,
                entries: int | None, blk_off=None):
    """``(desc, tiles)``: the descriptor table int64 ``[G, 16]`` (``static + row0 * coef[0] +
    rows * coef[1]``, plus ``blk0 * coef[2] + blks * coef[3]`` from ``blk_off``, the tile
    offsets of the operands' row blocks, when given) and, with ``entries``, the tile table
    int32 ``[entries, 2]`` (else None) of a launch with ``bm``-row tiles."""
    import cupy as cp

    g = int(row_off.size) - 1
    desc = cp.empty((g, DESC_WORDS), dtype=cp.int64)
    tiles = None if entries is None else cp.empty((entries, 2), dtype=cp.int32)
    n = max(g * DESC_WORDS, entries or 0)
    if n:
        H.kernel(MODULE, "lpm_gemm_split_tables")(
            (-(-n // THREADS),), (THREADS,),
            (row_off, tile_off, blk_off if blk_off is not None else np.uint64(0), np.int64(g),
             np.int64(m_total), static_desc, coef, desc,
             tiles if tiles is not None else np.uint64(0), np.int64(entries or 0),
             np.int64(bm)))
    return desc, tiles
