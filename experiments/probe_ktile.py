"""Where a grouped GEMM's time goes: fixed cost per output tile vs cost per 64-deep k-tile.

Usage::

    python experiments/probe_ktile.py [--formats bf16 nvfp4 mxfp8] [--ks 64 256 1024 4096]

Runs fprop on qwen-fc2's M and N (16 experts x 2560 tokens, N = 4096) for several K and fits
``t = waves * (fixed + per_ktile * K / 64)`` by least squares, with ``waves`` = 128 x 256 output
tiles / SMs. ``fixed`` holds the prologue (filling the pipeline), the epilogue and the launch;
``per_ktile`` is the main loop's steady state (0.55 us at the wgmma bf16 rate). The same fit
on ``torch._grouped_mm`` bf16 (when importable) gives the peer's numbers on the same problems.
CUDA events, warm-up, medians (bench_gemm's timer).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--formats", nargs="+", default=["bf16", "nvfp4", "mxfp8"])
    ap.add_argument("--ks", nargs="+", type=int, default=[64, 256, 1024, 4096])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--no-torch", action="store_true")
    args = ap.parse_args()

    import cupy as cp
    import ml_dtypes

    import lowprec_moe as lpm
    from bench_gemm import _median_ms, operands, torch_setup, torch_time
    from lowprec_moe.gemm import grouped_gemm

    e, per, n = 16, 2560, 4096
    splits = [per] * e
    t = e * per
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    waves = e * (-(-per // 128)) * (n // 256) / sms
    bf = ml_dtypes.bfloat16
    g = cp.random.default_rng(0)
    series: dict[str, list[float]] = {}
    for k in args.ks:
        x = g.standard_normal((t, k), dtype=cp.float32).astype(bf)
        w = g.standard_normal((e, n, k), dtype=cp.float32).astype(bf)
        out = cp.empty((t, n), dtype=bf)
        for fmt in args.formats:
            a, b = operands(lpm, "fprop", fmt, x, w, None, splits)
            ms = _median_ms(cp, lambda: grouped_gemm(a, b, splits, mode="fprop", out=out),
                            5, args.iters)
            series.setdefault(fmt, []).append(ms)
            print(f"K={k:5d} {fmt:6s} {ms:8.3f} ms", flush=True)
            del a, b
        if not args.no_torch:
            fn, _ = torch_setup("fprop", splits, n, k)
            if fn is not None:
                ms = torch_time(fn, 5, args.iters)
                series.setdefault("torch", []).append(ms)
                print(f"K={k:5d} torch  {ms:8.3f} ms", flush=True)
        del x, w, out
        cp.get_default_memory_pool().free_all_blocks()

    kt = np.array(args.ks, dtype=np.float64) / 64.0
    design = np.stack([np.ones_like(kt), kt], axis=1) * waves
    print(f"\n{waves:.1f} waves of 128x256 tiles; per tile: fixed + per_ktile * K/64 (us)")
    print(f"{'format':8s} {'fixed us':>9s} {'per k-tile us':>14s}")
    for name, ms in series.items():
        if len(ms) != len(kt):
            continue
        coef, *_ = np.linalg.lstsq(design, np.array(ms) * 1e3, rcond=None)
        print(f"{name:8s} {coef[0]:9.2f} {coef[1]:14.3f}")


if __name__ == "__main__":
    main()
