"""CuPy launchers for the MXFP8 kernels (``raw_kernels/mxfp8/mxfp8.cu``, code in ``mxfp8_*.cuh``).

Same signatures and results (byte for byte) as :mod:`lowprec_moe.backends.numpy.mxfp8` and the
reference paths of :class:`~lowprec_moe.GroupedTensor`, for ``cupy.ndarray`` inputs:

* :func:`quantize_mxfp8` / :func:`dequantize_mxfp8` -- one tensor;
* :func:`grouped_quantize_mxfp8` / :func:`grouped_dequantize_mxfp8` -- all members of a grouped
  tensor in one launch;
* :func:`grouped_mxfp8_columnwise_from_rowwise` -- the fused wire-format path of
  ``GroupedTensor.with_columnwise()`` (dequantize -> bf16 -> columnwise quantize, optionally the
  GEMM-swizzled rowwise scales), one launch.

One quantize launch reads ``x`` once and writes every requested copy (rowwise, columnwise or
2-D). Inputs are made C-contiguous explicitly (a device copy when they are not, or when their
data pointer is not 16-byte aligned, as the vector loads need). Kernels run on CuPy's current
stream; nothing is copied to the host except the small member offset tables, which are
uploaded (host -> device) from the host split sizes. CuPy is imported lazily.

Kernel variants: :data:`MODULE` names the kernel module. ``"mxfp8"`` converts fp32 -> fp8 with
the hardware ``cvt.rn.satfinite`` instructions; ``"mxfp8_intcvt"`` exports the same kernels with
a pure integer conversion (slower; the tests compare both against the reference).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lowprec_moe import formats as F
from lowprec_moe.backends.cupy import launch_helpers as H
from lowprec_moe.backends.cupy import splits_kernels, tables
from lowprec_moe.backends.cupy.reduce import member_sums
from lowprec_moe.backends.cupy.splits import max_row_tiles

__all__ = [
    "MODULE",
    "quantize_mxfp8",
    "dequantize_mxfp8",
    "grouped_quantize_mxfp8",
    "grouped_dequantize_mxfp8",
    "grouped_mxfp8_columnwise_from_rowwise",
]

#: Kernel module: "mxfp8" (hardware fp32 -> fp8 conversion) or "mxfp8_intcvt" (integer).
MODULE = "mxfp8"

# Must match raw_kernels/mxfp8/mxfp8_formats.cuh (part of mxfp8_impl.cuh).
_WARPS_PER_CTA = 4
_ROWS_PER_TILE = 32  # = F.MXFP8_BLOCK
_DEQ_THREADS = 256
_DEQ_VEC = 16
_DEQ_MAX_BLOCKS = 1 << 16  # grid-stride over rows beyond this
_FLAG_ROWWISE = 1
_FLAG_COLUMNWISE = 2
_FLAG_BLOCK_2D = 4
_FLAG_E5M2 = 8
_FLAG_WIRE_E5M2 = 16

_QUANTIZE_KERNEL = {
    "float32": "lpm_mxfp8_quantize_f32",
    "float16": "lpm_mxfp8_quantize_f16",
    "bfloat16": "lpm_mxfp8_quantize_bf16",
}
# columns of one warp tile: 16 lanes x 16 bytes of input
_TILE_COLS = {"float32": 64, "float16": 128, "bfloat16": 128}
_FUSED_TILE_COLS = 64  # the fused kernel keeps decoded values as fp32

_B = F.MXFP8_BLOCK
_NULL = np.uint64(0)  # a null device pointer argument


def _check_fp8(fp8_dtype: str) -> int:
    if fp8_dtype not in F.FP8_DTYPES:
        raise ValueError(f"fp8_dtype={fp8_dtype!r} must be one of {F.FP8_DTYPES}")
    return _FLAG_E5M2 if fp8_dtype == "e5m2" else 0


def _dtype_name(a) -> str:
    return np.dtype(a.dtype).name


def _check_cupy(a, name: str):
    cp = H.cupy()
    if not isinstance(a, cp.ndarray):
        kind = "numpy.ndarray" if isinstance(a, np.ndarray) else type(a).__name__
        raise TypeError(f"{name} must be a cupy.ndarray, got {kind}")
    return a


def _prepare(a, name: str, align: int = 16):
    """C-contiguous version of a CuPy array whose data pointer is ``align``-byte aligned."""
    cp = H.cupy()
    a = cp.ascontiguousarray(_check_cupy(a, name))
    if a.size and a.data.ptr % align:
        a = a.copy()  # fresh allocation: aligned
    return a


def grouped_outputs(m: int, k: int, num_tiles: int, rowwise: bool, columnwise: bool) -> dict:
    """Uninitialised buffers of a grouped MXFP8 result: rowwise ``[m, k]`` data and ``[m, k/32]``
    scales, flat columnwise data and scales of ``num_tiles`` 32-row tiles."""
    cp = H.cupy()
    out: dict = {}
    if rowwise:
        out["rowwise_data"] = cp.empty((m, k), dtype=cp.uint8)
        out["rowwise_scale"] = cp.empty((m, k // _B), dtype=cp.uint8)
    if columnwise:
        out["columnwise_data"] = cp.empty(num_tiles * _B * k, dtype=cp.uint8)
        out["columnwise_scale"] = cp.empty(num_tiles * k, dtype=cp.uint8)
    return out


def tile_offsets(splits) -> tuple[np.ndarray, np.ndarray]:
    """Host int64 row offsets [G+1] and columnwise 32-row tile offsets [G+1] of the members."""
    s = np.asarray(splits, dtype=np.int64).reshape(-1)
    rows = np.zeros(s.size + 1, dtype=np.int64)
    rows[1:] = np.cumsum(s)
    tiles = np.zeros(s.size + 1, dtype=np.int64)
    tiles[1:] = np.cumsum(-(-s // _B))
    return rows, tiles


def _upload(*host: np.ndarray):
    """Device views of several host int64 tables (one cached buffer)."""
    return tables.upload(*host)


# ------------------------------------------------------------------------------------------------
# quantize


def _launch_quantize(x2, m_total: int, k: int, num_row_tiles: int, row_off, tile_off,
                     num_groups: int, outs: dict, flags: int, tile_sums=None,
                     probs=None) -> None:
    """One quantize launch; ``tile_sums`` (float32 ``[num_row_tiles, k]`` or None) receives each
    32-row tile's column sums of ``x`` (times ``probs`` ``[m_total]`` float32, or None)."""
    if num_row_tiles == 0 or k == 0:
        return
    name = _dtype_name(x2)
    k_tiles = H.cdiv(k, _TILE_COLS[name])
    warps = num_row_tiles * k_tiles
    grid = (H.cdiv(warps, _WARPS_PER_CTA),)
    H.kernel(MODULE, _QUANTIZE_KERNEL[name])(
        grid, (_WARPS_PER_CTA * 32,),
        (x2, np.int64(m_total), np.int64(k),
         _NULL if row_off is None else row_off, _NULL if tile_off is None else tile_off,
         np.int32(num_groups), np.int64(num_row_tiles),
         outs.get("rowwise_data", _NULL), outs.get("rowwise_scale", _NULL),
         outs.get("columnwise_data", _NULL), outs.get("columnwise_scale", _NULL),
         np.int32(flags), _NULL if tile_sums is None else tile_sums,
         _NULL if probs is None else probs))


def _check_x(x2d, block_2d: bool):
    x2 = _prepare(x2d, "x")
    if x2.ndim != 2:
        raise ValueError(f"x must be 2-D, got shape {tuple(x2.shape)}")
    name = _dtype_name(x2)
    if name not in _QUANTIZE_KERNEL:
        raise TypeError(f"x.dtype={name} is not supported; use one of "
                        f"{', '.join(_QUANTIZE_KERNEL)}")
    m, k = (int(v) for v in x2.shape)
    if k % _B:
        raise ValueError(f"K={k} must be a multiple of {_B} for mxfp8")
    if block_2d and m % _B:
        raise ValueError(f"M={m} must be a multiple of {_B} for mxfp8 with block_2d=True")
    return x2, m, k


def _flags(rowwise: bool, columnwise: bool, block_2d: bool, fp8_dtype: str) -> int:
    if not rowwise and not columnwise:
        raise ValueError("rowwise=False and columnwise=False: nothing to quantize")
    return ((_FLAG_ROWWISE if rowwise else 0) | (_FLAG_COLUMNWISE if columnwise else 0)
            | (_FLAG_BLOCK_2D if block_2d else 0) | _check_fp8(fp8_dtype))


def quantize_mxfp8(x2d, *, rowwise: bool = True, columnwise: bool = False,
                   block_2d: bool = False, fp8_dtype: str = "e4m3") -> dict:
    """Quantize a 2-D CuPy array to MXFP8 (one kernel launch, one read of ``x``).

    Parameters and result as :func:`lowprec_moe.backends.numpy.mxfp8.quantize_mxfp8`:
    ``rowwise_data [M, K]``, ``rowwise_scale [M, K/32]``, ``columnwise_data [Mp, K]``,
    ``columnwise_scale [Mp/32, K]`` (``Mp = roundup(M, 32)``; uint8 CuPy arrays or None),
    ``amax_rowwise`` / ``amax_columnwise`` None.
    """
    cp = H.cupy()
    flags = _flags(rowwise, columnwise, block_2d, fp8_dtype)
    with _check_cupy(x2d, "x").device:
        x2, m, k = _check_x(x2d, block_2d)
        tiles = H.cdiv(m, _B)
        out = dict(rowwise_data=None, rowwise_scale=None, columnwise_data=None,
                   columnwise_scale=None, amax_rowwise=None, amax_columnwise=None)
        if rowwise:
            out["rowwise_data"] = cp.empty((m, k), dtype=cp.uint8)
            out["rowwise_scale"] = cp.empty((m, k // _B), dtype=cp.uint8)
        if columnwise:
            out["columnwise_data"] = cp.empty((tiles * _B, k), dtype=cp.uint8)
            out["columnwise_scale"] = cp.empty((tiles, k), dtype=cp.uint8)
        _launch_quantize(x2, m, k, tiles, None, None, 1,
                         {n: a for n, a in out.items() if a is not None}, flags)
    return out


def grouped_quantize_mxfp8(x2d, splits, *, rowwise: bool = True, columnwise: bool = False,
                           block_2d: bool = False, fp8_dtype: str = "e4m3",
                           column_sums: bool = False, probs=None) -> dict:
    """Quantize every member of ``x2d`` ``[M_total, K]`` (split by rows) in one launch.

    Result as ``GroupedTensor``'s reference path: ``rowwise_data [M_total, K]`` and
    ``rowwise_scale [M_total, K/32]`` (if rowwise); flat ``columnwise_data`` /
    ``columnwise_scale`` with host int64 ``columnwise_data_offsets`` /
    ``columnwise_scale_offsets`` ``[G+1]`` (if columnwise), member g being the columnwise
    storage of its ``[splits[g], K]`` rows padded with zero rows to a multiple of 32.

    ``splits`` may be a device int64 array (validated by the caller; values not read): the
    tables are then built on the device, the columnwise buffers hold the most 32-row tiles any
    split of ``M_total`` rows can need (the tiles past the real ones are written as zeros), and
    the result adds ``offsets``, the device row offsets; the offsets are device arrays.

    ``column_sums``: the same pass also sums every member's columns (the bias gradient when
    ``x`` is dy): ``column_sums`` float32 ``[G, K]``, ``sum over member g's rows of x`` (each
    value times ``probs[row]`` first when ``probs``, a C-contiguous float32 CuPy array
    ``[M_total]``, is given), fp32 in a fixed
    order (per 32-row tile the even rows, the odd rows, their sum; then the tiles in
    order), equal to :func:`lowprec_moe.backends.numpy.reduce.grouped_colsum` to rounding.
    """
    flags = _flags(rowwise, columnwise, block_2d, fp8_dtype)
    with _check_cupy(x2d, "x").device:
        x2, m, k = _check_x(x2d, False)
        if not isinstance(splits, np.ndarray) and hasattr(splits, "device"):
            return _grouped_quantize_device(x2, m, k, splits, rowwise, columnwise, flags,
                                            column_sums, probs)
        s = np.asarray(splits, dtype=np.int64).reshape(-1)
        if s.size == 0 or (s < 0).any() or int(s.sum()) != m:
            raise ValueError(f"splits={s.tolist()} must be non-negative and sum to M={m}")
        if block_2d and (s % _B).any():
            raise ValueError(f"splits={s.tolist()} must all be multiples of {_B} for mxfp8 "
                             "with block_2d=True")
        rows, tiles = tile_offsets(s)
        num_tiles = int(tiles[-1])
        out = grouped_outputs(m, k, num_tiles, rowwise, columnwise)
        tile_sums = tile_off = None
        if num_tiles and k:
            row_off, tile_off = _upload(rows, tiles)
            tile_sums = _tile_sums(num_tiles, k) if column_sums else None
            _launch_quantize(x2, m, k, num_tiles, row_off, tile_off, int(s.size), out, flags,
                             tile_sums, probs)
        if column_sums:
            out["column_sums"] = member_sums(tile_sums, tile_off, int(s.size), k)
        if columnwise:
            out["columnwise_data_offsets"] = tiles * (_B * k)
            out["columnwise_scale_offsets"] = tiles * k
    return out


def _tile_sums(num_tiles: int, k: int):
    """The float32 ``[num_tiles, K]`` buffer of a launch's per-tile column sums."""
    return H.cupy().empty((num_tiles, k), dtype=H.cupy().float32)


def _grouped_quantize_device(x2, m: int, k: int, splits, rowwise: bool, columnwise: bool,
                             flags: int, column_sums: bool = False, probs=None) -> dict:
    if flags & _FLAG_BLOCK_2D:
        raise NotImplementedError("block_2d=True with device splits is not implemented (the "
                                  "splits must be multiples of 32, which needs their values "
                                  "on the host)")
    g = int(splits.size)
    # row and 32-row tile offsets, and the columnwise data / scale offsets, in one launch
    member = splits_kernels.offsets(splits, m, _B, *(((_B, _B * k), (_B, k)) if columnwise
                                                     else ()))
    row_off, tile_off = member[0], member[1]
    num_tiles = max_row_tiles(m, g, _B)
    out = grouped_outputs(m, k, num_tiles, rowwise, columnwise)
    tile_sums = _tile_sums(num_tiles, k) if column_sums and num_tiles and k else None
    if num_tiles and k:
        _launch_quantize(x2, m, k, num_tiles, row_off, tile_off, g, out, flags, tile_sums,
                         probs)
    if column_sums:
        out["column_sums"] = member_sums(tile_sums, tile_off, g, k)
    out["offsets"] = row_off
    if columnwise:
        out["columnwise_data_offsets"], out["columnwise_scale_offsets"] = member[2], member[3]
    return out


# ------------------------------------------------------------------------------------------------
# dequantize


def _launch_dequantize(data, scale, out, rows_out: int, k: int, columnwise: bool, row_off,
                       tile_off, num_groups: int, fp8_dtype: str) -> None:
    if rows_out == 0 or k == 0:
        return
    chunks = k // _DEQ_VEC
    tpr_log2 = min(max(chunks - 1, 0).bit_length(), 8)  # threads per row: pow2 >= chunks, <= 256
    rows_per_cta = _DEQ_THREADS >> tpr_log2
    grid = (max(1, min(H.cdiv(rows_out, rows_per_cta), _DEQ_MAX_BLOCKS)),)
    H.kernel(MODULE, "lpm_mxfp8_dequantize")(
        grid, (_DEQ_THREADS,),
        (data, scale, out, np.int64(rows_out), np.int64(k), np.int32(1 if columnwise else 0),
         _NULL if row_off is None else row_off, _NULL if tile_off is None else tile_off,
         np.int32(num_groups), np.int32(1 if fp8_dtype == "e5m2" else 0), np.int32(tpr_log2)))


def dequantize_mxfp8(data, scale, *, columnwise: bool = False, m: int | None = None,
                     fp8_dtype: str = "e4m3"):
    """Dequantize one stored MXFP8 copy to float32 ``[M, K]`` (``q * 2**(e - 127)``).

    Rowwise: ``data [M, K]``, ``scale [M, K/32]``. Columnwise: ``data [Mp, K]``,
    ``scale [Mp/32, K]``; padding rows are cropped to ``m``. Bit-exact with the reference
    (NaN bytes decode to the reference's NaN bit patterns).
    """
    cp = H.cupy()
    _check_fp8(fp8_dtype)
    with _check_cupy(data, "data").device:
        data = _prepare(data, "data")
        scale = _prepare(scale, "scale")
        if data.dtype != np.uint8 or scale.dtype != np.uint8:
            raise TypeError(f"data.dtype={data.dtype} and scale.dtype={scale.dtype} must be uint8")
        if data.ndim != 2:
            raise ValueError(f"data must be 2-D, got shape {tuple(data.shape)}")
        rows, k = (int(v) for v in data.shape)
        if k % _B:
            raise ValueError(f"K={k} must be a multiple of {_B} for mxfp8")
        if columnwise:
            if rows % _B or tuple(scale.shape) != (rows // _B, k):
                raise ValueError(f"columnwise data.shape={(rows, k)} / scale.shape="
                                 f"{tuple(scale.shape)}: expected [Mp, K] / [Mp/32, K]")
            rows_out = rows if m is None else int(m)
            if not 0 <= rows_out <= rows:
                raise ValueError(f"m={m} must be in [0, {rows}] for data.shape={(rows, k)}")
        else:
            if tuple(scale.shape) != (rows, k // _B):
                raise ValueError(f"scale.shape={tuple(scale.shape)} must be {(rows, k // _B)} "
                                 f"for data.shape={(rows, k)}")
            rows_out = rows
        out = cp.empty((rows_out, k), dtype=cp.float32)
        _launch_dequantize(data, scale, out, rows_out, k, columnwise, None, None, 1, fp8_dtype)
    return out


def grouped_dequantize_mxfp8(gt: Any, direction: str):
    """Dequantize every member of an MXFP8 ``GroupedTensor`` to float32 ``[M_total, K]``.

    One launch. ``direction`` "rowwise" reads the concatenated rowwise buffers; "columnwise"
    reads each member's padded columnwise copy and crops its padding rows.
    """
    cp = H.cupy()
    if direction not in ("rowwise", "columnwise"):
        raise ValueError(f"direction={direction!r} must be 'rowwise' or 'columnwise'")
    m_total, k = (int(v) for v in gt.shape)
    col = direction == "columnwise"
    data = gt.columnwise_data if col else gt.rowwise_data
    scale = gt.columnwise_scale if col else gt.rowwise_scale
    if data is None:
        raise ValueError(f"direction={direction!r}: this GroupedTensor has no {direction} data")
    fp8_dtype = gt.fp8_dtype or "e4m3"
    _check_fp8(fp8_dtype)
    with _check_cupy(data, "data").device:
        data = _prepare(data, "data")
        scale = _prepare(scale, "scale")
        out = cp.empty((m_total, k), dtype=cp.float32)
        if not col:
            _launch_dequantize(data, scale, out, m_total, k, False, None, None, 1, fp8_dtype)
            return out
        rows = np.asarray(gt.offsets, dtype=np.int64)
        if k:
            tiles = np.asarray(gt.columnwise_data_offsets, dtype=np.int64) // (_B * k)
        else:
            tiles = tile_offsets(np.diff(rows))[1]
        if m_total and k:
            row_off, tile_off = _upload(rows, tiles)
            _launch_dequantize(data, scale, out, m_total, k, True, row_off, tile_off,
                               int(rows.size - 1), fp8_dtype)
    return out


# ------------------------------------------------------------------------------------------------
# fused wire rowwise -> columnwise


def grouped_mxfp8_columnwise_from_rowwise(gt: Any, fp8_dtype: str = "e4m3",
                                          swizzle_rowwise: bool = False) -> dict:
    """Columnwise copy of a rowwise MXFP8 ``GroupedTensor`` (the wire format), one launch.

    Per member: dequantize the rowwise data (float32 ``q * 2**(e - 127)``), round to bfloat16
    (RNE), quantize columnwise to MXFP8 ``fp8_dtype`` -- byte for byte what
    ``GroupedTensor.quantize(bf16, splits, "mxfp8", rowwise=False, columnwise=True)`` gives on
    the dequantized input.

    Returns
    -------
    dict
        ``columnwise_data``, ``columnwise_scale`` (flat uint8 CuPy arrays),
        ``columnwise_data_offsets``, ``columnwise_scale_offsets`` (host int64 ``[G+1]``); with
        ``swizzle_rowwise`` also ``rowwise_scale_swizzled`` (flat uint8: each member's rowwise
        scale ``[splits[g], K/32]`` padded and GEMM-swizzled, concatenated, as
        ``swizzle_grouped_np``) and ``rowwise_scale_swizzled_offsets`` (host int64 ``[G+1]``).
    """
    cp = H.cupy()
    flags = _check_fp8(fp8_dtype)
    wire = gt.fp8_dtype or "e4m3"
    if wire not in F.FP8_DTYPES:
        raise ValueError(f"gt.fp8_dtype={wire!r} must be one of {F.FP8_DTYPES}")
    if wire == "e5m2":
        flags |= _FLAG_WIRE_E5M2
    if gt.format != "mxfp8" or gt.rowwise_data is None:
        raise ValueError("grouped_mxfp8_columnwise_from_rowwise needs an mxfp8 GroupedTensor "
                         "with rowwise data")
    m_total, k = (int(v) for v in gt.shape)
    with _check_cupy(gt.rowwise_data, "rowwise_data").device:
        data = _prepare(gt.rowwise_data, "rowwise_data", align=4)
        scale = _prepare(gt.rowwise_scale, "rowwise_scale", align=1)
        s = np.asarray(gt.splits, dtype=np.int64).reshape(-1)
        rows, tiles = tile_offsets(s)
        num_tiles = int(tiles[-1])
        kb = k // _B
        swz = np.zeros(s.size + 1, dtype=np.int64)
        swz[1:] = np.cumsum(-(-s // F.SWIZZLE_TILE_ROWS) * F.SWIZZLE_TILE_ROWS
                            * (H.cdiv(kb, F.SWIZZLE_TILE_COLS) * F.SWIZZLE_TILE_COLS))
        out = {
            "columnwise_data": cp.empty(num_tiles * _B * k, dtype=cp.uint8),
            "columnwise_scale": cp.empty(num_tiles * k, dtype=cp.uint8),
            "columnwise_data_offsets": tiles * (_B * k),
            "columnwise_scale_offsets": tiles * k,
        }
        swz_buf = None
        if swizzle_rowwise:
            swz_buf = cp.zeros(int(swz[-1]), dtype=cp.uint8)
            out["rowwise_scale_swizzled"] = swz_buf
            out["rowwise_scale_swizzled_offsets"] = swz
        if num_tiles and k:
            row_off, tile_off, swz_off = _upload(rows, tiles, swz)
            warps = num_tiles * H.cdiv(k, _FUSED_TILE_COLS)
            H.kernel(MODULE, "lpm_mxfp8_colwise_from_rowwise")(
                (H.cdiv(warps, _WARPS_PER_CTA),), (_WARPS_PER_CTA * 32,),
                (data, scale, np.int64(m_total), np.int64(k), row_off, tile_off, swz_off,
                 np.int32(s.size), np.int64(num_tiles), out["columnwise_data"],
                 out["columnwise_scale"], _NULL if swz_buf is None else swz_buf,
                 np.int32(flags)))
    return out
