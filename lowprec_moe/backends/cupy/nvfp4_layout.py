"""Host tables of the NVFP4 grouped layout, shared by the quantize and dequantize launchers of
:mod:`lowprec_moe.backends.cupy.nvfp4`."""

from __future__ import annotations

import functools

import numpy as np

from lowprec_moe import formats as F

__all__ = ["TILE_ROWS", "member_table"]

#: Rows of one quantizer tile; must match Q_TM in raw_kernels/nvfp4/nvfp4_tiles.cuh.
TILE_ROWS = 64
assert TILE_ROWS % F.NVFP4_BLOCK == 0  # member_table: column padding adds no tile
_B = F.NVFP4_BLOCK


def member_table(splits):
    """Host int64 arrays of a grouped layout.

    Returns ``(offsets, cw_prefix, tile_prefix)``: row offsets ``[G+1]``; prefix sums of the
    member row counts rounded up to 16 (columnwise storage unit); prefix sums of the number of
    64-row tiles per member (the same over the rows rounded up to 16, since 64 is a multiple of
    16: the columnwise padding adds no tile). Read-only arrays, memoized per splits: a training
    step asks for the same layouts again.
    """
    return _member_table_of(tuple(splits))  # ints or NumPy ints: hashable


@functools.lru_cache(maxsize=256)
def _member_table_of(splits: tuple):
    s = np.asarray(splits, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(s)]).astype(np.int64)
    mp = -(-s // _B) * _B
    cw_prefix = np.concatenate([[0], np.cumsum(mp)]).astype(np.int64)
    tile_prefix = np.concatenate([[0], np.cumsum(-(-s // TILE_ROWS))]).astype(np.int64)
    for a in (offsets, cw_prefix, tile_prefix):
        a.setflags(write=False)
    return offsets, cw_prefix, tile_prefix
