"""Quantize the tensors of one input file into one output file, several at a time on the CPU.

Work is cut into units (one matrix, one expert of a stack, one fused stack); on the CPU up to
``jobs`` units run in threads (NumPy releases the GIL inside its loops, so two cores give about
twice the throughput). On the GPU two units are in flight, each in its own thread on its own
stream, so that one unit's host -> device copy overlaps the other's quantization and copy back.
Results are written strictly in input order, so the output depends neither on ``jobs`` nor on
the device.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from lowprec_moe.backend import is_cupy_array
from lowprec_moe.backends.numpy.fp import MAGNITUDE, magnitude_bits
from lowprec_moe.tensors.grouped_tensor import GroupedTensor
from lowprec_moe.tensors.quantized_tensor import quantize
from lowprec_moe.io._common import CheckpointError
from lowprec_moe.io.checkpoint import CheckpointWriter
from lowprec_moe.io.selection import expert_name, module_name

__all__ = ["quantize_shard", "default_jobs"]

_FLOATS = ("bfloat16", "float16", "float32")
#: Elements per step of the non-finite check: its temporary stays in cache.
_FINITE_STEP = 1 << 19
#: Units in flight on the GPU: two let one unit's copies overlap the other's kernels.
_GPU_WORKERS = 2
_local = threading.local()


def default_jobs() -> int:
    """Threads for CPU quantization: the usable cores, at most 8."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        n = os.cpu_count() or 1
    return max(1, min(n, 8))


def all_finite(x) -> bool:
    """Whether a host float32 / float16 / bfloat16 array holds no inf or NaN (on the raw bits:
    the largest magnitude is below +inf's bits)."""
    flat = np.ascontiguousarray(x).reshape(-1)
    buf = np.empty(min(flat.size, _FINITE_STEP), MAGNITUDE[flat.dtype.name][0])  # reused
    for i in range(0, flat.size, _FINITE_STEP):
        part = flat[i:i + _FINITE_STEP]
        mag, inf = magnitude_bits(part, out=buf[:part.size])
        if mag.max() >= inf:
            return False
    return True


def _device_finite(x2, xp) -> bool:
    step = max(1, (1 << 24) // max(1, x2.shape[1]))
    return all(bool(xp.isfinite(x2[i:i + step].astype(xp.float32)).all())
               for i in range(0, x2.shape[0], step))


@dataclass
class _Unit:
    name: str          # output tensor name
    source: str        # input tensor name
    kind: str          # "copy", "matrix" or "fused"
    array: Any
    info: dict
    last: bool = True  # the last unit of its input tensor


def _units(ck, plan):
    for name in ck.names():
        d = plan[name]
        a = ck.get(name)
        if d.action == "copy":
            yield _Unit(name, name, "copy", a, {"note": f"not quantized: {d.reason}"})
        elif d.action == "split":
            g = a.shape[0]
            for i in range(g):
                yield _Unit(expert_name(name, i), name, "matrix", a[i],
                            {"original_shape": list(a.shape[1:]), "original_dtype": a.dtype.name,
                             "split_from": {"name": name, "index": i, "count": g}},
                            last=i == g - 1)
        else:
            yield _Unit(name, name, "fused" if d.action == "fused" else "matrix", a,
                        {"original_shape": list(a.shape), "original_dtype": a.dtype.name})


def _thread_stream(xp):
    """This thread's own non-blocking stream (made once per thread and kept: the memory pool
    keeps freed blocks per stream)."""
    s = getattr(_local, "stream", None)
    if s is None:
        s = _local.stream = xp.cuda.Stream(non_blocking=True)
    return s


def _to_host(q):
    """``q`` with every device array copied to the host (the copies wait for its kernels)."""
    return dataclasses.replace(q, **{
        f.name: getattr(q, f.name).get() for f in dataclasses.fields(q)
        if is_cupy_array(getattr(q, f.name))})


def _work(u: _Unit, format, opts, xp, allow_nonfinite):
    if u.kind == "copy":
        return None
    if xp is np:
        return _quantize_unit(u, format, opts, xp, allow_nonfinite)
    with _thread_stream(xp):
        return _to_host(_quantize_unit(u, format, opts, xp, allow_nonfinite))


def _quantize_unit(u: _Unit, format, opts, xp, allow_nonfinite):
    a = u.array
    x2 = a.reshape(-1, a.shape[-1])
    if xp is not np:
        x2 = xp.asarray(np.ascontiguousarray(x2))
    if not allow_nonfinite and not (all_finite(x2) if xp is np else _device_finite(x2, xp)):
        raise ValueError(f"tensor {u.name!r} contains NaN or inf values; refusing to quantize "
                         "it (allow them with --allow-nonfinite)")
    if u.kind == "fused":
        return GroupedTensor.quantize(x2, [a.shape[1]] * a.shape[0], format, **opts)
    return quantize(x2, format, **opts)


def _named(path: str, name: str, exc: Exception) -> Exception:
    msg = str(exc)
    return type(exc)(f"{path}: {msg if repr(name) in msg else f'tensor {name!r}: {msg}'}")


def quantize_shard(ck, plan, out, format, opts, layout, xp, allow_nonfinite, report, progress,
                   *, jobs: int = 1, extra_meta=None) -> list[str]:
    """Convert the open checkpoint ``ck`` into ``out``; returns the array names written."""
    jobs = jobs if xp is np else _GPU_WORKERS
    with CheckpointWriter(out, hold=True) as w, ThreadPoolExecutor(max(1, jobs)) as pool:
        pending: collections.deque = collections.deque()

        def finish(u: _Unit, fut) -> None:
            try:
                q = fut.result() if fut is not None else None
                if u.kind == "copy":
                    w.add(u.name, u.array, **u.info)
                    reason = u.info["note"].removeprefix("not quantized: ")
                    report.copied.append((u.name, reason))
                    if u.array.ndim >= 2 and u.array.dtype.name in _FLOATS:
                        report.excluded_modules.append(module_name(u.name))
                else:
                    w.add(u.name, q, layout=layout, **u.info)
            except CheckpointError:
                raise
            except (ValueError, TypeError) as exc:
                raise _named(ck.path, u.name, exc) from None
            if u.last and u.kind != "copy":
                report.converted.append(u.source)
                if "split_from" in u.info:
                    g = u.info["split_from"]["count"]
                    report.split.append((u.source, g, expert_name(u.source, "{i}")))
                elif u.kind == "fused":
                    report.fused.append(u.source)
            nbytes = int(u.array.nbytes)
            report.bytes_in += nbytes
            progress.advance(nbytes, u.name)

        try:
            for u in _units(ck, plan):
                fut = None if u.kind == "copy" else (
                    pool.submit(_work, u, format, opts, xp, allow_nonfinite) if jobs > 1
                    else _Done(_work, u, format, opts, xp, allow_nonfinite))
                pending.append((u, fut))
                while len(pending) > jobs:
                    finish(*pending.popleft())
            while pending:
                finish(*pending.popleft())
        except BaseException:
            for _, fut in pending:
                if fut is not None:
                    fut.cancel()
            raise
        meta = dict(ck.metadata)
        meta.update(extra_meta or {})
        w.commit(meta)
        return w.names


class _Done:
    """A finished result with the Future interface (the serial path), errors kept for later
    so that they surface in order, like a pooled unit's."""

    def __init__(self, fn, *args):
        try:
            self._value, self._exc = fn(*args), None
        except Exception as exc:  # re-raised by result(), where a Future would raise it
            self._value, self._exc = None, exc

    def result(self):
        if self._exc is not None:
            raise self._exc
        return self._value

    def cancel(self) -> bool:
        return False
