"""CPU throughput of the NumPy reference quantizers (MB/s of input).

Usage: ``python benchmarks/bench_cpu.py [--m 8192] [--k 4096] [--repeat 3]``

Random float32 data (never zeros); each case runs once as warm-up, then ``--repeat`` times, and the
median wall time is reported. Target (issue "Numerics core"): >= 100 MB/s for NVFP4 row+col and
MXFP8 row+col on ``[8192, 4096]`` float32.
"""

from __future__ import annotations

import argparse
import statistics
import time

import ml_dtypes
import numpy as np

import lowprec_moe as lpm

CASES = [
    ("nvfp4 row+col", "nvfp4", dict(columnwise=True), np.float32),
    ("nvfp4 row-scaled row+col", "nvfp4", dict(columnwise=True, row_scaled=True), np.float32),
    ("nvfp4 2-D row+col", "nvfp4", dict(columnwise=True, block_2d=True), np.float32),
    ("nvfp4 rht+sr row+col (bf16)", "nvfp4",
     dict(columnwise=True, rht=True, stochastic_rounding=True, seed=1), ml_dtypes.bfloat16),
    ("mxfp8 e4m3 row+col", "mxfp8", dict(columnwise=True), np.float32),
    ("mxfp8 e5m2 row+col", "mxfp8", dict(columnwise=True, fp8_dtype="e5m2"), np.float32),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=8192)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    x32 = rng.standard_normal((args.m, args.k), dtype=np.float32)
    print(f"shape [{args.m}, {args.k}], median of {args.repeat}")
    print(f"{'case':32s} {'ms':>9s} {'MB/s (input)':>13s}")
    for name, fmt, kw, dtype in CASES:
        x = x32.astype(dtype)
        lpm.quantize(x, fmt, **kw)
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            lpm.quantize(x, fmt, **kw)
            times.append(time.perf_counter() - t0)
        t = statistics.median(times)
        print(f"{name:32s} {t * 1e3:9.1f} {x.nbytes / t / 1e6:13.1f}")


if __name__ == "__main__":
    main()
