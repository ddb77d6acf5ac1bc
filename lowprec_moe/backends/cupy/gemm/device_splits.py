"""Launch tables of a grouped GEMM whose splits live on the device.

With ``splits`` a device integer array, nothing about the experts' sizes is known on the host.
What the launch needs from them is computed on the device and never read back (so a call neither
waits for the GPU nor breaks a CUDA-graph capture); the kernels of
``raw_kernels/layouts/splits.cu`` (:mod:`lowprec_moe.backends.cupy.splits_kernels`) build it,
and the array-operation functions here are their NumPy twins:

* the rows of every expert, clamped so that no row outside ``[0, M)`` is ever addressed
  (:func:`lowprec_moe.backends.cupy.splits.clamped_rows`);
* the descriptor table: every split-dependent word of :func:`.plan.descriptors` is affine in the
  expert's first row ``row0`` and its row count, ``desc = static + row0 * c_row0 + rows *
  c_rows`` per column, with host-known integer coefficients (:func:`affine_descriptors` finds
  them from the host plan of any split and checks them on a second one);
* the tile table of an M-grouped GEMM (fprop / dgrad): a fixed number of entries, the most any
  split of M rows over G experts can need (``(M + G (bm - 1)) // bm``), the real tiles first
  in expert order and then padding entries whose row tile lies past every expert's rows, which
  the kernels skip (their tile has no valid row). The K-grouped wgrad has one row tile per
  ``bm`` output rows of every expert whatever the splits, so its table is the host one.

Every function takes the array module ``xp`` (NumPy or CuPy) and uses only operations both
share, so the CPU tests check them against the host tables bit for bit.
"""

from __future__ import annotations

import numpy as np

from lowprec_moe.backends.cupy.gemm.plan import DESC_WORDS, _cdiv
from lowprec_moe.backends.cupy.splits import clamped_rows, max_row_tiles, row_tiles

__all__ = ["affine_descriptors", "clamped_rows", "device_descriptors", "device_tile_table",
           "max_row_tiles"]


def affine_descriptors(desc_of, g: int, m_total: int) -> tuple[np.ndarray, np.ndarray,
                                                                np.ndarray]:
    """``(static, c_row0, c_rows)`` with ``desc_of(splits) == static + row0[:, None] * c_row0
    + splits[:, None] * c_rows`` for every split of ``m_total`` rows over ``g`` experts.

    ``desc_of(splits)`` is the host descriptor table (int64 ``[G, DESC_WORDS]``) of the same
    problem with host splits. The coefficients are read off two probe splits (all rows in the
    first expert; all rows in the last) and checked on a third (the rows spread over every
    expert); a table that is not affine in this form raises ``NotImplementedError``.
    """
    def probe(splits):
        s = np.asarray(splits, np.int64)
        return s, np.concatenate([[0], np.cumsum(s)[:-1]]).astype(np.int64), desc_of(list(s))

    zero = np.zeros(DESC_WORDS, np.int64)
    s_a, r_a, d_a = probe([m_total] + [0] * (g - 1))
    c_rows, c_row0 = zero, zero
    if g > 1 and m_total > 0:
        s_b, r_b, d_b = probe([0] * (g - 1) + [m_total])
        c_rows = (d_a[0] - d_b[0]) // m_total  # expert 0: (row0, rows) (0, M) vs (0, 0)
        # expert 1: (M, 0) vs (0, 0) -- or (0, M) when it is the last
        diff = d_a[1] - d_b[1] - (s_a[1] - s_b[1]) * c_rows
        c_row0 = diff // (r_a[1] - r_b[1])
    static = d_a - r_a[:, None] * c_row0[None, :] - s_a[:, None] * c_rows[None, :]
    spread = [m_total // g] * (g - 1) + [m_total - (g - 1) * (m_total // g)]
    s_c, r_c, d_c = probe(spread)
    for s_, r_, d_ in ((s_a, r_a, d_a), (s_c, r_c, d_c)):
        got = static + r_[:, None] * c_row0[None, :] + s_[:, None] * c_rows[None, :]
        if not np.array_equal(got, d_):
            raise NotImplementedError("device splits: this problem's descriptor table is not "
                                      "affine in the experts' first rows and row counts")
    return static, c_row0, c_rows


def device_descriptors(xp, static_d, c_row0_d, c_rows_d, row0, rows):
    """The descriptor table ``static + row0 * c_row0 + rows * c_rows`` (int64 ``[G, 16]``) from
    device copies of :func:`affine_descriptors`'s arrays and :func:`clamped_rows`."""
    return static_d + row0[:, None] * c_row0_d[None, :] + rows[:, None] * c_rows_d[None, :]


def device_tile_table(xp, rows, m_total: int, bm: int):
    """int32 ``[max_row_tiles, 2]`` (expert, row tile) of an M-grouped launch: the row tiles of
    every expert in expert order, then padding entries ``(0, t)`` with ``t * bm >= M`` (no valid
    row; the kernels skip them)."""
    expert, tile, real, _ = row_tiles(xp, rows, m_total, bm)
    pad = np.int64(_cdiv(m_total, bm))
    out = xp.stack([xp.where(real, expert, 0), xp.where(real, tile, pad)], axis=1)
    return out.astype(xp.int32)
