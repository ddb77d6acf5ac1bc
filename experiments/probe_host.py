"""Host-side cost of one grouped GEMM call (Python validation, launch preparation, enqueue).

Usage::

    python experiments/probe_host.py [--shape membound] [--fmt nvfp4] [--calls 200]

Times ``calls`` back-to-back calls with ``time.perf_counter`` (enqueue only, one synchronize at
the end) and prints the top entries of a cProfile of the same loop, to see where the host time of
a small, memory-bound GEMM goes.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="membound")
    ap.add_argument("--fmt", default="nvfp4")
    ap.add_argument("--mode", default="fprop")
    ap.add_argument("--calls", type=int, default=200)
    args = ap.parse_args()

    import cupy as cp
    import ml_dtypes
    import numpy as np

    import lowprec_moe as lpm
    from bench_gemm import SHAPES, make_splits, operands
    from lowprec_moe.gemm import grouped_gemm

    spec = SHAPES[args.shape]
    splits = make_splits(spec, np.random.default_rng(0))
    e, t, n, k = len(splits), sum(splits), spec["n"], spec["k"]
    x = cp.random.standard_normal((t, k), dtype=cp.float32).astype(ml_dtypes.bfloat16)
    dy = cp.random.standard_normal((t, n), dtype=cp.float32).astype(ml_dtypes.bfloat16)
    w = (cp.random.standard_normal((e, n, k), dtype=cp.float32) * 0.05).astype(
        ml_dtypes.bfloat16)
    a, b = operands(lpm, args.mode, args.fmt, x, w, dy, splits)
    out_shape = (t, n) if args.mode == "fprop" else (t, k) if args.mode == "dgrad" else (e, n, k)
    out = cp.empty(out_shape, dtype=ml_dtypes.bfloat16)

    def call():
        grouped_gemm(a, b, splits, mode=args.mode, out=out)

    for _ in range(5):
        call()
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for _ in range(args.calls):
        call()
    t1 = time.perf_counter()
    cp.cuda.Device().synchronize()
    t2 = time.perf_counter()
    print(f"{args.shape} {args.mode} {args.fmt}: host enqueue {(t1 - t0) / args.calls * 1e6:.1f} "
          f"us per call; with the GPU drained {(t2 - t0) / args.calls * 1e6:.1f} us per call")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.calls):
        call()
    prof.disable()
    cp.cuda.Device().synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(14)


if __name__ == "__main__":
    main()
