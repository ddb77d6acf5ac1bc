"""GPU quantization throughput against device-to-device copy bandwidth (NUMERICS §10).

Usage: ``python benchmarks/bench_quantize.py [--quick] [--repeat 20]``

For each case: random bf16 input (never zeros), warm-up, then the median of ``--repeat`` timings
with CUDA events, each over 10 back-to-back calls (per-call time = event time / 10). Bytes counted = every read of the input (an NVFP4 per-tensor amax pass reads it
once more) + every output byte written (data, scales, amax). GB/s is those bytes over the median
time; the ratio divides by the bandwidth of a device-to-device copy (bytes read + written)
measured in the same run. Target: >= 0.85 for the plain row+col quantizes.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import ml_dtypes


def _time(fn, repeat: int, inner: int = 10) -> float:
    """Median seconds per call; each sample times ``inner`` back-to-back calls between two
    events so that host-side launch work overlaps the previous call's kernels."""
    import cupy as cp

    for _ in range(3):
        fn()
    cp.cuda.Device().synchronize()
    times = []
    for _ in range(repeat):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(inner):
            fn()
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) * 1e-3 / inner)
    return statistics.median(times)


def _out_bytes(obj) -> int:
    return sum(int(getattr(obj, f).nbytes) for f in
               ("rowwise_data", "rowwise_scale", "columnwise_data", "columnwise_scale",
                "amax_rowwise", "amax_columnwise") if getattr(obj, f, None) is not None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one shape, fewer repeats")
    ap.add_argument("--repeat", type=int, default=None,
                    help="timed samples per case (default 20, 5 with --quick)")
    ap.add_argument("--cases", default="",
                    help="comma-separated substrings; run only the cases whose name holds one")
    args = ap.parse_args()
    try:
        import cupy as cp
    except ImportError:
        print("bench_quantize needs CuPy and a GPU", file=sys.stderr)
        return 1
    import lowprec_moe as lpm

    shapes = [(16384, 7168)] if args.quick else [(16384, 7168), (65536, 2048)]
    repeat = args.repeat if args.repeat is not None else (5 if args.quick else 20)
    print(f"GPU: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}")
    rows = []
    for m, k in shapes:
        rng = cp.random.default_rng(0)
        x = rng.standard_normal((m, k), dtype=cp.float32).astype(ml_dtypes.bfloat16)
        in_bytes = x.nbytes
        buf = cp.empty_like(x)
        t_copy = _time(lambda: cp.copyto(buf, x), repeat)
        copy_bw = 2 * in_bytes / t_copy
        rows.append((f"[{m}, {k}] d2d copy", 2 * in_bytes, t_copy, copy_bw, 1.0))
        splits = [m // 8] * 8
        wire = lpm.GroupedTensor.quantize(x, splits, "mxfp8")
        wire = lpm.GroupedTensor.from_mxfp8_rowwise(wire.rowwise_data, wire.rowwise_scale, splits)
        cases = [
            ("nvfp4 row+col", 2, lambda: lpm.quantize(x, "nvfp4", columnwise=True)),
            ("nvfp4 row-scaled row+col", 2,
             lambda: lpm.quantize(x, "nvfp4", columnwise=True, row_scaled=True)),
            ("nvfp4 row+col rht", 2,
             lambda: lpm.quantize(x, "nvfp4", columnwise=True, rht=True)),
            ("nvfp4 row+col sr", 2,
             lambda: lpm.quantize(x, "nvfp4", columnwise=True, stochastic_rounding=True, seed=1)),
            ("nvfp4 row+col rht+sr", 2,
             lambda: lpm.quantize(x, "nvfp4", columnwise=True, rht=True,
                                  stochastic_rounding=True, seed=1)),
            ("mxfp8 row+col", 1, lambda: lpm.quantize(x, "mxfp8", columnwise=True)),
            ("grouped8 nvfp4 row+col", 2,
             lambda: lpm.GroupedTensor.quantize(x, splits, "nvfp4", columnwise=True)),
            ("grouped8 nvfp4 row+col rht+sr", 2,
             lambda: lpm.GroupedTensor.quantize(x, splits, "nvfp4", columnwise=True, rht=True,
                                                stochastic_rounding=True, seed=1)),
            ("grouped8 mxfp8 row+col", 1,
             lambda: lpm.GroupedTensor.quantize(x, splits, "mxfp8", columnwise=True)),
        ]
        wanted = [c for c in args.cases.split(",") if c]
        for name, reads, fn in cases:
            if wanted and not any(c in name for c in wanted):
                continue
            try:
                out = fn()
                t = _time(fn, repeat)
                nbytes = reads * in_bytes + _out_bytes(out)
                rows.append((f"[{m}, {k}] {name}", nbytes, t, nbytes / t, nbytes / t / copy_bw))
            except Exception as e:  # keep going: report the failure in the table
                rows.append((f"[{m}, {k}] {name}: {type(e).__name__}: {e}"[:110], 0, 0, 0, 0))
        if not wanted or any(c in "with_columnwise" for c in wanted):
            try:
                def wc():
                    return lpm.GroupedTensor.from_mxfp8_rowwise(
                        wire.rowwise_data, wire.rowwise_scale, splits).with_columnwise()
                out = wc()
                t = _time(wc, repeat)
                nbytes = (wire.rowwise_data.nbytes + wire.rowwise_scale.nbytes
                          + out.columnwise_data.nbytes + out.columnwise_scale.nbytes)
                rows.append((f"[{m}, {k}] with_columnwise (wire, 8 experts)", nbytes, t, nbytes / t,
                             nbytes / t / copy_bw))
            except Exception as e:
                rows.append((f"[{m}, {k}] with_columnwise: {type(e).__name__}: {e}"[:110], 0, 0, 0, 0))
        del x, buf
        cp.get_default_memory_pool().free_all_blocks()
    print(f"{'case':52s} {'MB':>9s} {'us':>9s} {'GB/s':>8s} {'x copy':>7s}")
    for name, nbytes, t, bw, ratio in rows:
        if t == 0:
            print(name)
            continue
        print(f"{name:52s} {nbytes / 1e6:9.1f} {t * 1e6:9.1f} {bw / 1e9:8.1f} {ratio:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
