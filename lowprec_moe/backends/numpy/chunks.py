"""Passes over a matrix in chunks of rows, with the chunk temporaries in reused scratch memory.

A whole-tensor temporary streams through main memory and, being fresh memory, is first zeroed by
the kernel page by page, which costs more than the arithmetic on it. A chunk of about
:data:`CHUNK_ELEMENTS` elements stays in a core's cache, and its temporaries live in a
:class:`Scratch` that every chunk of a call reuses. Results are the same as whole-tensor passes:
every quantization step is elementwise or per block, and chunks hold whole blocks.
"""

from __future__ import annotations

import numpy as np

from lowprec_moe.backends.numpy.fp import MAGNITUDE, bf16_bits_into, magnitude_bits

#: Elements per chunk: 2 MB as float32, so the few temporaries of a chunk stay in the last-level
#: cache; smaller chunks pay more per-call overhead (decision 0012 has the measurements).
CHUNK_ELEMENTS = 1 << 19


def chunk_rows(cols: int, multiple: int) -> int:
    """Rows per chunk: a multiple of ``multiple`` near ``CHUNK_ELEMENTS / cols``."""
    return max(multiple, (CHUNK_ELEMENTS // max(cols, 1)) // multiple * multiple)


def row_chunks(rows: int, cols: int, multiple: int):
    """``(r0, r1)`` ranges covering ``rows`` in steps of :func:`chunk_rows`."""
    step = chunk_rows(cols, multiple)
    for r0 in range(0, rows, step):
        yield r0, min(rows, r0 + step)


class Scratch:
    """Named 1-D buffers of up to ``size`` elements, allocated on first use and then reused.

    A name stands for one temporary: two temporaries alive at the same time need two names.
    """

    def __init__(self, size: int):
        self.size = size
        self._bufs: dict[str, np.ndarray] = {}

    def get(self, name: str, n: int, dtype) -> np.ndarray:
        """The first ``n`` elements of buffer ``name``, as ``dtype``."""
        itemsize = np.dtype(dtype).itemsize
        buf = self._bufs.get(name)
        if buf is None or buf.size < n * itemsize:
            buf = self._bufs[name] = np.empty(max(n, self.size) * itemsize, np.uint8)
        return buf[:n * itemsize].view(dtype)


def load_f32(x: np.ndarray, out: np.ndarray) -> None:
    """float32 values of the float32 / float16 / bfloat16 matrix ``x`` into ``out`` (same shape)."""
    if x.dtype.name == "bfloat16":
        bf16_bits_into(x.view(np.uint16), out)
    else:
        np.copyto(out, x)


def halving_max(v: np.ndarray, fn, buf: np.ndarray) -> np.ndarray:
    """``fn``-reduction (``np.maximum`` / ``np.fmax``) of ``v``'s last axis (a power of two long)
    by halving it: strided elementwise calls are much faster than a reduction over a short inner
    axis. Intermediates go to ``buf`` (1-D, ``v.size`` elements of ``v.dtype``); the result is a
    view into it."""
    off = 0
    while v.shape[-1] > 1:
        n = v.size // 2
        out = buf[off:off + n].reshape(v.shape[:-1] + (v.shape[-1] // 2,))
        fn(v[..., 0::2], v[..., 1::2], out=out)
        v, off = out, off + n
    return v[..., 0]


def block_max_bits(x: np.ndarray, block: int, scratch: Scratch) -> tuple[np.ndarray, int]:
    """Max magnitude bits of each ``block`` consecutive elements of the rows ``x`` (C-contiguous
    float32 / float16 / bfloat16, ``[R, C]``), as ``[R, C/block]`` unsigned integers of
    ``x``'s width, and the integer of +inf: a larger value means the block holds a NaN."""
    rows, cols = x.shape
    utype, mask, inf = MAGNITUDE[x.dtype.name]
    if utype is np.uint16:
        # two magnitudes per 32-bit word: the first halving on whole words, without strides
        w = scratch.get("mag", x.size // 2, np.uint32)
        np.bitwise_and(x.view(np.uint32).reshape(-1), np.uint32(mask * 0x10001), out=w)
        hi = scratch.get("hi", w.size, np.uint32)
        np.right_shift(w, np.uint32(16), out=hi)
        np.bitwise_and(w, np.uint32(mask), out=w)
        np.maximum(w, hi, out=w)
        mx = halving_max(w.reshape(rows, cols // block, block // 2), np.maximum,
                         scratch.get("halves", w.size, np.uint32))
        return mx.astype(utype), inf
    mag, _ = magnitude_bits(x, out=scratch.get("mag", x.size, utype).reshape(x.shape))
    mx = halving_max(mag.reshape(rows, cols // block, block), np.maximum,
                     scratch.get("halves", x.size, utype))
    return mx, inf
