"""CuPy launchers for the NVFP4 kernels (``raw_kernels/nvfp4/nvfp4.cu``, ``nvfp4_ext.cu``).

Same signatures and results (byte for byte) as :mod:`lowprec_moe.backends.numpy.nvfp4` and the
reference paths of :class:`~lowprec_moe.GroupedTensor`, for ``cupy.ndarray`` inputs:

* :func:`quantize_nvfp4` / :func:`dequantize_nvfp4` -- one tensor;
* :func:`grouped_quantize_nvfp4` / :func:`grouped_dequantize_nvfp4` -- every member of a grouped
  tensor, one launch per kernel stage whatever the number of members.

Quantization runs two kernels on CuPy's current stream: the global amax (per tensor or member;
per row and column when row-scaled; plain and Hadamard-transformed with RHT), then one quantize
pass that reads ``x`` once and writes the rowwise and the columnwise copy. Inputs are made
C-contiguous explicitly (a device copy when they are not, or when their data pointer is not
16-byte aligned, as the vector loads need). Nothing is copied to the host; a grouped call uploads
its small int64 table of member offsets (built from the host split sizes).

Kernel modules: :data:`MODULE` holds the plain kernels, :data:`EXT_MODULE` the quantizers with
stochastic rounding or the RHT. ``"nvfp4_intcvt"`` is :data:`MODULE` built with an integer
fp32 -> E4M3 conversion instead of ``cvt.rn.satfinite.e4m3x2.f32`` (the tests compare both).
"""

from __future__ import annotations

import numpy as np

from lowprec_moe import formats as F
from lowprec_moe.backends.cupy import launch_helpers as H
from lowprec_moe.backends.cupy import splits_kernels, tables
from lowprec_moe.backends.cupy.nvfp4_layout import TILE_ROWS as _TILE_ROWS
from lowprec_moe.backends.cupy.nvfp4_layout import member_table
from lowprec_moe.backends.cupy.reduce import member_sums
from lowprec_moe.backends.cupy.splits import max_row_tiles

__all__ = [
    "MODULE",
    "EXT_MODULE",
    "quantize_nvfp4",
    "dequantize_nvfp4",
    "grouped_quantize_nvfp4",
    "grouped_dequantize_nvfp4",
]

#: Kernel module of the amax, plain quantize and dequantize kernels.
MODULE = "nvfp4"
#: Kernel module of the quantizers with stochastic rounding / RHT.
EXT_MODULE = "nvfp4_ext"

# Must match raw_kernels/nvfp4/nvfp4_common.cuh: its parts nvfp4_scalar.cuh (flags), nvfp4_tiles.cuh
# (tile shape) and nvfp4_amax.cuh (Q_TAB_STRIDE).
_FLAG_ROWWISE = 1
_FLAG_COLWISE = 2
_FLAG_ROW_SCALED = 4
_FLAG_BLOCK2D = 8
_FLAG_RHT = 16
_FLAG_SR = 32
_Q_THREADS = 128
_TILE_COLS = {"float32": 64, "float16": 128, "bfloat16": 128}
_SUFFIX = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
_AMAX_THREADS = 256
_AMAX_UNROLL = 4
_DEQ_THREADS = 256
_DEQ_TILE = 64  # rows and columns of one columnwise-dequantize tile
_TAB_STRIDE = 132  # floats per encode table (Q_TAB_STRIDE)

_B = F.NVFP4_BLOCK
_NULL = np.uint64(0)  # a null device pointer argument


def _roundup(a: int, b: int) -> int:
    return H.cdiv(a, b) * b


def _dtype_key(dtype) -> str:
    name = np.dtype(dtype).name
    if name not in _SUFFIX:
        raise TypeError(f"x.dtype={name} is not supported by the nvfp4 kernels; "
                        f"use one of {', '.join(_SUFFIX)}")
    return name


def _require_cupy(a, name: str):
    cp = H.cupy()
    if not isinstance(a, cp.ndarray):
        raise TypeError(f"{name} must be a cupy.ndarray for the GPU nvfp4 kernels, got "
                        f"{type(a).__name__} (move it explicitly with cupy.asarray)")


def _prep_input(x2d):
    """C-contiguous, 16-byte aligned 2-D CuPy array (copied on the device only when needed)."""
    cp = H.cupy()
    _require_cupy(x2d, "x")
    if x2d.ndim != 2:
        raise ValueError(f"x must be 2-D here, got shape {tuple(x2d.shape)}")
    x = cp.ascontiguousarray(x2d)
    if x.size and x.data.ptr % 16:
        x = x.copy()
    return x


def _prep_bytes(a, name: str, align: int = 8):
    cp = H.cupy()
    _require_cupy(a, name)
    a = cp.ascontiguousarray(a)
    if a.dtype != np.uint8:
        raise TypeError(f"{name}.dtype={a.dtype} must be uint8")
    if a.size and a.data.ptr % align:
        a = a.copy()
    return a


def _i64(v) -> np.int64:
    return np.int64(int(v))


def _i32(v) -> np.int32:
    return np.int32(int(v))


# ------------------------------------------------------------------------------------------
# Quantization core (single tensor: grouped=False, one member of m rows)


def _quantize_core(x, splits, *, grouped: bool, member_base: int, rowwise: bool,
                   columnwise: bool, row_scaled: bool, block_2d: bool, rht: bool,
                   stochastic_rounding: bool, seed: int, amax=None, column_sums: bool = False,
                   probs=None):
    cp = H.cupy()
    key = _dtype_key(x.dtype)
    sfx = _SUFFIX[key]
    m_total, k = (int(s) for s in x.shape)
    if k % _B:
        raise ValueError(f"K={k} must be a multiple of {_B} for nvfp4")
    rowwise, columnwise = bool(rowwise), bool(columnwise)
    rht = bool(rht) and columnwise
    sr = bool(stochastic_rounding)
    n_groups = len(splits)
    tile_cols = _TILE_COLS[key]
    n_ct = H.cdiv(k, tile_cols)
    row_off = None
    if grouped and not isinstance(splits, (list, tuple, np.ndarray)):
        # device splits: the member table [row offsets, rows padded to 16, 64-row tiles] and
        # the columnwise data / scale offsets, built on the device in one launch; sizes for
        # any split of M rows
        member = splits_kernels.offsets(splits, m_total, (_B, _B), _TILE_ROWS,
                                        (_B, _B * k // 2), (_B, k))
        row_off, tile_off = member[0], member[2]
        meta = member[:3].reshape(-1)
        col_offsets = (member[3], member[4])
        cw_total = _B * max_row_tiles(m_total, n_groups, _B)
        # a member's 64-row tiles cover its rows rounded up to 16 (or 64): at most this many
        n_tiles = max_row_tiles(m_total, n_groups, _TILE_ROWS) * n_ct
        g_arg = n_groups
    elif grouped:
        offsets, cw_prefix, tile_prefix = member_table(splits)
        col_offsets = (cw_prefix * (k // 2), cw_prefix * (k // _B)) if columnwise else None
        cw_total = int(cw_prefix[-1])
        n_tiles = int(tile_prefix[-1]) * n_ct
        (meta,) = tables.upload(np.concatenate([offsets, cw_prefix, tile_prefix]))
        tile_off = meta[2 * (n_groups + 1):]
        g_arg = n_groups
    else:  # one member of m_total rows: no table
        cw_total = _roundup(m_total, _B)
        col_offsets = None
        n_tiles = H.cdiv(m_total, _TILE_ROWS) * n_ct  # (padding to 16 adds no 64-row tile)
        meta = _NULL
        g_arg = 0
    m_single = _i64(m_total)

    # ---- amax (+ encode tables of the per-tensor modes, built by the amax kernel's last CTA) --
    tabs = _NULL
    if amax is not None:  # precomputed (validated by the caller): no pass over x
        amax_row, amax_col = amax
        if not row_scaled and n_tiles:
            # The tiled amax kernel on an empty layout (a zero member table: every member has no
            # rows, one CTA, no loads, no atomics): its last CTA builds the encode tables from
            # amax_row / amax_col.
            zbuf = H.zeros(3 * (n_groups + 1) + 2, cp.int64)
            tabs = cp.empty(2 * n_groups * _TAB_STRIDE, dtype=cp.float32)
            H.kernel(MODULE, f"lpm_nvfp4_amax_tiles_{sfx}")(
                (1,), (_Q_THREADS,),
                (x, _i64(k), _i64(0), zbuf[2:] if grouped else _NULL, _i32(g_arg), _i32(1),
                 _i32(_FLAG_RHT), amax_row, amax_col, zbuf[:1], tabs))
    elif row_scaled:
        amax_row = H.zeros(m_total, cp.float32)
        amax_col = H.zeros(n_groups * k, cp.float32)
        if n_tiles:
            H.kernel(MODULE, f"lpm_nvfp4_amax_tiles_{sfx}")(
                (n_tiles,), (_Q_THREADS,),
                (x, _i64(k), m_single, meta, _i32(g_arg), _i32(n_ct), _i32(_FLAG_ROW_SCALED),
                 amax_row, amax_col, _NULL, _NULL))
    elif rht:
        buf = H.zeros(2 * n_groups + 1, cp.uint32)  # amax plain [G], amax RHT [G], counter
        amax_row = buf[:n_groups].view(cp.float32)
        amax_col = buf[n_groups:2 * n_groups].view(cp.float32)
        if n_tiles:
            tabs = cp.empty(2 * n_groups * _TAB_STRIDE, dtype=cp.float32)
            H.kernel(MODULE, f"lpm_nvfp4_amax_tiles_{sfx}")(
                (n_tiles,), (_Q_THREADS,),
                (x, _i64(k), m_single, meta, _i32(g_arg), _i32(n_ct), _i32(_FLAG_RHT),
                 amax_row, amax_col, buf[2 * n_groups:], tabs))
    else:
        buf = H.zeros(n_groups + 1, cp.uint32)  # amax [G], counter
        amax_row = buf[:n_groups].view(cp.float32)
        amax_col = amax_row
        epc = 16 // x.itemsize
        if row_off is not None:  # device splits: one member may hold every row
            max_chunks = (m_total * k) // epc
        else:
            max_chunks = max((int(s) * k) // epc for s in splits) if n_groups else 0
        if n_tiles:  # (then max_chunks > 0)
            tabs = cp.empty(2 * n_groups * _TAB_STRIDE, dtype=cp.float32)
            grid_x = max(1, min(H.cdiv(max_chunks, _AMAX_THREADS * _AMAX_UNROLL), 4 * H.sm_count()))
            H.kernel(MODULE, f"lpm_nvfp4_amax_tensor_{sfx}")(
                (grid_x, n_groups), (_AMAX_THREADS,),
                (x, _i64(k), m_single, meta, _i32(g_arg), amax_row, buf[n_groups:], tabs))

    # ---- quantize ------------------------------------------------------------------------
    row_data = row_scale = col_data = col_scale = None
    if rowwise:
        row_data = cp.empty((m_total, k // 2), dtype=cp.uint8)
        row_scale = cp.empty((m_total, k // _B), dtype=cp.uint8)
    if columnwise:
        col_data = cp.empty(k * cw_total // 2, dtype=cp.uint8)
        col_scale = cp.empty(k * cw_total // _B, dtype=cp.uint8)
    flags = ((_FLAG_ROWWISE if rowwise else 0) | (_FLAG_COLWISE if columnwise else 0)
             | (_FLAG_ROW_SCALED if row_scaled else 0) | (_FLAG_BLOCK2D if block_2d else 0)
             | (_FLAG_RHT if rht else 0) | (_FLAG_SR if sr else 0))
    tile_sums = None
    if column_sums and n_tiles:  # grouped only: the caller checks
        tile_sums = cp.empty((n_tiles // n_ct, k), dtype=cp.float32)
    if n_tiles:
        if sr or rht:
            fn = H.kernel(EXT_MODULE, f"lpm_nvfp4_quantize_ext_{sfx}")
        else:
            fn = H.kernel(MODULE, f"lpm_nvfp4_quantize_{sfx}")
        fn((n_tiles,), (_Q_THREADS,),
           (x, _i64(k), m_single, meta, _i32(g_arg), _i32(n_ct), _i32(flags),
            np.uint32(int(member_base) & 0xFFFFFFFF), np.uint64(int(seed) & 0xFFFFFFFFFFFFFFFF), amax_row, amax_col, tabs,
            row_data if rowwise else _NULL, row_scale if rowwise else _NULL,
            col_data if columnwise else _NULL, col_scale if columnwise else _NULL,
            _NULL if tile_sums is None else tile_sums, _NULL if probs is None else probs))
    sums = member_sums(tile_sums, tile_off, n_groups, k) if column_sums else None
    return dict(row_data=row_data, row_scale=row_scale, col_data=col_data, col_scale=col_scale,
                amax_row=amax_row, amax_col=amax_col, col_offsets=col_offsets, row_off=row_off,
                column_sums=sums)


def quantize_nvfp4(x2d, *, rowwise: bool = True, columnwise: bool = False,
                   row_scaled: bool = False, block_2d: bool = False, rht: bool = False,
                   stochastic_rounding: bool = False, seed: int = 0, member: int = 0) -> dict:
    """Quantize a validated 2-D CuPy array to NVFP4 (GPU twin of the reference function).

    Parameters and result: as :func:`lowprec_moe.backends.numpy.nvfp4.quantize_nvfp4`; every array of
    the result is a ``cupy.ndarray`` on the input's device.
    """
    x = _prep_input(x2d)
    m, k = (int(s) for s in x.shape)
    r = _quantize_core(x, [m], grouped=False, member_base=member, rowwise=rowwise,
                       columnwise=columnwise, row_scaled=row_scaled, block_2d=block_2d, rht=rht,
                       stochastic_rounding=stochastic_rounding, seed=seed)
    out = dict(rowwise_data=None, rowwise_scale=None, columnwise_data=None,
               columnwise_scale=None, amax_rowwise=None, amax_columnwise=None)
    if rowwise:
        out.update(rowwise_data=r["row_data"], rowwise_scale=r["row_scale"],
                   amax_rowwise=r["amax_row"])
    if columnwise:
        mp = _roundup(m, _B)
        out.update(columnwise_data=r["col_data"].reshape(k, mp // 2),
                   columnwise_scale=r["col_scale"].reshape(k, mp // _B),
                   amax_columnwise=r["amax_col"])
    return out


def grouped_quantize_nvfp4(x2d, splits, *, rowwise: bool = True, columnwise: bool = False,
                           row_scaled: bool = False, block_2d: bool = False, rht: bool = False,
                           stochastic_rounding: bool = False, seed: int = 0,
                           amax=None, first_member: int = 0, column_sums: bool = False,
                           probs=None) -> dict:
    """Quantize every member of ``x2d`` ``[M_total, K]`` (rows split by ``splits``).

    One launch per kernel stage covers all members. The result holds the fields of
    ``lowprec_moe.tensors.grouped_tensor._grouped_quantize_reference`` for nvfp4: rowwise data and scales
    ``[M_total, ...]``; flat columnwise data and scales with host int64 ``columnwise_data_offsets``
    / ``columnwise_scale_offsets`` ``[G+1]``; ``amax_rowwise`` ``[G]`` (row-scaled:
    ``[M_total]``) and ``amax_columnwise`` ``[G]`` (row-scaled: ``[G, K]``). Member ``g`` uses
    member index ``first_member + g`` in the stochastic-rounding stream.

    ``amax`` (optional): the precomputed ``(amax_rowwise, amax_columnwise)`` pair, float32 CuPy
    arrays on x's device with the shapes of the result (per tensor ``[G]`` and ``[G]``, the
    columnwise one taken after the RHT when ``rht``; row-scaled ``[M_total]`` and ``[G, K]``),
    equal to what the amax pass would compute; the amax pass over ``x`` is then skipped and the
    arrays are returned as the result's amax fields (a producer kernel fusing the amax, e.g. the
    GroupedMLP activation).

    ``column_sums``: the same pass also sums every member's columns (the bias gradient when
    ``x`` is dy): ``column_sums`` float32 ``[G, K]``, ``sum over member g's rows of x`` (each
    value times ``probs[row]`` first when ``probs``, a C-contiguous float32 CuPy array
    ``[M_total]``, is given), fp32 in a fixed
    order (the rows of each 64-row tile in order, then the tiles in order), equal to
    :func:`lowprec_moe.backends.numpy.reduce.grouped_colsum` to rounding.
    """
    x = _prep_input(x2d)
    m_total, k = (int(s) for s in x.shape)
    device = not isinstance(splits, (list, tuple, np.ndarray)) and hasattr(splits, "device")
    if device:
        if block_2d:
            raise NotImplementedError("block_2d=True with device splits is not implemented (the "
                                      "splits must be multiples of 16, which needs their values "
                                      "on the host)")
    else:
        splits = [int(s) for s in splits]
        if not splits or any(s < 0 for s in splits) or sum(splits) != m_total:
            raise ValueError(f"splits={splits} must be non-negative and sum to M={m_total}")
    n_groups = len(splits)
    if amax is not None:
        amax = _check_amax(amax, x, n_groups, row_scaled)
    r = _quantize_core(x, splits, grouped=True, member_base=first_member, rowwise=rowwise,
                       columnwise=columnwise, row_scaled=row_scaled, block_2d=block_2d, rht=rht,
                       stochastic_rounding=stochastic_rounding, seed=seed, amax=amax,
                       column_sums=column_sums, probs=probs)
    out: dict = {}
    if column_sums:
        out["column_sums"] = r["column_sums"]
    if device:
        out["offsets"] = r["row_off"]
    if rowwise:
        out["rowwise_data"] = r["row_data"]
        out["rowwise_scale"] = r["row_scale"]
    if columnwise:
        out["columnwise_data"] = r["col_data"]
        out["columnwise_scale"] = r["col_scale"]
        out["columnwise_data_offsets"], out["columnwise_scale_offsets"] = r["col_offsets"]
    if rowwise:
        out["amax_rowwise"] = r["amax_row"]
    if columnwise:
        out["amax_columnwise"] = (r["amax_col"].reshape(n_groups, k) if row_scaled
                                  else r["amax_col"])
    return out


def _check_amax(amax, x, n_groups: int, row_scaled: bool):
    """Validate a precomputed ``(amax_rowwise, amax_columnwise)`` pair; returns flat arrays."""
    cp = H.cupy()
    if not isinstance(amax, (tuple, list)) or len(amax) != 2:
        raise TypeError(f"amax={type(amax).__name__} must be a pair (amax_rowwise, "
                        "amax_columnwise) of float32 cupy arrays")
    m_total, k = (int(s) for s in x.shape)
    want = ((m_total,), (n_groups * k,)) if row_scaled else ((n_groups,), (n_groups,))
    names = ("amax_rowwise", "amax_columnwise")
    out = []
    for name, a, size in zip(names, amax, want):
        if not isinstance(a, cp.ndarray):
            raise TypeError(f"amax {name} must be a cupy.ndarray, got {type(a).__name__}")
        if a.dtype != np.float32:
            raise TypeError(f"amax {name}.dtype={a.dtype} must be float32")
        if a.device.id != x.device.id:
            raise ValueError(f"amax {name} is on device {a.device.id} but x is on device "
                             f"{x.device.id}")
        if a.size != size[0] or (row_scaled and name == "amax_columnwise"
                                 and a.shape not in ((n_groups, k), size)) \
                or (a.ndim != 1 and not (row_scaled and name == "amax_columnwise")):
            shape = f"{size} or {(n_groups, k)}" if row_scaled and name == "amax_columnwise" \
                else f"{size}"
            raise ValueError(f"amax {name}.shape={tuple(a.shape)} must be {shape}")
        out.append(cp.ascontiguousarray(a).reshape(-1))
    return tuple(out)


# ------------------------------------------------------------------------------------------
# Dequantization


def _dequant_rowwise(data, scale, amax, amax_mode: int, row_off=None, n_groups: int = 0):
    cp = H.cupy()
    rows, half = (int(s) for s in data.shape)
    cols = 2 * half
    out = cp.empty((rows, cols), dtype=cp.float32)
    nblk = rows * (cols // _B)
    if nblk:
        grid = max(1, min(H.cdiv(nblk, _DEQ_THREADS), 16 * H.sm_count()))
        H.kernel(MODULE, "lpm_nvfp4_dequantize_rowwise")(
            (grid,), (_DEQ_THREADS,),
            (data, scale, amax, _i64(rows), _i64(cols), _i32(amax_mode),
             _NULL if row_off is None else row_off, _i32(n_groups), out))
    return out


def _dequant_columnwise(data, scale, amax, *, k: int, m_single: int, meta, n_groups: int,
                        out_rows: int, n_row_tiles: int, amax_per_col: bool, rht: bool):
    cp = H.cupy()
    out = cp.empty((out_rows, k), dtype=cp.float32)
    n_ct = H.cdiv(k, _DEQ_TILE)
    n_tiles = n_row_tiles * n_ct
    if n_tiles:
        H.kernel(MODULE, "lpm_nvfp4_dequantize_columnwise")(
            (n_tiles,), (_DEQ_THREADS,),
            (data, scale, amax, _i64(k), _i64(m_single), meta, _i32(n_groups), _i32(n_ct),
             _i32(1 if amax_per_col else 0), _i32(1 if rht else 0), out))
    return out


def _prep_amax(amax):
    cp = H.cupy()
    _require_cupy(amax, "amax")
    return cp.ascontiguousarray(amax.astype(cp.float32, copy=False)).reshape(-1)


def dequantize_nvfp4(data, scale, amax, *, columnwise: bool = False, m: int | None = None,
                     rht: bool = False):
    """Dequantize one stored NVFP4 copy to float32 ``[M, K]`` (GPU twin of the reference).

    Rowwise: ``data [M, K/2]``, ``scale [M, K/16]``, ``amax`` ``(1,)`` or ``(M,)``.
    Columnwise: ``data [K, Mp/2]``, ``scale [K, Mp/16]``, ``amax`` ``(1,)`` or ``(K,)``; the result
    is transposed back, cropped to ``m`` rows (all ``Mp`` rows when ``m`` is None) and, with
    ``rht``, inverse-transformed. Non-RHT values are bit-identical to the reference.
    """
    data = _prep_bytes(data, "data")
    scale = _prep_bytes(scale, "scale", align=1)
    amax = _prep_amax(amax)
    if data.ndim != 2 or scale.ndim != 2:
        raise ValueError(f"data and scale must be 2-D, got {tuple(data.shape)} and "
                         f"{tuple(scale.shape)}")
    rows, half = (int(s) for s in data.shape)
    if tuple(scale.shape) != (rows, 2 * half // _B):
        raise ValueError(f"scale.shape={tuple(scale.shape)} does not match data.shape="
                         f"{tuple(data.shape)} (expected {(rows, 2 * half // _B)})")
    if amax.size not in (1, rows):
        raise ValueError(f"amax has {amax.size} values; expected 1 or {rows}")
    per_row = amax.size == rows and rows != 1
    if not columnwise:
        return _dequant_rowwise(data, scale, amax, 1 if per_row else 0)
    k, mp = rows, 2 * half
    m_out = mp if m is None else int(m)
    if not 0 <= m_out <= mp:
        raise ValueError(f"m={m} must be in [0, {mp}] for columnwise data of {mp} padded rows")
    if _roundup(m_out, _B) == mp:
        return _dequant_columnwise(data, scale, amax, k=k, m_single=m_out, meta=_NULL,
                                   n_groups=0, out_rows=m_out,
                                   n_row_tiles=H.cdiv(m_out, _DEQ_TILE), amax_per_col=per_row,
                                   rht=rht)
    # m far below the padded row count: decode all padded rows, keep the first m
    full = _dequant_columnwise(data, scale, amax, k=k, m_single=mp, meta=_NULL, n_groups=0,
                               out_rows=mp, n_row_tiles=H.cdiv(mp, _DEQ_TILE),
                               amax_per_col=per_row, rht=rht)
    return full[:m_out]


def grouped_dequantize_nvfp4(gt, direction: str):
    """Dequantize every member of an nvfp4 ``GroupedTensor`` to float32 ``[M_total, K]``.

    One launch covers all members. ``direction`` is ``"rowwise"`` or ``"columnwise"``.
    """
    m_total, k = (int(s) for s in gt.shape)
    splits = [int(s) for s in gt.splits]
    n_groups = len(splits)
    if direction == "rowwise":
        if gt.rowwise_data is None:
            raise ValueError("direction='rowwise': this GroupedTensor has no rowwise data")
        data = _prep_bytes(gt.rowwise_data, "rowwise_data")
        scale = _prep_bytes(gt.rowwise_scale, "rowwise_scale", align=1)
        amax = _prep_amax(gt.amax_rowwise)
        if gt.row_scaled:
            return _dequant_rowwise(data, scale, amax, 1)
        (offsets,) = tables.upload(np.concatenate([[0], np.cumsum(splits)]))
        return _dequant_rowwise(data, scale, amax, 2, offsets, n_groups)
    if direction != "columnwise":
        raise ValueError(f"direction={direction!r} must be 'rowwise' or 'columnwise'")
    if gt.columnwise_data is None:
        raise ValueError("direction='columnwise': this GroupedTensor has no columnwise data")
    data = _prep_bytes(gt.columnwise_data, "columnwise_data")
    scale = _prep_bytes(gt.columnwise_scale, "columnwise_scale", align=1)
    amax = _prep_amax(gt.amax_columnwise)
    offsets, cw_prefix, tile_prefix = member_table(splits)
    if int(cw_prefix[-1]) * k // 2 != data.size or int(cw_prefix[-1]) * k // _B != scale.size:
        raise ValueError("columnwise buffers do not match the splits and K of this GroupedTensor")
    (meta,) = tables.upload(np.concatenate([offsets, cw_prefix, tile_prefix]))
    return _dequant_columnwise(data, scale, amax, k=k, m_single=0, meta=meta, n_groups=n_groups,
                               out_rows=m_total, n_row_tiles=int(tile_prefix[-1]),
                               amax_per_col=bool(gt.row_scaled), rht=bool(gt.rht))
