"""Tile lists of the ragged persistent NVFP4 wgrad kernel
(``grouped_gemm_sm90_nvfp4_wgmma_ws_rowpair_tma_ragged_128x256_kk``; entry layout in
``raw_kernels/gemm/grouped_gemm_ragged_list.cuh``).

That kernel runs one CTA per multiprocessor over tiles of different contraction lengths (K-grouped
wgrad: each expert contracts its own tokens). CTA ``b`` runs the entries ``b, b + ctas, ...`` of
its tile list, so the list decides how evenly the CTAs are loaded. On a skewed split one
expert's 96 tiles may contract 97 k-tiles each and another's 2: dealt out in expert order, some
CTAs would get several long tiles. :func:`ragged_tile_list` assigns the tiles longest first,
each to the least-loaded CTA (LPT), with a tile costing its k-tiles plus a fixed
``TILE_COST`` (start, window check, epilogue) and an empty expert's (zeroed) tile
``ZERO_COST``, then pads every CTA's list to the longest with empty entries.
:func:`ragged_tile_table` turns the list into the kernel's table: every entry carries what the
kernel needs of its tile (k-tiles, place in the CTA's k-tile and scale-group sequences, extents,
tensor-map rows, output offset), so the kernel reads one 64-byte entry per tile instead of
chains of dependent loads through the descriptors.
"""

from __future__ import annotations

import heapq

import numpy as np

from lowprec_moe.backends.cupy.gemm.plan import (BK, D_A_LD, D_A_OFF, D_A_SLD, D_A_SOFF, D_B_LD, D_B_OFF, D_B_SLD,
                        D_B_SOFF, D_LEN, D_OUT_OFF, D_ROWS, _cdiv)
from lowprec_moe.backends.cupy.gemm.smem import WMX_SCALE_TILES

#: a tile's fixed cost, in k-tiles, for balancing (H200: ~4-6 us per tile against ~1.1 us per
#: k-tile)
TILE_COST = 4
#: an empty expert's tile (written with zeros), in k-tiles
ZERO_COST = 1
#: k-tiles per scale group (kWmxScaleTiles)
SCALE_TILES = WMX_SCALE_TILES
#: int32 words per entry of the kernel's table (kWmxGEntryWords), and their meaning
ENTRY_WORDS = 16
(E_EXPERT, E_RC, E_KT, E_J0, E_Q0, E_TAIL, E_ROWS, E_COLS, E_R0, E_C0, E_A, E_AS, E_B, E_BS,
 E_OUT_LO, E_OUT_HI) = range(ENTRY_WORDS)


def ragged_tile_list(rows: np.ndarray, length: np.ndarray, include: np.ndarray, bm: int,
                     n_col_tiles: int, ctas: int) -> np.ndarray:
    """The ragged kernel's tile list.

    Parameters
    ----------
    rows, length : numpy.ndarray
        Per expert: output rows and contraction length (elements).
    include : numpy.ndarray of bool
        Experts whose tiles the launch writes.
    bm : int
        Output rows per tile.
    n_col_tiles : int
        Column tiles per row tile.
    ctas : int
        CTAs of the launch (one per multiprocessor), at least 1.

    Returns
    -------
    numpy.ndarray
        int32 ``[entries, 2]``: entry ``i * ctas + b`` is CTA ``b``'s ``i``-th tile, ``(expert,
        row tile * n_col_tiles + column tile)``, or ``(-1, 0)`` past the end of its list;
        ``entries`` is a multiple of ``ctas`` (0 without tiles).
    """
    if ctas < 1:
        raise ValueError(f"ctas must be at least 1, got {ctas}")
    rows = np.asarray(rows, np.int64)
    nrt = np.where(include, _cdiv(rows, bm), 0).astype(np.int64)
    per = nrt * int(n_col_tiles)  # tiles per expert
    g = np.repeat(np.arange(len(rows), dtype=np.int64), per)
    rc = np.arange(int(per.sum()), dtype=np.int64) - np.repeat(np.cumsum(per) - per, per)
    kt = _cdiv(np.asarray(length, np.int64), BK)[g] if g.size else np.zeros(0, np.int64)
    cost = np.where(kt > 0, kt + TILE_COST, ZERO_COST)
    order = np.argsort(-cost, kind="stable")
    heap = [(0, b) for b in range(ctas)]
    lists: list[list[int]] = [[] for _ in range(ctas)]
    for i in order.tolist():
        load, b = heapq.heappop(heap)
        lists[b].append(i)
        heapq.heappush(heap, (load + int(cost[i]), b))
    longest = max(len(x) for x in lists)
    out = np.zeros((longest, ctas, 2), np.int32)
    out[..., 0] = -1
    for b, idx in enumerate(lists):
        if idx:
            out[:len(idx), b, 0] = g[idx]
            out[:len(idx), b, 1] = rc[idx]
    return out.reshape(-1, 2)


def ragged_tile_table(lst: np.ndarray, ctas: int, desc: np.ndarray, bm: int, bn: int,
                      n_cols: int, n_col_tiles: int) -> np.ndarray:
    """The ragged kernel's tile table from a :func:`ragged_tile_list`.

    Parameters
    ----------
    lst : numpy.ndarray
        int32 ``[entries, 2]`` tile list (entry ``i * ctas + b``: CTA ``b``'s ``i``-th tile).
    ctas : int
        CTAs of the launch.
    desc : numpy.ndarray
        The launch's int64 ``[G, 16]`` descriptor table.
    bm, bn : int
        Tile rows and columns.
    n_cols, n_col_tiles : int
        Output columns and column tiles.

    Returns
    -------
    numpy.ndarray
        int32 ``[entries, ENTRY_WORDS]``, per entry: expert (-1: none), row tile *
        n_col_tiles + column tile, k-tiles (0: an empty expert or none), the tile's first k-tile
        and first scale group in its CTA's sequences (an entry past the CTA's tiles: the CTA's
        totals), the contraction's length in its last k-tile (1..64; 0 without k-tiles), valid
        rows and columns, first row and column, the tensor-map rows of A's and B's first lines
        and block lines (offset / stride of data and scales), the output offset (elements; low
        and high word).
    """
    n = lst.shape[0]
    out = np.zeros((n, ENTRY_WORDS), np.int64)
    if n == 0:
        return out.astype(np.int32)
    g = lst[:, 0].astype(np.int64)
    rc = lst[:, 1].astype(np.int64)
    real = g >= 0
    d = desc[np.where(real, g, 0)]
    kt = np.where(real, _cdiv(d[:, D_LEN], BK), 0)
    r0 = (rc // n_col_tiles) * bm
    c0 = (rc % n_col_tiles) * bn
    out[:, E_EXPERT] = g
    out[:, E_RC] = rc
    out[:, E_KT] = kt
    # each CTA's running k-tile and scale-group counts, over its entries in order
    per = kt.reshape(-1, ctas)
    groups = _cdiv(per, SCALE_TILES)
    out[:, E_J0] = (np.cumsum(per, axis=0) - per).reshape(-1)
    out[:, E_Q0] = (np.cumsum(groups, axis=0) - groups).reshape(-1)
    out[:, E_TAIL] = np.where(kt > 0, d[:, D_LEN] - (kt - 1) * BK, 0)
    out[:, E_ROWS] = np.where(real, np.clip(d[:, D_ROWS] - r0, 0, bm), 0)
    out[:, E_COLS] = np.clip(n_cols - c0, 0, bn)
    out[:, E_R0] = r0
    out[:, E_C0] = c0

    def row(off, ld):
        ld = np.where(ld > 0, ld, 1)
        return np.where(real, off // ld, 0)

    out[:, E_A] = row(d[:, D_A_OFF], d[:, D_A_LD])
    out[:, E_AS] = row(d[:, D_A_SOFF], d[:, D_A_SLD])
    out[:, E_B] = row(d[:, D_B_OFF], d[:, D_B_LD])
    out[:, E_BS] = row(d[:, D_B_SOFF], d[:, D_B_SLD])
    off = np.where(real, d[:, D_OUT_OFF], 0)
    out[:, E_OUT_LO] = off & 0xFFFFFFFF
    out[:, E_OUT_HI] = off >> 32
    if np.any(np.abs(out[:, :E_OUT_LO]) >= 2**31):
        raise ValueError("ragged tile table: a coordinate does not fit in int32")
    return _to_int32(out)


def _to_int32(a: np.ndarray) -> np.ndarray:
    """int64 words (each in int32 or uint32 range) as int32 bit patterns."""
    return (a & 0xFFFFFFFF).astype(np.uint32).view(np.int32)
