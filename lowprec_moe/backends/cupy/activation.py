"""CuPy launchers of the GroupedMLP activation kernels (``raw_kernels/activation/activation.cu``).

Called by :mod:`lowprec_moe.layers.activations` with validated CuPy arrays:

* :func:`activation_forward` -- ``z = round(act(h) * p)`` in the layer dtype (optionally with
  its NVFP4 amax: per member, plus the RHT columnwise amax, or per row and per member column), or
  fused with the MXFP8 quantization of ``z`` (rowwise and / or columnwise; ``z`` is never
  written);
* :func:`activation_backward` -- ``dh`` in the layer dtype (optionally with its NVFP4 amax) and /
  or fused with its MXFP8 quantization, the activation's share of ``dprobs`` and the per-expert
  column sums of ``dh``.

Every launch covers all experts: warps own (32-row tile of one expert, feature tile) pairs, the
tile shape of the MXFP8 quantizer, whose device code quantizes the fused outputs. Fused and
unfused launches therefore give the same bytes and the same reductions. Kernels run on CuPy's
current stream; the host uploads only the small int64 tables of member row / tile offsets, or,
with device splits, one kernel builds them on the device (plain outputs only). CuPy is imported
lazily.
"""

from __future__ import annotations

import numpy as np

from lowprec_moe import formats as F
from lowprec_moe.backends.cupy import launch_helpers as H
from lowprec_moe.backends.cupy import tables
from lowprec_moe.backends.cupy.mxfp8 import tile_offsets, grouped_outputs
from lowprec_moe.backends.cupy.reduce import member_sums
from lowprec_moe.backends.cupy import splits_kernels as SK
from lowprec_moe.backends.cupy.splits import max_row_tiles

__all__ = ["MODULE", "AMAX_MODES", "activation_forward", "activation_backward"]

#: Kernel module (``raw_kernels/activation/activation.cu``).
MODULE = "activation"

# Must match raw_kernels/activation/activation.cu (and mxfp8_formats.cuh for the flag bits).
_WARPS_PER_CTA = 4
_COLSUM_THREADS = 256
_FLAG_ROWWISE = 1
_FLAG_COLUMNWISE = 2
_FLAG_E5M2 = 8
_FLAG_VEC = 64
_FLAG_AMAX = 128
_FLAG_AMAX_RHT = 256
_FLAG_AMAX_ROWS = 512
#: NVFP4 amax modes of the _amax kernels: per member; per member + RHT columnwise; per row and
#: per (member, column).
AMAX_MODES = ("tensor", "rht", "rows")
_ACT_ID = {"swiglu": 0, "clamped_swiglu": 1, "srelu": 2}
_VEC = {"float32": 4, "float16": 8, "bfloat16": 8}
_SUFFIX = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}

_B = F.MXFP8_BLOCK  # 32-row tiles (the MXFP8 columnwise block)
_NULL = np.uint64(0)


def _dtype(a) -> str:
    name = np.dtype(a.dtype).name
    if name not in _SUFFIX:
        raise TypeError(f"dtype={name} is not supported by the activation kernels; use one of "
                        f"{', '.join(_SUFFIX)}")
    return name


def _upload(rows, tiles):
    return tables.upload(rows, tiles)


def _layout(cp, splits, m: int):
    """``(g_count, num_tiles, host rows / tiles or None, device row_off / tile_off or None)``.

    Device splits (a CuPy array): the tables are built on the device and the launch covers the
    most 32-row tiles any split of ``m`` rows can need. The tiles past the experts' last one
    have no valid row: the plain modes skip them, the fused MXFP8 output writes them as zero
    tiles past the last member (its columnwise buffers are sized for them, as the quantizer's
    are), and they add nothing to an amax."""
    if not isinstance(splits, cp.ndarray):
        rows, tiles = tile_offsets(splits)
        return len(splits), int(tiles[-1]), (rows, tiles), None
    g = int(splits.size)
    return g, max_row_tiles(m, g, _B), None, SK.offsets(splits, m, _B)


def _vec_ok(name: str, f: int, act, *arrays) -> bool:
    """16-byte loads / stores: F and the interleave multiples of VEC, pointers aligned."""
    vec = _VEC[name]
    if f % vec or (act.glu_interleave is not None and act.glu_interleave % vec):
        return False
    return all(a is None or a.data.ptr % 16 == 0 for a in arrays)


def _act_args(act, f: int, width: int):
    return (np.int64(f), np.int64(width), np.int32(1 if act.is_glu else 0),
            np.int32(act.glu_interleave or 0), np.int32(_ACT_ID[act.name]),
            np.float32(act.limit), np.float32(act.alpha))


def _mx_outputs(m: int, width: int, num_tiles: int, rowwise: bool, columnwise: bool,
                fp8_dtype: str):
    flags = ((_FLAG_ROWWISE if rowwise else 0) | (_FLAG_COLUMNWISE if columnwise else 0)
             | (_FLAG_E5M2 if fp8_dtype == "e5m2" else 0))
    return grouped_outputs(m, width, num_tiles, rowwise, columnwise), flags


def _mx_ptrs(parts: dict):
    return tuple(parts.get(k, _NULL) for k in ("rowwise_data", "rowwise_scale",
                                               "columnwise_data", "columnwise_scale"))


def _mx_offsets(parts: dict, width: int, tiles) -> None:
    """The columnwise member offsets from the 32-row tile offsets (host or device int64)."""
    if "columnwise_data" in parts:
        parts["columnwise_data_offsets"] = tiles * (_B * width)
        parts["columnwise_scale_offsets"] = tiles * width


def _check_mx(mxfp8: dict, width: int) -> tuple[bool, bool, str]:
    rowwise, columnwise = bool(mxfp8.get("rowwise", True)), bool(mxfp8.get("columnwise", False))
    fp8_dtype = mxfp8.get("fp8_dtype", "e4m3")
    if fp8_dtype not in F.FP8_DTYPES:
        raise ValueError(f"fp8_dtype={fp8_dtype!r} must be one of {F.FP8_DTYPES}")
    if not rowwise and not columnwise:
        raise ValueError("rowwise=False and columnwise=False: nothing to quantize")
    if width % _B:
        raise ValueError(f"{width} columns: MXFP8 needs a multiple of {_B}")
    return rowwise, columnwise, fp8_dtype


def _amax_outputs(mode: str | None, name: str, m: int, width: int, g_count: int):
    """Zero-filled amax outputs of the _amax kernels: (flags, amax_a, amax_b, result pair)."""
    if mode is None:
        return 0, None, None, None
    if mode not in AMAX_MODES:
        raise ValueError(f"amax={mode!r} must be one of {AMAX_MODES}")
    if mode == "rht" and name != "bfloat16":
        raise ValueError(f"amax='rht' needs bfloat16 input, got dtype={name}")
    cp = H.cupy()
    n_a, n_b = {"tensor": (g_count, 0), "rht": (g_count, g_count),
                "rows": (m, g_count * width)}[mode]
    buf = H.zeros(n_a + n_b, cp.uint32)
    a, b = buf[:n_a], buf[n_a:]
    flags = {"tensor": _FLAG_AMAX, "rht": _FLAG_AMAX | _FLAG_AMAX_RHT,
             "rows": _FLAG_AMAX_ROWS}[mode]
    fa = a.view(cp.float32)
    pair = (fa, fa) if mode == "tensor" else (fa, b.view(cp.float32))
    return flags, a, (a if mode == "tensor" else b), pair


def _kernel_name(direction: str, mxfp8, amax, sfx: str) -> str:
    mode = "mx_" if mxfp8 is not None else ("amax_" if amax is not None else "")
    return f"lpm_act_{direction}_{mode}{sfx}"


# ============================================================================================
# forward


def activation_forward(h, splits, act, probs, f: int, *, mxfp8: dict | None = None,
                       amax: str | None = None):
    """``z`` ``[M, F]`` of h's dtype, or (``mxfp8`` given) the MXFP8 parts of a GroupedTensor.

    ``h`` ``[M, 2F | F]`` (CuPy), ``probs`` float32 ``[M]`` or None, ``act`` an
    :class:`~lowprec_moe.layers.activations.Activation`, ``mxfp8`` a dict with ``rowwise``,
    ``columnwise`` and ``fp8_dtype``. ``amax`` (one of :data:`AMAX_MODES`, not with ``mxfp8``):
    return ``(z, (amax_rowwise, amax_columnwise))``, the NVFP4 amax of z as
    ``grouped_quantize_nvfp4(z, splits, ...)`` would compute it (``"tensor"``: ``[G]`` twice;
    ``"rht"``: ``[G]`` and the RHT columnwise ``[G]``; ``"rows"``: ``[M]`` and ``[G * F]``).
    """
    cp = H.cupy()
    with h.device:
        h = cp.ascontiguousarray(h)
        name = _dtype(h)
        m, width = (int(v) for v in h.shape)
        g_count, num_tiles, host, dev = _layout(cp, splits, m)
        z = None
        if mxfp8 is not None and amax is not None:
            raise ValueError("amax applies to the layer-dtype output, not with mxfp8")
        if mxfp8 is not None:
            rowwise, columnwise, fp8_dtype = _check_mx(mxfp8, f)
            parts, flags = _mx_outputs(m, f, num_tiles, rowwise, columnwise, fp8_dtype)
        else:
            z = cp.empty((m, f), dtype=h.dtype)
            parts, flags = {}, 0
        aflags, amax_a, amax_b, amax_pair = _amax_outputs(amax, name, m, f, g_count)
        flags |= aflags
        if _vec_ok(name, f, act, h, z):
            flags |= _FLAG_VEC
        if num_tiles and f:
            row_off, tile_off = dev if dev is not None else _upload(*host)
            f_tiles = H.cdiv(f, 16 * _VEC[name])
            H.kernel(MODULE, _kernel_name("fwd", mxfp8, amax, _SUFFIX[name]))(
                (H.cdiv(num_tiles * f_tiles, _WARPS_PER_CTA),), (_WARPS_PER_CTA * 32,),
                (h, _NULL if probs is None else probs, *_act_args(act, f, width), np.int64(m),
                 row_off, tile_off, np.int32(g_count), np.int64(num_tiles),
                 _NULL if z is None else z, *_mx_ptrs(parts), np.int32(flags),
                 _NULL if amax_a is None else amax_a, _NULL if amax_b is None else amax_b))
        if mxfp8 is None:
            return z if amax is None else (z, amax_pair)
        _mx_offsets(parts, f, host[1] if dev is None else dev[1])
        if dev is not None:
            parts["offsets"] = dev[0]
        return parts


# ============================================================================================
# backward


def activation_backward(dz, h, splits, act, probs, f: int, *, want_dh: bool,
                        want_dprobs: bool, want_dbias: bool, mxfp8: dict | None = None,
                        amax: str | None = None) -> dict:
    """Backward launch; returns ``dict(dh, parts, dprobs, dbias, amax)`` (None where not asked).

    ``dz`` ``[M, F]`` and ``h`` ``[M, W]`` of one dtype; ``dprobs`` float32 ``[M]`` (needs
    probs); ``dbias`` float32 ``[G, W]`` (per-expert column sums of dh); ``parts`` the MXFP8
    GroupedTensor fields of dh when ``mxfp8`` is given; ``amax`` (a mode of :data:`AMAX_MODES`,
    needs ``want_dh``) the NVFP4 amax pair of dh as in :func:`activation_forward`.
    """
    cp = H.cupy()
    with h.device:
        h = cp.ascontiguousarray(h)
        dz = cp.ascontiguousarray(dz)
        name = _dtype(h)
        if _dtype(dz) != name:
            raise TypeError(f"dz.dtype={_dtype(dz)} must match h.dtype={name}")
        m, width = (int(v) for v in h.shape)
        g_count, num_tiles, host, dev = _layout(cp, splits, m)
        f_tiles = H.cdiv(f, 16 * _VEC[name]) if f else 0
        dh = cp.empty((m, width), dtype=h.dtype) if want_dh else None
        parts, flags = {}, 0
        if mxfp8 is not None:
            rowwise, columnwise, fp8_dtype = _check_mx(mxfp8, width)
            parts, flags = _mx_outputs(m, width, num_tiles, rowwise, columnwise, fp8_dtype)
        if amax is not None and (mxfp8 is not None or not want_dh):
            raise ValueError("amax needs the layer-dtype dh (want_dh=True, no mxfp8)")
        aflags, amax_a, amax_b, amax_pair = _amax_outputs(amax, name, m, width, g_count)
        flags |= aflags
        want_dprobs = bool(want_dprobs) and probs is not None
        # (zeros: with device splits that sum to less than M, rows past them get no share)
        dprobs_part = ((cp.zeros if dev is not None else cp.empty)((m, f_tiles),
                                                                   dtype=cp.float32)
                       if want_dprobs else None)
        colsum_part = cp.empty((num_tiles, width), dtype=cp.float32) if want_dbias else None
        if _vec_ok(name, f, act, h, dz, dh):
            flags |= _FLAG_VEC
        row_off = tile_off = None
        if num_tiles and f:
            row_off, tile_off = dev if dev is not None else _upload(*host)
            H.kernel(MODULE, _kernel_name("bwd", mxfp8, amax, _SUFFIX[name]))(
                (H.cdiv(num_tiles * f_tiles, _WARPS_PER_CTA),), (_WARPS_PER_CTA * 32,),
                (dz, h, _NULL if probs is None else probs, *_act_args(act, f, width),
                 np.int64(m), row_off, tile_off, np.int32(g_count), np.int64(num_tiles),
                 _NULL if dh is None else dh, *_mx_ptrs(parts), np.int32(flags),
                 _NULL if dprobs_part is None else dprobs_part,
                 _NULL if colsum_part is None else colsum_part,
                 _NULL if amax_a is None else amax_a, _NULL if amax_b is None else amax_b))
        dprobs = None
        if want_dprobs:
            dprobs = cp.zeros(m, dtype=cp.float32)
            if m and f_tiles:
                H.kernel(MODULE, "lpm_act_row_sum")(
                    (H.cdiv(m, _COLSUM_THREADS),), (_COLSUM_THREADS,),
                    (dprobs_part, np.int64(f_tiles), np.int64(m), dprobs))
        dbias = None
        if want_dbias:
            has_tiles = bool(num_tiles and width)
            if has_tiles and tile_off is None:
                tile_off = dev[1] if dev is not None else _upload(*host)[1]
            dbias = member_sums(colsum_part if has_tiles else None, tile_off, g_count, width)
        if mxfp8 is not None:
            _mx_offsets(parts, width, host[1] if dev is None else dev[1])
            if dev is not None:
                parts["offsets"] = dev[0]
        return dict(dh=dh, parts=parts if mxfp8 is not None else None, dprobs=dprobs,
                    dbias=dbias, amax=amax_pair)
