"""What every CuPy launcher needs: the lazy CuPy import, ceiling division, kernel handles
memoized per device, zero-filled buffers, the device's multiprocessor count.

CuPy is imported inside the functions: importing this module works without it.
"""

from __future__ import annotations

from lowprec_moe import kernels

__all__ = ["cupy", "cdiv", "kernel", "zeros", "sm_count"]

_kernels: dict = kernels.handle_table()
_sm_counts: dict[int, int] = {}


def cupy():
    """The ``cupy`` module (imported on first use)."""
    import cupy as cp  # noqa: PLC0415

    return cp


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for non-negative ints."""
    return -(-a // b)


def kernel(module: str, name: str, source=None):
    """:func:`lowprec_moe.kernels.get_function` memoized per (device, module, kernel): the
    loader's own lookup costs more on the hot path.

    ``source``: for a generated module, a callable returning its text (called on a miss only);
    a module's text must not change between calls in a process."""
    key = (cupy().cuda.runtime.getDevice(), module, name)
    fn = _kernels.get(key)
    if fn is None:
        text = None if source is None else source(module)
        fn = _kernels[key] = kernels.get_function(module, name, text)
    return fn


def zeros(n: int, dtype):
    """A zero-filled 1-D device array of ``n`` elements by one asynchronous memset on the
    current stream (no fill kernel)."""
    cp = cupy()
    a = cp.empty(n, dtype=dtype)
    if a.nbytes:
        cp.cuda.runtime.memsetAsync(a.data.ptr, 0, a.nbytes, cp.cuda.get_current_stream().ptr)
    return a


def sm_count() -> int:
    """Multiprocessors of the current device (cached)."""
    cp = cupy()
    dev = int(cp.cuda.runtime.getDevice())
    n = _sm_counts.get(dev)
    if n is None:
        n = _sm_counts[dev] = int(cp.cuda.Device(dev).attributes["MultiProcessorCount"])
    return n
