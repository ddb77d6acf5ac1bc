"""Shared pieces of the layer benchmarks (bench_linear.py, bench_mlp.py).

``Backend`` wraps one device: the array module, seeded random data, a timer (CUDA events on the
GPU, ``perf_counter`` on the CPU; warm-up, then the median) and memory clean-up.
``torch_module`` returns torch when the optional torch peer can run, else None.
"""

from __future__ import annotations

import gc
import statistics
import time

import ml_dtypes
import numpy as np

BF16 = ml_dtypes.bfloat16


class Backend:
    """Array module, random data and timers of one device."""

    def __init__(self, device: str):
        self.gpu = device == "gpu"
        if self.gpu:
            import cupy

            self.xp = cupy
            props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
            name = props["name"]
            self.name = name.decode() if isinstance(name, bytes) else str(name)
        else:
            self.xp = np
            self.name = "cpu (NumPy reference)"

    def randn(self, shape, seed: int, scale: float = 1.0, dtype=BF16):
        xp = self.xp
        if self.gpu:
            a = xp.random.RandomState(seed).standard_normal(shape, dtype=xp.float32)
        else:
            a = np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)
        if scale != 1.0:
            a *= np.float32(scale)
        return a.astype(dtype)

    def uniform(self, n: int, seed: int):
        xp = self.xp
        if self.gpu:
            return xp.random.RandomState(seed).uniform(0.1, 1.0, n).astype(xp.float32)
        return np.random.default_rng(seed).uniform(0.1, 1.0, n).astype(np.float32)

    def sync(self) -> None:
        if self.gpu:
            self.xp.cuda.get_current_stream().synchronize()

    def time_ms(self, fn, *, warmup: int, reps: int, budget_s: float) -> tuple[float, int]:
        """Median ms of ``fn()`` over at most ``reps`` timed calls (fewer when a call is so slow
        that ``reps`` of them would exceed ``budget_s``). Returns (median ms, calls timed)."""
        t_last = 0.0
        for _ in range(max(1, warmup)):
            t0 = time.perf_counter()
            fn()
            self.sync()
            t_last = time.perf_counter() - t0
        reps = max(1, min(reps, int(budget_s / max(t_last, 1e-6))))
        times = []
        for _ in range(reps):
            if self.gpu:
                cp = self.xp
                start, end = cp.cuda.Event(), cp.cuda.Event()
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(cp.cuda.get_elapsed_time(start, end))
            else:
                t0 = time.perf_counter()
                fn()
                times.append(1e3 * (time.perf_counter() - t0))
        return statistics.median(times), reps

    def free(self) -> None:
        gc.collect()
        if self.gpu:
            self.xp.get_default_memory_pool().free_all_blocks()
            self.xp.get_default_pinned_memory_pool().free_all_blocks()


def rel_err(xp, a, b) -> float:
    d = xp.linalg.norm((a.astype(xp.float32) - b.astype(xp.float32)).ravel())
    r = xp.linalg.norm(b.astype(xp.float32).ravel())
    return float(d / r) if float(r) else float(d)


def torch_module(args):
    if args.no_torch or args.device != "gpu":
        return None
    try:
        import torch  # noqa: PLC0415 - optional peer, never a library dependency
    except Exception:
        return None
    if not torch.cuda.is_available() or not hasattr(torch, "_grouped_mm"):
        return None
    return torch
