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

import dataclasses

import numpy as np

from lowprec_moe.backends.cupy.gemm.plan import DESC_WORDS, _cdiv, plan
from lowprec_moe.tensors.grouped_tensor import columnwise_offsets
from lowprec_moe.backends.cupy.splits import clamped_rows, max_row_tiles, row_tiles

__all__ = ["affine_descriptors", "block_counts", "clamped_rows", "device_descriptors",
           "device_tile_table", "max_row_tiles", "nominal_problem", "probe_plans",
           "probe_splits"]


def _probe_splits(g: int, m_total: int, seed: int, count: int, *,
                  edges: bool = True) -> list[np.ndarray]:
    """Splits of ``m_total`` rows over ``g`` experts that vary every expert's first row, row
    count and block count: the edge cases (with ``edges``), then ``count`` random ones (a fixed
    seed). One expert has one valid split, so its probes are counts up to ``m_total`` (device
    splits that sum to less than M leave rows unowned, and its row count must still be
    read)."""
    rng = np.random.default_rng(seed)
    if g == 1:
        counts = [m_total, max(m_total - 1, 0), min(m_total, 1), m_total // 2] if edges else []
        counts += [int(v) for v in rng.integers(0, m_total + 1, count)]
        return [np.array([c], np.int64) for c in counts]
    out = []
    if edges:
        out += [np.array([m_total] + [0] * (g - 1)), np.array([0] * (g - 1) + [m_total]),
                np.array([m_total // g] * (g - 1) + [m_total - (g - 1) * (m_total // g)])]
        if m_total >= 1:
            out.append(np.array([1, m_total - 1] + [0] * (g - 2)))
            out.append(np.array([m_total - 1] + [0] * (g - 2) + [1]))
    for _ in range(count):
        cuts = np.sort(rng.integers(0, m_total + 1, g - 1))
        out.append(np.diff(np.concatenate([[0], cuts, [m_total]])))
    return [s.astype(np.int64) for s in out]


def probe_splits(g: int, m_total: int) -> list[np.ndarray]:
    """Every probe split :func:`affine_descriptors` plans (the solving and the checking sets):
    edge cases (a one-row expert, all rows in one expert, an even split) and random splits;
    also what the launcher plans to find the copy width every split allows."""
    return _probe_splits(g, m_total, seed=1, count=6) + _check_splits(g, m_total)


def _check_splits(g: int, m_total: int) -> list[np.ndarray]:
    """The second set: random splits only (the edge cases are in the solving set)."""
    return _probe_splits(g, m_total, seed=2, count=4, edges=False)


def block_counts(xp, rows, block: int):
    """``(blk0, blks)``, int64 ``[G]``: each expert's blocks of ``block`` rows (its rows rounded
    up) and the blocks before it."""
    blks = (rows + (block - 1)) // block
    end = xp.cumsum(blks)
    return end - blks, blks


def _terms(s: np.ndarray, m_total: int, block: int) -> np.ndarray:
    """int64 ``[G, 4]``: (row0, rows, blk0, blks) of every expert of host splits ``s``."""
    row0, rows = clamped_rows(np, s, m_total)
    if block:
        blk0, blks = block_counts(np, rows, block)
    else:
        blk0, blks = np.zeros_like(rows), np.zeros_like(rows)
    return np.stack([row0, rows, blk0, blks], axis=1)


def affine_descriptors(desc_of, g: int, m_total: int, block: int = 0):
    """``(static, coef)`` with ``desc_of(splits) == static + terms @ coef`` for every split of
    ``m_total`` rows over ``g`` experts, ``terms[e] = (row0, rows, blk0, blks)`` of expert ``e``
    (its first row and row count; with ``block``, its first block and block count, blocks of
    ``block`` rows rounded up per expert: the padded layout of quantized columnwise copies).

    ``desc_of(splits)`` is the host descriptor table (int64 ``[G, DESC_WORDS]``) of the same
    problem with host splits (planned without checking their sum: one expert's probes hold
    fewer than ``m_total`` rows). ``static`` is int64 ``[G, DESC_WORDS]``, ``coef`` int64
    ``[4, DESC_WORDS]`` (zeros for the block rows without ``block``). The coefficients are
    solved from probe splits (differences of the same expert's words across probes remove
    ``static``) and checked exactly on every probe and on a second set of splits; a table that
    is not affine in this form raises ``NotImplementedError``.
    """
    probes = _probe_splits(g, m_total, seed=1, count=6)
    terms = [_terms(s, m_total, block) for s in probes]
    descs = [np.asarray(desc_of([int(v) for v in s]), np.int64) for s in probes]
    coef = np.zeros((4, DESC_WORDS), np.int64)
    lhs = np.concatenate([t - terms[0] for t in terms[1:]]).astype(np.float64)
    rhs = np.concatenate([d - descs[0] for d in descs[1:]]).astype(np.float64)
    if not block:
        lhs = lhs[:, :2]
    if lhs.size and np.any(lhs):
        sol = np.linalg.lstsq(lhs, rhs, rcond=None)[0]
        coef[:lhs.shape[1]] = np.rint(sol).astype(np.int64)
    static = descs[0] - terms[0] @ coef
    checks = list(zip(terms, descs)) + [
        (_terms(s, m_total, block), np.asarray(desc_of([int(v) for v in s]), np.int64))
        for s in _check_splits(g, m_total)]
    for t, d in checks:
        if not np.array_equal(static + t @ coef, d):
            raise NotImplementedError("device splits: this problem's descriptor table is not "
                                      "affine in the experts' first rows, row counts and "
                                      "block counts")
    return static, coef


def device_descriptors(xp, static_d, coef_d, row0, rows, blk0=None, blks=None):
    """The descriptor table ``static + row0 * coef[0] + rows * coef[1] + blk0 * coef[2] + blks
    * coef[3]`` (int64 ``[G, 16]``) from device copies of :func:`affine_descriptors`'s arrays,
    :func:`clamped_rows` and (when blocks count) :func:`block_counts`."""
    out = static_d + row0[:, None] * coef_d[0][None, :] + rows[:, None] * coef_d[1][None, :]
    if blk0 is not None:
        out = out + blk0[:, None] * coef_d[2][None, :] + blks[:, None] * coef_d[3][None, :]
    return out


def device_tile_table(xp, rows, m_total: int, bm: int):
    """int32 ``[max_row_tiles, 2]`` (expert, row tile) of an M-grouped launch: the row tiles of
    every expert in expert order, then padding entries ``(0, t)`` with ``t * bm >= M`` (no valid
    row; the kernels skip them)."""
    expert, tile, real, _ = row_tiles(xp, rows, m_total, bm)
    pad = np.int64(_cdiv(m_total, bm))
    out = xp.stack([xp.where(real, expert, 0), xp.where(real, tile, pad)], axis=1)
    return out.astype(xp.int32)


def nominal_problem(p, splits):
    """``p`` with host ``splits`` in place of its own (for planning); its grouped token
    operands (x, dy) get the host offsets of ``splits`` over the same buffers."""
    s = tuple(int(v) for v in splits)
    offsets = np.concatenate([[0], np.cumsum(s, dtype=np.int64)])

    def host(op):
        if not hasattr(op, "splits_on_device"):  # an array
            return op
        fields = dict(splits=s, offsets=offsets)
        if op.columnwise_data is not None:
            d_off, s_off = columnwise_offsets(op.format, s, op.shape[1])
            fields.update(columnwise_data_offsets=d_off, columnwise_scale_offsets=s_off)
        return dataclasses.replace(op, **fields)

    return dataclasses.replace(p, splits=s, device_splits=None, offsets=offsets, a=host(p.a),
                               b=host(p.b) if p.mode == "wgrad" else p.b)

def probe_plans(p) -> list:
    """``(problem, plan)`` of device-splits problem ``p`` for every :func:`probe_splits` split:
    what a kernel config must compute to run ``p`` whatever its splits hold (see
    :func:`.select.choose_kernel`)."""
    out = []
    for s in probe_splits(p.num_groups, p.m_total):
        q = nominal_problem(p, s)
        out.append((q, plan(q)))
    return out
