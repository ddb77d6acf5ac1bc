"""TMA eligibility and tensor maps of the grouped-GEMM TMA builds (host side).

The swapped-operand NVFP4 TMA configs (``..._swap_tma_...``) and the warp-specialised
NVFP4 / MXFP8 TMA configs (``..._ws_tma_...``) read their operands through 2-D byte tensor maps (:mod:`lowprec_moe.backends.cupy.tensor_map`); these helpers decide
whether a plan's operands can be mapped and build the maps of a launch. Re-exported by
:mod:`lowprec_moe.backends.cupy.gemm.launch`.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from lowprec_moe import formats as F
from lowprec_moe.backends.cupy import tensor_map as tma
from lowprec_moe.backends.cupy.gemm.plan import BK, KIND_FP4_K, SWAP_TILE, SWAP_WIDE_TILE, WS_TILE, Operand, Plan
from lowprec_moe.backends.cupy.gemm.smem import WMX_SCALE_TILES, WS_SCALE_TILES


def _scales_word_aligned(op: Operand) -> bool:
    """Every k-tile's block-scale bytes of every row start 4-byte aligned (the NVFP4
    swapped-operand kernel copies them with 4-byte cp.async)."""
    return _ptr(op.scale) % 4 == 0 and not np.any(op.soff % 4) and not np.any(op.sld % 4)


def _ptr(arr) -> int:
    """Address of an array's first element (CuPy or NumPy)."""
    buf = arr.data
    return int(buf.ptr) if hasattr(buf, "ptr") else int(arr.ctypes.data)


def _rows_mappable(arr, ld: np.ndarray, off: np.ndarray, box_rows: int) -> bool:
    """Whether the rows of every expert of ``arr`` (row strides ``ld``, byte offsets ``off``)
    form one 2-D byte tensor map: one row stride for all, positive and a multiple of 16 bytes
    (wgrad over empty experts has no rows: stride 0), at least one row (an MN-major wgrad
    operand of no tokens has none), every expert starting at a whole row, and int32 row
    coordinates for every box of ``box_rows`` rows."""
    if not (ld.size and np.all(ld == ld[0]) and int(ld[0]) > 0
            and int(ld[0]) % tma.STRIDE_ALIGN == 0):
        return False
    rows = int(arr.nbytes) // int(ld[0])
    return rows > 0 and not np.any(off % ld[0]) and rows + box_rows < 2**31


def _tma_rows_ok(op: Operand, box_rows: int) -> bool:
    """Whether a K-major operand's data can be read through one 2-D byte tensor map
    (:func:`_rows_mappable`)."""
    return _rows_mappable(op.data, op.ld, op.off, box_rows)


def _one_length(pl: Plan) -> bool:
    """Every expert contracts the same whole, nonzero number of k-tiles."""
    length = pl.length
    return (bool(length.size) and bool(np.all(length == length[0])) and int(length[0]) > 0
            and int(length[0]) % BK == 0)


def _use_tma(pl: Plan, wide: bool = False) -> bool:
    """Whether the NVFP4 swapped-operand kernel can load its data tiles with TMA (the
    ``swap_tma_32x128`` build; ``wide``: the 256-column ``swap_tma_32x256`` build): both operands mapped by
    :func:`_tma_rows_ok` and :func:`_one_length`."""
    bt, bw = SWAP_WIDE_TILE if wide else SWAP_TILE
    return _one_length(pl) and _tma_rows_ok(pl.a, bt) and _tma_rows_ok(pl.b, bw)


def _tma_scale_rows_ok(op: Operand, box_rows: int) -> bool:
    """Whether an NVFP4 operand's block scales can be read through one 2-D byte tensor map in
    boxes of ``WS_SCALE_TILES`` k-tiles (16 bytes) per row: a 16-byte aligned buffer whose
    scale rows are :func:`_rows_mappable`."""
    if op.scale is None or _ptr(op.scale) % tma.STRIDE_ALIGN:
        return False
    return _rows_mappable(op.scale, op.sld, op.soff, box_rows)


def _ragged_lengths(pl: Plan) -> bool:
    """Every expert contracts a multiple of 16 (MXFP8 wgrad: its tokens padded to 32), not all
    of them nothing: the warp-specialised MXFP8 wgrad build (``ws_tma_128x256_nn``, both operands MN-major,
    one tensor map per operand over every expert's lines) handles a last k-tile that ends
    early."""
    length = pl.length
    return bool(length.size) and bool(np.any(length > 0)) and not np.any(length % 16)


def _use_ws_tma(pl: Plan, ragged: bool = False) -> bool:
    """Whether the warp-specialised NVFP4 / MXFP8 kernel can load its data tiles and block
    scales with TMA (the ``ws_tma`` builds): data and scales of both operands mapped by
    :func:`_tma_rows_ok` / :func:`_tma_scale_rows_ok` and :func:`_one_length`
    (``ragged``, the MXFP8 wgrad build: :func:`_ragged_lengths`)."""
    bm, bn = WS_TILE
    lengths_ok = _ragged_lengths(pl) if ragged else _one_length(pl)
    return (lengths_ok and _tma_rows_ok(pl.a, bm) and _tma_rows_ok(pl.b, bn)
            and _tma_scale_rows_ok(pl.a, bm) and _tma_scale_rows_ok(pl.b, bn))


def tma_geometry(pl: Plan) -> tuple:
    """The plan's facts the TMA configs' tensor maps are built from: (A row stride, B row
    stride, contraction bytes of expert 0, A and B scale row strides, output columns, the most
    output rows of an expert)."""
    a, b = pl.a, pl.b
    return (int(a.ld[0]), int(b.ld[0]), int(pl.length[0]) * a.es_num // a.es_den,
            int(a.sld[0]), int(b.sld[0]), int(pl.n_cols),
            int(pl.rows.max()) if len(pl.rows) else 0)


def tma_map_specs(cfg, geom: tuple) -> list[tuple]:
    """Per tensor map of a TMA config's launch: (operand array, row stride, inner extent, box
    inner bytes, box rows, swizzle), the array named ``"a_data"``, ``"b_data"``, ``"a_scale"``
    or ``"b_scale"``. Each data box is one k-tile deep (``BK / 2`` bytes of NVFP4, ``BK`` of
    MXFP8), the box rows the config's tile: the swapped-operand builds map A (tokens) and B
    (weights) data only; the warp-specialised builds also the two block-scale maps, 16 bytes
    per box row (NVFP4: ``WS_SCALE_TILES`` k-tiles, MXFP8: ``WMX_SCALE_TILES``). MXFP8 K-major
    data boxes (64-byte rows) are stored with the 64-byte swizzle, the raw layout of the
    cp.async kernels. An MN-major B (MXFP8 dgrad / wgrad: lines of ``n_cols`` bytes along the
    contraction) loads as two panels of 128 columns x one k-tile of lines (128-byte swizzle)
    and its scales as ``2 * WMX_SCALE_TILES`` block lines of 256 columns; an MN-major A (MXFP8
    wgrad: lines of ``m_rows`` bytes) as one panel of 128 columns x one k-tile of lines and its
    scales as ``2 * WMX_SCALE_TILES`` block lines of 128 columns."""
    a_ld, b_ld, inner, a_sld, b_sld, n_cols, m_rows = geom
    ws = cfg.role == "ws"
    mx = cfg.fmt == "mxfp8"
    a_mn, b_mn = cfg.a_mn, cfg.b_mn
    box_a, box_b = cfg.bm, cfg.bn
    d_box, swz = (BK, 64) if mx else (BK // 2, 0)
    parts = [("a_data", a_ld, m_rows, box_a, BK, 128) if a_mn else
             ("a_data", a_ld, inner, d_box, box_a, swz)]
    parts.append(("b_data", b_ld, n_cols, box_b // 2, BK, 128) if b_mn else
                 ("b_data", b_ld, inner, d_box, box_b, swz))
    if ws:
        # scale bytes of a row: contraction / 16 (NVFP4: inner = contraction / 2), / 32 (MXFP8)
        s_inner = inner // F.MXFP8_BLOCK if mx else inner * 2 // F.NVFP4_BLOCK
        s_box = (WMX_SCALE_TILES * BK // F.MXFP8_BLOCK if mx
                 else WS_SCALE_TILES * BK // F.NVFP4_BLOCK)
        parts.append(("a_scale", a_sld, m_rows, box_a, s_box, 0) if a_mn else
                     ("a_scale", a_sld, s_inner, s_box, box_a, 0))
        parts.append(("b_scale", b_sld, n_cols, box_b, s_box, 0) if b_mn else
                     ("b_scale", b_sld, s_inner, s_box, box_b, 0))
    return parts


def _tma_maps(cfg, geom: tuple, a_data, a_scale, b_data, b_scale) -> tuple:
    """The tensor maps of a TMA config's launch (:func:`tma_map_specs`), over the whole
    operand arrays."""
    arrays = dict(a_data=a_data, a_scale=a_scale, b_data=b_data, b_scale=b_scale)
    maps = []
    for name, ld, extent, box_inner, box_rows, sw in tma_map_specs(cfg, geom):
        arr = arrays[name]
        rows = int(arr.nbytes) // ld  # int32 coordinates: checked by _use_tma / _use_ws_tma
        maps.append(tma.map_2d_u8(int(arr.data.ptr), extent, rows, ld, box_inner, box_rows, sw))
    return tuple(maps)


# ---- the ragged NVFP4 row-pair TMA config: one row-pair map per operand and expert ------------

#: Row-pair maps of the ragged TMA build on the device, by expert bases and geometry (LRU).
_pair_cache: OrderedDict = OrderedDict()
_PAIR_CACHED = 32
_pair_lock = threading.Lock()


def _pair_experts(pl: Plan) -> np.ndarray:
    """The experts a ragged launch copies data of: rows and a contraction."""
    return np.flatnonzero((pl.rows > 0) & (pl.length > 0))


def _pair_rows_ok(base: int, op: Operand, rows: np.ndarray, live: np.ndarray) -> bool:
    """Whether every live expert's rows of a K-major NVFP4 operand (``rows[g]`` rows of stride
    ``op.ld[g]`` at ``base + op.off[g]``) form a row-pair map: a 16-byte aligned start, an even
    number of rows, pairs of rows a multiple of 16 bytes long (the stride a multiple of 8) and
    int32 coordinates (the odd rows' start ``ld`` past the even rows')."""
    if op.kind != KIND_FP4_K or op.mn:
        return False
    ld, off, r = op.ld[live], op.off[live], rows[live]
    return bool(np.all((base + off) % tma.STRIDE_ALIGN == 0) and np.all(ld > 0)
                and np.all((2 * ld) % tma.STRIDE_ALIGN == 0) and np.all(r % 2 == 0)
                and np.all(2 * ld + BK < 2**31) and np.all(r < 2**31))


def _use_pair_tma(pl: Plan) -> bool:
    """Whether the ragged NVFP4 persistent kernel can load its data tiles through row-pair
    tensor maps (the ``rowpair_tma_ragged`` build): both operands K-major NVFP4 and :func:`_pair_rows_ok`
    for every expert with rows and a contraction (the block scales stay on loads)."""
    live = _pair_experts(pl)
    if not live.size:
        return False
    b_rows = np.full(len(pl.rows), pl.n_cols, np.int64)
    return (_pair_rows_ok(_ptr(pl.a.data), pl.a, pl.rows, live)
            and _pair_rows_ok(_ptr(pl.b.data), pl.b, b_rows, live))


def _pair_geom(pl: Plan) -> tuple:
    """What the row-pair maps depend on besides the data pointers (kept by the launcher)."""
    live = _pair_experts(pl)
    return (len(pl.rows), tuple(int(g) for g in live),
            tuple(int(v) for v in pl.a.off[live]), tuple(int(v) for v in pl.a.ld[live]),
            tuple(int(v) for v in pl.rows[live]),
            tuple(int(v) for v in pl.b.off[live]), tuple(int(v) for v in pl.b.ld[live]),
            int(pl.n_cols))


_templates: dict = {}


def _pair_templates():
    """The four template maps of the ragged TMA build on the current device (cached): boxes
    of ``BK / 2`` bytes (even rows) and ``BK / 2 + 16`` (odd rows) x half of A's 128 rows, then
    the same for B's 256; their address, extents and stride are the builder's to replace."""
    import cupy as cp

    dev = int(cp.cuda.runtime.getDevice())
    hit = _templates.get(dev)
    if hit is None:
        bm, bn = WS_TILE
        anchor = cp.zeros(256, np.uint8)  # a real, aligned device address to encode against
        words = np.stack([np.frombuffer(tma.map_2d_u8(int(anchor.data.ptr), 64, 256, 64,
                                                      BK // 2 + 16 * odd, rows // 2).tobytes(),
                                        np.uint64)
                          for rows in (bm, bn) for odd in (0, 1)])
        hit = _templates[dev] = (cp.asarray(words), anchor)
    return hit[0]


def _pair_maps(geom: tuple, desc, a_data, b_data):
    """The ragged TMA build's tensor maps as a device array ``uint64 [G, 4, 16]`` (expert g: A's
    even-row and odd-row maps, then B's; experts without rows or contraction: zeros, never
    read). Both view one expert's rows as rows of pairs, a pair ``2 ld`` bytes on from the last
    (a multiple of 16 where the rows' stride is only one of 8): the even rows' map ``ld`` bytes
    of each pair (past them it reads zeros) in boxes of ``BK / 2`` bytes, the odd rows' map the
    whole pair in boxes of ``BK / 2 + 16`` bytes (a box must start 16-byte aligned: the kernel
    reads an odd row's k-tile from ``ld % 16`` bytes into its box), each box half the tile's
    rows (raw_kernels/gemm/grouped_gemm_ws_ragged_tma.cuh, WsgTmaLayout). Built on the device from
    :func:`_pair_templates` and the descriptor table ``desc`` (one small kernel, no host
    encoding per expert), cached by the data pointers and ``geom`` (:func:`_pair_geom`)."""
    import cupy as cp

    num_experts, n_cols = geom[0], geom[-1]
    key = (int(cp.cuda.runtime.getDevice()), _ptr(a_data), _ptr(b_data), geom)
    with _pair_lock:
        hit = _pair_cache.get(key)
        if hit is not None:
            _pair_cache.move_to_end(key)
            return hit
    val = cp.zeros((num_experts, 4, tma.MAP_BYTES // 8), np.uint64)
    n = 4 * num_experts
    from lowprec_moe.backends.cupy.gemm.compile import kernel_function
    from lowprec_moe.backends.cupy.gemm.sm90 import PAIR_MAPS_KERNEL, PAIR_MAPS_MODULE

    fn = kernel_function(PAIR_MAPS_MODULE, PAIR_MAPS_KERNEL)
    fn(((n + 127) // 128,), (128,), (_pair_templates(), desc, a_data, b_data,
                                     np.int64(n_cols), np.int32(num_experts), val))
    with _pair_lock:
        _pair_cache[key] = val
        while len(_pair_cache) > _PAIR_CACHED:
            _pair_cache.popitem(last=False)
    return val
