"""TMA eligibility and tensor maps of the grouped-GEMM TMA builds (host side).

``_kk_u`` (swapped-operand NVFP4 kernel) and ``_kk_y`` (warp-specialised NVFP4 kernel) read
their operands through 2-D byte tensor maps (:mod:`lowprec_moe.cuda.tma`); these helpers decide
whether a plan's operands can be mapped and build the maps of a launch. Re-exported by
:mod:`lowprec_moe.cuda.gemm`.
"""

from __future__ import annotations

import numpy as np

from .. import formats as F
from . import tma
from .gemm_plan import BK, CONFIGS, Operand, Plan
from .gemm_smem import WS_SCALE_TILES


def _scales_word_aligned(op: Operand) -> bool:
    """Every k-tile's block-scale bytes of every row start 4-byte aligned (the NVFP4
    swapped-operand kernel copies them with 4-byte cp.async)."""
    return _ptr(op.scale) % 4 == 0 and not np.any(op.soff % 4) and not np.any(op.sld % 4)


def _ptr(arr) -> int:
    """Address of an array's first element (CuPy or NumPy)."""
    buf = arr.data
    return int(buf.ptr) if hasattr(buf, "ptr") else int(arr.ctypes.data)


def _tma_rows_ok(op: Operand, box_rows: int) -> bool:
    """Whether a K-major operand can be read through one 2-D byte tensor map: every expert has
    the same row stride, a multiple of 16 bytes, starts at a whole row of the array, and every
    box of ``box_rows`` rows has int32 row coordinates."""
    ld = op.ld
    if not (ld.size and np.all(ld == ld[0]) and int(ld[0]) > 0
            and int(ld[0]) % tma.STRIDE_ALIGN == 0):
        return False  # (wgrad over empty experts has no rows: stride 0)
    rows = int(op.data.nbytes) // int(ld[0])
    return not np.any(op.off % ld[0]) and rows + box_rows < 2**31


def _use_tma(pl: Plan) -> bool:
    """Whether the NVFP4 swapped-operand kernel can load its data tiles with TMA (the
    ``_kk_u`` build): both operands mapped by :func:`_tma_rows_ok` and one contraction length,
    a multiple of the k-tile, for every expert."""
    length = pl.length
    bt, bw = CONFIGS["t"]
    return (bool(length.size) and bool(np.all(length == length[0])) and int(length[0]) % BK == 0
            and _tma_rows_ok(pl.a, bt) and _tma_rows_ok(pl.b, bw))


def _tma_scale_rows_ok(op: Operand, box_rows: int) -> bool:
    """Whether an NVFP4 operand's block scales can be read through one 2-D byte tensor map in
    boxes of ``WS_SCALE_TILES`` k-tiles (16 bytes) per row: one scale row stride for every
    expert, a multiple of 16 bytes, experts starting at whole scale rows, a 16-byte aligned
    buffer and int32 row coordinates."""
    sld = op.sld
    if op.scale is None or not (sld.size and np.all(sld == sld[0]) and int(sld[0]) > 0):
        return False
    if int(sld[0]) % tma.STRIDE_ALIGN or _ptr(op.scale) % tma.STRIDE_ALIGN:
        return False
    rows = int(op.scale.nbytes) // int(sld[0])
    return not np.any(op.soff % sld[0]) and rows + box_rows < 2**31


def _use_ws_tma(pl: Plan) -> bool:
    """Whether the warp-specialised NVFP4 kernel can load its data tiles and block scales with
    TMA (the ``_kk_y`` build): data and scales of both operands mapped by
    :func:`_tma_rows_ok` / :func:`_tma_scale_rows_ok` and one contraction length, a multiple of
    the k-tile, for every expert."""
    length = pl.length
    bm, bn = CONFIGS["x"]
    return (bool(length.size) and bool(np.all(length == length[0])) and int(length[0]) % BK == 0
            and _tma_rows_ok(pl.a, bm) and _tma_rows_ok(pl.b, bn)
            and _tma_scale_rows_ok(pl.a, bm) and _tma_scale_rows_ok(pl.b, bn))


def _tma_maps(kernel: str, geom: tuple, a_data, a_scale, b_data, b_scale) -> tuple:
    """The tensor maps of a TMA build, each data box one k-tile deep (``BK / 2`` bytes of
    NVFP4): ``_kk_u`` A (tokens) in boxes of 32 rows, B (weights) of 128 rows; ``_kk_y`` A in
    boxes of 128 rows, B of 256, then the two block-scale maps, ``WS_SCALE_TILES`` k-tiles
    (16 bytes) per box row."""
    a_ld, b_ld, inner, a_sld, b_sld = geom
    ws = kernel.endswith("_y")
    box_a, box_b = CONFIGS["x"] if ws else CONFIGS["t"]
    parts = [(a_data, a_ld, inner, BK // 2, box_a), (b_data, b_ld, inner, BK // 2, box_b)]
    if ws:
        s_inner = inner * 2 // F.NVFP4_BLOCK  # scale bytes of a row (contraction / 16)
        s_box = WS_SCALE_TILES * BK // F.NVFP4_BLOCK
        parts += [(a_scale, a_sld, s_inner, s_box, box_a), (b_scale, b_sld, s_inner, s_box, box_b)]
    maps = []
    for arr, ld, extent, box_inner, box_rows in parts:
        rows = int(arr.nbytes) // ld  # int32 coordinates: checked by _use_tma / _use_ws_tma
        maps.append(tma.map_2d_u8(int(arr.data.ptr), extent, rows, ld, box_inner, box_rows))
    return tuple(maps)
