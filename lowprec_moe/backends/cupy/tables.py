"""Small host tables on the device, uploaded once per content.

A grouped call reads a few small tables that follow from its splits and shape (row offsets, tile
lists, GEMM descriptors). A training step asks for the same ones many times: the weights'
splits never change, and a layer's forward and backward share the activations' splits. Each
upload is a host-to-device copy through a pinned staging buffer, tens of microseconds of host
time, so the device copies are kept in a small LRU keyed by the device and the tables' bytes: a
repeated layout uploads nothing. The kernels only read these tables (``const`` pointers), so one
device copy can serve every call that asks for the same bytes.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict

import numpy as np

#: device tables kept (each a few hundred bytes to a few kB)
MAX_CACHED = 256

_lock = threading.Lock()
_cache: OrderedDict = OrderedDict()


def upload(*tables: np.ndarray, dtype=np.int64) -> tuple:
    """Device copies of host tables, as views of one cached device buffer.

    Parameters
    ----------
    *tables : numpy.ndarray
        Host arrays (any shape; stored flat as ``dtype``, C order).
    dtype : numpy dtype
        Element type on the device (int64 by default).

    Returns
    -------
    tuple of cupy.ndarray
        One read-only-by-contract view per table, on the current device, in order, each with
        its table's shape. Callers must not write into them: the same buffer serves every call
        with the same bytes.
    """
    import cupy as cp

    flat = [np.ascontiguousarray(t, dtype=dtype) for t in tables]
    digest = hashlib.blake2b(digest_size=16)
    for t in flat:
        digest.update(np.int64(t.ndim).tobytes())
        digest.update(np.asarray(t.shape, np.int64).tobytes())
        digest.update(t.tobytes())
    key = (int(cp.cuda.runtime.getDevice()), np.dtype(dtype).str, digest.digest())
    with _lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return hit
    joined = np.concatenate([t.reshape(-1) for t in flat]) if flat else np.zeros(0, dtype)
    dev = cp.asarray(joined if joined.size else np.zeros(1, dtype))
    views, start = [], 0
    for t in flat:
        views.append(dev[start:start + t.size].reshape(t.shape))
        start += t.size
    val = tuple(views)
    with _lock:
        _cache[key] = val
        while len(_cache) > MAX_CACHED:
            _cache.popitem(last=False)
    return val


def clear() -> None:
    """Forget every cached device table."""
    with _lock:
        _cache.clear()
