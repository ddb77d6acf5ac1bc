"""Tensor maps for the TMA tile loads of the grouped GEMM kernels (sm_90).

A tensor map (the driver's ``CUtensorMap``, 128 opaque bytes) describes a tiled view of a
global array to the tensor memory accelerator. CuPy does not wrap the encoder, so this module
calls the driver's ``cuTensorMapEncodeTiled`` through :mod:`ctypes` and returns the map as a
NumPy structured scalar, which CuPy passes to a kernel by value (the kernel declares it a
``const __grid_constant__ TmaMap`` parameter, ``raw_kernels/gemm/grouped_gemm_tma.cuh``). Encoding
is a host-only call (no device work, no synchronisation); maps are cached by their arguments.
"""

from __future__ import annotations

import ctypes
import threading
from collections import OrderedDict

import numpy as np

#: bytes of a CUtensorMap and its required alignment
MAP_BYTES = 128
MAP_ALIGN = 64
# CUtensorMapDataType / Interleave / Swizzle / L2promotion / FloatOOBfill values (cuda.h)
_U8 = 0
_INTERLEAVE_NONE = 0
_SWIZZLE_NONE = 0
#: CUtensorMapSwizzle of each supported swizzle span in bytes (0: none)
_SWIZZLE = {0: _SWIZZLE_NONE, 32: 1, 64: 2, 128: 3}
_L2_PROMOTION_128B = 2
_OOB_FILL_ZERO = 0
#: limits of a tiled map (CUDA driver API): box extents, stride granularity and range
MAX_BOX = 256
STRIDE_ALIGN = 16
MAX_STRIDE = 1 << 40

_lock = threading.Lock()
_cache: OrderedDict = OrderedDict()
_MAX_CACHED = 256
_encode = None
_dtype = None


def map_dtype() -> np.dtype:
    """The structured dtype of a tensor-map kernel argument (128 bytes, 64-byte aligned)."""
    global _dtype
    if _dtype is None:
        import cupy

        _dtype = cupy.make_aligned_dtype(np.dtype([("words", np.uint64, (16,))]),
                                         alignment=MAP_ALIGN)
    return _dtype


def _encoder():
    global _encode
    if _encode is None:
        lib = ctypes.CDLL("libcuda.so.1")
        fn = lib.cuTensorMapEncodeTiled
        fn.restype = ctypes.c_int
        u64p = ctypes.POINTER(ctypes.c_uint64)
        u32p = ctypes.POINTER(ctypes.c_uint32)
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p,
                       u64p, u32p, u32p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        _encode = fn
    return _encode


def check_2d_u8(ptr: int, inner: int, rows: int, stride: int, box_inner: int,
                box_rows: int, swizzle: int = 0) -> str | None:
    """Why a 2-D byte tensor cannot get a tiled map (see :func:`map_2d_u8`), or None."""
    if swizzle not in _SWIZZLE:
        return f"swizzle {swizzle} is not one of {sorted(_SWIZZLE)}"
    if swizzle and box_inner > swizzle:
        return f"box inner extent {box_inner} exceeds the {swizzle}-byte swizzle span"
    if ptr % 16:
        return f"global address {ptr:#x} is not 16-byte aligned"
    if stride % STRIDE_ALIGN or not 0 < stride < MAX_STRIDE:
        return f"row stride {stride} is not a positive multiple of {STRIDE_ALIGN} below 2^40"
    if not (0 < inner <= stride and 0 < rows < 2**32):
        return f"extents ({inner}, {rows}) out of range for stride {stride}"
    if box_inner % 16 or not 0 < box_inner <= MAX_BOX or not 0 < box_rows <= MAX_BOX:
        return f"box ({box_inner}, {box_rows}) out of range"
    return None


def map_2d_u8(ptr: int, inner: int, rows: int, stride: int, box_inner: int,
              box_rows: int, swizzle: int = 0) -> np.void:
    """Tiled tensor map of a row-major 2-D byte array (cached).

    Parameters
    ----------
    ptr : int
        Device address of element (0, 0); 16-byte aligned.
    inner, rows : int
        Extents in bytes (contiguous dimension) and rows; loads outside them read zeros.
    stride : int
        Bytes between rows (a multiple of 16).
    box_inner, box_rows : int
        The tile one load copies: ``box_rows`` rows of ``box_inner`` bytes, stored densely
        (row-major) in shared memory.
    swizzle : int
        0 (default): rows stored as they are; 32, 64 or 128: the TMA swizzle of that span
        (64: bits 4-5 of the shared address, the 16-byte chunk, XORed with bits 7-8; with
        64-byte rows, chunk ``c`` of row ``r`` lands at chunk ``c ^ ((r >> 1) & 3)``). The box
        is at most one span wide.

    Returns
    -------
    numpy.void
        The map as a kernel argument of :func:`map_dtype`.

    Raises
    ------
    ValueError
        If the arguments violate the driver's limits (:func:`check_2d_u8`).
    RuntimeError
        If the driver rejects the map.
    """
    key = (ptr, inner, rows, stride, box_inner, box_rows, swizzle)
    with _lock:
        hit = _cache.get(key)
        if hit is not None:  # only valid maps are cached
            _cache.move_to_end(key)
            return hit
    why = check_2d_u8(ptr, inner, rows, stride, box_inner, box_rows, swizzle)
    if why is not None:
        raise ValueError(f"no tensor map: {why}")
    raw = (ctypes.c_uint8 * (MAP_BYTES + MAP_ALIGN))()  # CUtensorMap is 64-byte aligned
    addr = -(-ctypes.addressof(raw) // MAP_ALIGN) * MAP_ALIGN
    dims = (ctypes.c_uint64 * 2)(inner, rows)
    strides = (ctypes.c_uint64 * 1)(stride)
    box = (ctypes.c_uint32 * 2)(box_inner, box_rows)
    estr = (ctypes.c_uint32 * 2)(1, 1)
    res = _encoder()(addr, _U8, 2, ctypes.c_void_p(ptr), dims, strides, box,
                     estr, _INTERLEAVE_NONE, _SWIZZLE[swizzle], _L2_PROMOTION_128B,
                     _OOB_FILL_ZERO)
    if res != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed (CUresult {res}) for {key}")
    val = np.zeros((), dtype=map_dtype())
    val["words"] = np.frombuffer(ctypes.string_at(addr, MAP_BYTES), dtype=np.uint64)
    val = val[()]
    with _lock:
        _cache[key] = val
        while len(_cache) > _MAX_CACHED:
            _cache.popitem(last=False)
    return val
