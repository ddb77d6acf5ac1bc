"""Per-expert layouts from splits that live on the device (NUMERICS §7.5).

A grouped entry point given ``splits`` as a device integer array knows only ``M`` and ``G`` on
the host. The tables its kernels read (row offsets, tile lists) are built on the device from the
splits, with array operations that enqueue kernels and never read a value back, so a call
neither waits for the GPU nor breaks a CUDA-graph capture. Splits are not checked against ``M``
(that would need a device-to-host copy); :func:`clamped_rows` makes every table address rows
inside ``[0, M)`` whatever they hold.

Every function takes the array module ``xp`` (NumPy or CuPy) and uses only operations both
share, so the CPU tests compare them with the host tables bit for bit. They are also the twins
of the kernels in ``raw_kernels/layouts/splits.cu`` (:mod:`.splits_kernels`), which build the
GEMM's tables in two launches.
"""

from __future__ import annotations

import numpy as np


def clamped_rows(xp, splits, m_total: int):
    """Per expert ``(row0, rows)``, int64: negative counts act as 0 and counts past ``M`` are cut
    there; for valid splits, the offsets and the splits themselves. (Each count is first cut to
    ``[0, M]``, so the running sum cannot overflow.)"""
    s = xp.minimum(xp.maximum(splits.astype(xp.int64), 0), np.int64(m_total))
    end = xp.minimum(xp.cumsum(s), np.int64(m_total))
    row0 = xp.concatenate([xp.zeros(1, dtype=xp.int64), end[:-1]])
    return row0, end - row0


def max_row_tiles(m_total: int, g: int, rows_per_tile: int) -> int:
    """The most tiles of ``rows_per_tile`` rows (each within one expert) any split of
    ``m_total`` rows over ``g`` experts needs."""
    return (m_total + g * (rows_per_tile - 1)) // rows_per_tile


def row_tiles(xp, rows, m_total: int, rows_per_tile: int):
    """The tiles of ``rows_per_tile`` rows of every expert, in expert order, padded to
    :func:`max_row_tiles` entries.

    Returns
    -------
    expert, tile : int64 arrays ``[max_row_tiles]``
        Entry ``i``'s expert and its tile index within the expert (past the real tiles:
        expert ``G - 1`` and a tile past its rows).
    real : bool array ``[max_row_tiles]``
        Whether entry ``i`` is a real tile.
    tile_end : int64 array ``[G]``
        Cumulative tile counts (expert ``g`` owns entries ``tile_end[g-1] .. tile_end[g] - 1``).
    """
    g = int(rows.shape[0])
    per = (rows + (rows_per_tile - 1)) // rows_per_tile
    tile_end = xp.cumsum(per)
    i = xp.arange(max_row_tiles(m_total, g, rows_per_tile), dtype=xp.int64)
    expert = xp.minimum(xp.searchsorted(tile_end, i, side="right"), g - 1)
    tile = i - (tile_end[expert] - per[expert])
    return expert, tile, i < tile_end[-1], tile_end


def member_tables(xp, splits, m_total: int, rows_per_tile: int):
    """Row offsets and tile offsets (int64 ``[G+1]`` each) of device splits: expert ``g`` owns
    rows ``row_off[g] .. row_off[g+1] - 1`` and tiles ``tile_off[g] .. tile_off[g+1] - 1`` of
    ``rows_per_tile`` rows (the host ``[0, cumsum]`` tables of the clamped splits)."""
    row0, rows = clamped_rows(xp, splits, m_total)
    zero = xp.zeros(1, dtype=xp.int64)
    row_off = xp.concatenate([row0, (row0[-1] + rows[-1]).reshape(1)])
    tile_off = xp.concatenate([zero, xp.cumsum((rows + (rows_per_tile - 1)) // rows_per_tile)])
    return row_off, tile_off


def expert_of_rows(xp, rows, m_total: int):
    """int64 ``[M]``: the expert of every row (rows past the clamped splits: the last
    expert)."""
    g = int(rows.shape[0])
    end = xp.cumsum(rows)
    r = xp.arange(m_total, dtype=xp.int64)
    return xp.minimum(xp.searchsorted(end, r, side="right"), g - 1)
