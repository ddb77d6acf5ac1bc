"""Tile lists of the ragged persistent MXFP8 wgrad kernel
(``lowprec_moe.backends.cupy.gemm.balance.ragged_tile_list``), on the CPU."""

from __future__ import annotations

import numpy as np
import pytest

from lowprec_moe.backends.cupy.gemm import balance as B
from lowprec_moe.backends.cupy.gemm.plan import BK


def _loads(lst, length, ctas):
    """Per CTA: the balancing cost of its listed tiles."""
    cost = np.zeros(ctas)
    for i, (g, _) in enumerate(lst.tolist()):
        if g >= 0:
            kt = -(-int(length[g]) // BK)
            cost[i % ctas] += kt + B.TILE_COST if kt else B.ZERO_COST
    return cost


@pytest.mark.parametrize("ctas", [1, 7, 132])
def test_ragged_tile_list_covers_every_tile_once(ctas):
    """Every tile of every included expert appears exactly once, as (expert, row tile *
    n_col_tiles + column tile); excluded experts never; the rest of each CTA's list is (-1, 0)
    padding, after its tiles; the list is a whole number of rounds of ``ctas`` entries."""
    rows = np.array([300, 0, 128, 1, 257, 64])
    length = np.array([100, 0, 0, 6176, 32, 640])
    include = rows > 0
    include[4] = False
    n_col_tiles, bm = 3, 128
    lst = B.ragged_tile_list(rows, length, include, bm, n_col_tiles, ctas)
    assert lst.dtype == np.int32 and lst.ndim == 2 and lst.shape[1] == 2
    assert lst.shape[0] % ctas == 0
    want = sorted((g, rc) for g in range(len(rows)) if include[g]
                  for rc in range(-(-rows[g] // bm) * n_col_tiles))
    got = sorted((g, rc) for g, rc in lst.tolist() if g >= 0)
    assert got == want
    per_cta = lst.reshape(-1, ctas, 2)
    for b in range(ctas):
        g = per_cta[:, b, 0]
        n = int(np.sum(g >= 0))
        assert np.all(g[:n] >= 0) and np.all(g[n:] == -1) and np.all(per_cta[n:, b, 1] == 0)


def test_ragged_tile_list_balances_skewed_split():
    """The skewed benchmark split (24 experts of 100 to 6176 tokens, 8 empty; 12 x 8 tiles
    each) over 132 CTAs: the most loaded CTA is within one longest tile of the mean (the LPT
    bound), and well below expert-order dealing (entry i to CTA i % 132); each CTA runs its
    longest tiles first."""
    splits = np.array([0, 100, 104, 0, 108, 118, 123, 129, 0, 143, 151, 159, 180, 0, 192, 205,
                       239, 0, 259, 283, 346, 0, 389, 441, 596, 0, 718, 893, 0, 1649, 2683,
                       6176])
    length = -(-splits // 32) * 32
    rows = np.full(len(splits), 1536)
    ctas = 132
    lst = B.ragged_tile_list(rows, length, rows > 0, 128, 8, ctas)
    loads = _loads(lst, length, ctas)
    longest = -(-int(length.max()) // BK) + B.TILE_COST
    assert loads.max() <= loads.mean() + longest
    dealt = np.zeros(ctas)
    i = 0
    for g in range(len(splits)):
        kt = -(-int(length[g]) // BK)
        for _ in range(12 * 8):
            dealt[i % ctas] += kt + B.TILE_COST if kt else B.ZERO_COST
            i += 1
    assert loads.max() < 0.95 * dealt.max(), (loads.max(), dealt.max())
    per_cta = lst.reshape(-1, ctas, 2)
    for b in range(ctas):
        kts = [-(-int(length[g]) // BK) for g in per_cta[:, b, 0] if g >= 0]
        assert kts == sorted(kts, reverse=True)


def test_ragged_tile_list_edges():
    """No tiles: an empty list; ctas < 1 is refused."""
    lst = B.ragged_tile_list(np.array([0, 0]), np.array([0, 0]), np.array([False, False]), 128,
                             4, 132)
    assert lst.shape == (0, 2)
    with pytest.raises(ValueError, match="ctas"):
        B.ragged_tile_list(np.array([1]), np.array([64]), np.array([True]), 128, 1, 0)


def test_ragged_tile_table_entries():
    """Each entry of the kernel's table carries its tile's k-tiles, its first k-tile and scale
    group in its CTA's sequences (running sums over the CTA's entries; padding entries hold the
    totals), the last k-tile's length, valid extents, first row / column, tensor-map rows
    (offset / stride) and output offset split in two words."""
    from lowprec_moe.backends.cupy.gemm.plan import (D_A_LD, D_A_OFF, D_A_SLD, D_A_SOFF, D_B_LD, D_B_OFF,
                                            D_B_SLD, D_B_SOFF, D_LEN, D_OUT_OFF, D_ROWS,
                                            DESC_WORDS)

    rows = np.array([300, 300, 300])
    length = np.array([96, 0, 1088])
    desc = np.zeros((3, DESC_WORDS), np.int64)
    desc[:, D_ROWS] = rows
    desc[:, D_LEN] = length
    desc[:, D_A_LD], desc[:, D_B_LD], desc[:, D_A_SLD], desc[:, D_B_SLD] = 320, 544, 320, 544
    starts = np.array([0, 96, 96])
    desc[:, D_A_OFF], desc[:, D_B_OFF] = starts * 320, starts * 544
    desc[:, D_A_SOFF], desc[:, D_B_SOFF] = starts // 32 * 320, starts // 32 * 544
    desc[:, D_OUT_OFF] = np.arange(3) * (3 << 31)  # beyond int32
    ctas, n_cols, nct = 4, 544, 3
    lst = B.ragged_tile_list(rows, length, rows > 0, 128, nct, ctas)
    tab = B.ragged_tile_table(lst, ctas, desc, 128, 256, n_cols, nct)
    assert tab.dtype == np.int32 and tab.shape == (lst.shape[0], B.ENTRY_WORDS)
    per = tab.reshape(-1, ctas, B.ENTRY_WORDS)
    for b in range(ctas):
        j = q = 0
        for e in per[:, b]:
            g, rc = int(e[B.E_EXPERT]), int(e[B.E_RC])
            assert (e[B.E_J0], e[B.E_Q0]) == (j, q)
            if g < 0:
                assert e[B.E_KT] == 0 and e[B.E_ROWS] == 0
                continue
            kt = -(-int(length[g]) // 64)
            r0, c0 = rc // nct * 128, rc % nct * 256
            assert e[B.E_KT] == kt and (e[B.E_R0], e[B.E_C0]) == (r0, c0)
            assert e[B.E_TAIL] == (int(length[g]) - (kt - 1) * 64 if kt else 0)
            assert e[B.E_ROWS] == min(300 - r0, 128) and e[B.E_COLS] == min(n_cols - c0, 256)
            assert (e[B.E_A], e[B.E_B], e[B.E_AS], e[B.E_BS]) == (
                starts[g], starts[g], starts[g] // 32, starts[g] // 32)
            off = (int(e[B.E_OUT_HI]) << 32) | (int(e[B.E_OUT_LO]) & 0xFFFFFFFF)
            assert off == desc[g, D_OUT_OFF]
            j += kt
            q += -(-kt // B.SCALE_TILES)
    # the tail: 96 = one whole k-tile and 32; 1088 = 17 whole k-tiles
    assert set(tab[tab[:, B.E_EXPERT] == 0, B.E_TAIL]) == {32}
    assert set(tab[tab[:, B.E_EXPERT] == 2, B.E_TAIL]) == {64}


def test_scale_tiles_mirror_kernel():
    """SCALE_TILES is the MXFP8 scale group (ENTRY_WORDS is checked against the kernel by the
    generated modules' static_asserts)."""
    from lowprec_moe.backends.cupy.gemm.smem import WMX_SCALE_TILES

    assert B.SCALE_TILES == WMX_SCALE_TILES
