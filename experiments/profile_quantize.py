"""Where the quantize time goes: raw kernel launches vs the public API, and host time per call.

Usage: ``python experiments/profile_quantize.py [--m 16384 --k 7168]``

For each path: GPU time per call (CUDA events around 10 back-to-back calls, median of 7), host
time per call (wall clock over 30 calls without synchronizing; if it exceeds the GPU time the
back-to-back time is host bound), and the raw kernels launched alone on preallocated buffers.
Bytes are counted as bench_quantize.py does (every read of x + every byte written).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import ml_dtypes
import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, default=16384)
    ap.add_argument("--k", type=int, default=7168)
    ap.add_argument("--cprofile", action="store_true",
                    help="also print the host-side profile of the grouped calls")
    args = ap.parse_args()
    import cupy as cp

    import lowprec_moe as lpm
    from lowprec_moe import kernels
    from lowprec_moe.backends.cupy import mxfp8 as MX
    from lowprec_moe.backends.cupy import nvfp4 as NV

    def gpu(fn, inner=10, repeat=7):
        for _ in range(3):
            fn()
        cp.cuda.Device().synchronize()
        ts = []
        for _ in range(repeat):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record()
            for _ in range(inner):
                fn()
            b.record()
            b.synchronize()
            ts.append(cp.cuda.get_elapsed_time(a, b) * 1e-3 / inner)
        return statistics.median(ts)

    def host(fn, n=30):
        fn()
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        cp.cuda.Device().synchronize()
        return (t1 - t0) / n

    m, k = args.m, args.k
    rng = cp.random.default_rng(0)
    x = rng.standard_normal((m, k), dtype=cp.float32).astype(ml_dtypes.bfloat16)
    xb = x.nbytes
    buf = cp.empty_like(x)
    rows = []

    def add(name, nbytes, t, th=None):
        rows.append((name, nbytes, t, th))

    t_copy = gpu(lambda: cp.copyto(buf, x))
    copy_bw = 2 * xb / t_copy
    add("d2d copy", 2 * xb, t_copy)
    # pure read: a reduction that reads x once (cupy max over a uint32 view)
    xu = x.view(cp.uint32)
    add("cupy max (read x once)", xb, gpu(lambda: xu.max()))

    sm = NV._sm_count()
    NULL = np.uint64(0)
    # ---------------------------------------------------------------- nvfp4 per tensor
    nv_out = 2 * (m * k // 2 + m * k // 16) + 8
    ab = cp.zeros(2, dtype=cp.uint32)
    tabs = cp.empty(2 * 132, dtype=cp.float32)
    amax_fn = kernels.get_function("nvfp4", "lpm_nvfp4_amax_tensor_bf16")
    q_fn = kernels.get_function("nvfp4", "lpm_nvfp4_quantize_bf16")
    grid_x = max(1, min(-(-(m * k // 8) // 1024), 4 * sm))

    def amax_raw():
        cp.cuda.runtime.memsetAsync(ab.data.ptr, 0, 8, cp.cuda.get_current_stream().ptr)
        amax_fn((grid_x, 1), (256,), (x, np.int64(k), np.int64(m), NULL, np.int32(0),
                                      ab[:1], ab[1:], tabs))

    amax_raw()
    rd = cp.empty((m, k // 2), cp.uint8)
    rs = cp.empty((m, k // 16), cp.uint8)
    cd = cp.empty(k * m // 2, cp.uint8)
    cs = cp.empty(k * m // 16, cp.uint8)
    n_tiles = (-(-m // 64)) * (k // 128)
    amax_f = ab[:1].view(cp.float32)

    def q_raw(flags):
        def f():
            q_fn((n_tiles,), (128,), (x, np.int64(k), np.int64(m), NULL, np.int32(0),
                                      np.int32(k // 128), np.int32(flags), np.uint32(0),
                                      np.uint64(0), amax_f, amax_f, tabs, rd, rs, cd, cs,
                                      NULL, NULL))
        return f

    add("nvfp4 raw amax kernel (+memset)", xb + 8, gpu(amax_raw))
    add("nvfp4 raw quantize row+col", xb + nv_out - 8, gpu(q_raw(3)))
    add("nvfp4 raw quantize row only", xb + nv_out // 2, gpu(q_raw(1)))
    add("nvfp4 raw quantize col only", xb + nv_out // 2, gpu(q_raw(2)))
    add("nvfp4 raw amax + quantize row+col", 2 * xb + nv_out,
        gpu(lambda: (amax_raw(), q_raw(3)())))
    f = lambda: NV.quantize_nvfp4(x, rowwise=True, columnwise=True)  # noqa: E731
    add("nvfp4 launcher quantize_nvfp4", 2 * xb + nv_out, gpu(f), host(f))
    f = lambda: lpm.quantize(x, "nvfp4", columnwise=True)  # noqa: E731
    add("nvfp4 lpm.quantize row+col", 2 * xb + nv_out, gpu(f), host(f))
    f = lambda: lpm.quantize(x, "nvfp4", columnwise=True, row_scaled=True)  # noqa: E731
    add("nvfp4 lpm.quantize row-scaled", 2 * xb + nv_out, gpu(f), host(f))
    f = lambda: lpm.quantize(x, "nvfp4", columnwise=True, rht=True,  # noqa: E731
                             stochastic_rounding=True, seed=1)
    add("nvfp4 lpm.quantize rht+sr", 2 * xb + nv_out, gpu(f, 3, 3), host(f, 5))
    f = lambda: lpm.quantize(x, "nvfp4", columnwise=True, rht=True)  # noqa: E731
    add("nvfp4 lpm.quantize rht", 2 * xb + nv_out, gpu(f, 3, 3))
    f = lambda: lpm.quantize(x, "nvfp4", columnwise=True, stochastic_rounding=True,  # noqa
                             seed=1)
    add("nvfp4 lpm.quantize sr", 2 * xb + nv_out, gpu(f, 3, 3))
    splits = [m // 8] * 8
    f = lambda: lpm.GroupedTensor.quantize(x, splits, "nvfp4", columnwise=True)  # noqa: E731
    add("nvfp4 grouped8 row+col", 2 * xb + nv_out, gpu(f), host(f))
    del rd, rs, cd, cs

    # ---------------------------------------------------------------- mxfp8
    mx_out = 2 * (m * k + m * k // 32)
    mq = kernels.get_function("mxfp8", "lpm_mxfp8_quantize_bf16")
    tiles = -(-m // 32)
    r_d = cp.empty((m, k), cp.uint8)
    r_s = cp.empty((m, k // 32), cp.uint8)
    c_d = cp.empty((tiles * 32, k), cp.uint8)
    c_s = cp.empty((tiles, k), cp.uint8)
    grid = (-(-(tiles * (k // 128)) // 4),)

    def mx_raw(flags):
        def f():
            mq(grid, (128,), (x, np.int64(m), np.int64(k), NULL, NULL, np.int32(1),
                              np.int64(tiles), r_d, r_s, c_d, c_s, np.int32(flags), NULL,
                              NULL))
        return f

    add("mxfp8 raw quantize row+col", xb + mx_out, gpu(mx_raw(3)))
    add("mxfp8 raw quantize row only", xb + mx_out // 2, gpu(mx_raw(1)))
    add("mxfp8 raw quantize col only", xb + mx_out // 2, gpu(mx_raw(2)))
    f = lambda: MX.quantize_mxfp8(x, rowwise=True, columnwise=True)  # noqa: E731
    add("mxfp8 launcher quantize_mxfp8", xb + mx_out, gpu(f), host(f))
    f = lambda: lpm.quantize(x, "mxfp8", columnwise=True)  # noqa: E731
    add("mxfp8 lpm.quantize row+col", xb + mx_out, gpu(f), host(f))
    f = lambda: lpm.GroupedTensor.quantize(x, splits, "mxfp8", columnwise=True)  # noqa: E731
    add("mxfp8 grouped8 row+col", xb + mx_out, gpu(f), host(f))
    del c_d, c_s
    wire = lpm.GroupedTensor.from_mxfp8_rowwise(r_d, r_s, splits)
    wc_bytes = m * k + m * k // 32 + m * k + m * k // 32

    def wc():
        return lpm.GroupedTensor.from_mxfp8_rowwise(r_d, r_s, splits).with_columnwise()

    add("with_columnwise (wire, 8 experts)", wc_bytes, gpu(wc), host(wc))
    f = lambda: MX.grouped_mxfp8_columnwise_from_rowwise(wire)  # noqa: E731
    add("with_columnwise launcher", wc_bytes, gpu(f), host(f))

    print(f"GPU: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}  SMs {sm}  "
          f"shape [{m}, {k}] bf16")
    print(f"{'case':40s} {'MB':>8s} {'gpu us':>8s} {'host us':>8s} {'GB/s':>8s} {'x copy':>7s}")
    for name, nb, t, th in rows:
        hs = f"{th * 1e6:8.1f}" if th is not None else f"{'':8s}"
        print(f"{name:40s} {nb / 1e6:8.1f} {t * 1e6:8.1f} {hs} {nb / t / 1e9:8.1f} "
              f"{nb / t / copy_bw:7.2f}")
    if args.cprofile:
        import cProfile
        import pstats

        for name, fn in (("grouped8 mxfp8", lambda: lpm.GroupedTensor.quantize(
                x, splits, "mxfp8", columnwise=True)),
                         ("grouped8 nvfp4", lambda: lpm.GroupedTensor.quantize(
                             x, splits, "nvfp4", columnwise=True)),
                         ("with_columnwise", wc)):
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(50):
                fn()
            pr.disable()
            cp.cuda.Device().synchronize()
            print(f"--- host profile: {name}, 50 calls (tottime, s)")
            pstats.Stats(pr).sort_stats("tottime").print_stats(8)
    return 0


if __name__ == "__main__":
    sys.exit(main())
