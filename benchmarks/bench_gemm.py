"""Grouped GEMM throughput on the GPU: lowprec_moe vs ``torch._grouped_mm`` (bf16, cuBLAS/CUTLASS).

Usage::

    python benchmarks/bench_gemm.py [--quick] [--shapes NAME ...] [--modes fprop dgrad wgrad]
                                    [--formats bf16 mxfp8 nvfp4 nvfp4-rs] [--iters 20]
                                    [--warmup 5]

For every shape of NUMERICS §10 x {fprop, dgrad, wgrad} x {bf16, mxfp8, nvfp4, nvfp4 row-scaled}
it reports our time, TFLOP/s (``2 * M_total * N * K / t``) and GB/s (operand bytes as stored,
scales included, plus the bf16 output), the TFLOP/s of ``torch._grouped_mm`` on the same bf16
problem when torch is importable (only here: torch is never a dependency of the library), the
ratio, and the kernel / MMA instruction that ran. With torch, every case times torch and ours in
alternation (one sample each per round) and the ratio is the median of the per-round ratios, so
clock drift between runs does not enter it. Random data (never zeros); quantization happens outside
the timed region (GPU quantizers, falling back to the NumPy reference plus an upload when they are
unavailable); CUDA events, warm-up, medians; each timed sample spans enough back-to-back calls for
~2 ms (ours and torch alike), so a call's host work overlaps the previous kernel, and the host
enqueue time per call is printed beside it. Before each sample a one-thread kernel holds the GPU
for longer than the host needs to enqueue the sample's calls (``--no-hold`` turns it off), so the
events time the kernels back to back even where the Python launch path (~100-500 us per call,
depending on the host) is slower than the kernel -- without it, the memory-bound shape times the
host on slow hosts. Outputs are bf16 (``out=`` buffers preallocated).
``nvfp4-rs`` = row-scaled activations (fprop and wgrad; dgrad is never row-scaled). The compact
table is printed last. ``--quick`` runs a reduced set (< 60 s).

Targets (issue "Grouped GEMM kernels for Hopper"): >= 0.6x torch bf16 on compute-bound shapes,
>= 1.5x on the memory-bound NVFP4 fprop shape (E=128 x 16 tokens, 2048 -> 1536).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = {
    # name: experts, tokens per expert (or total with skew), K (in), N (out)
    "dsv3-fc1": dict(experts=8, tokens=65536, k=7168, n=2048),
    "dsv3-fc2": dict(experts=8, tokens=65536, k=2048, n=7168),
    "qwen-fc1": dict(experts=16, tokens=16 * 2560, k=4096, n=2048),
    "qwen-fc2": dict(experts=16, tokens=16 * 2560, k=1024, n=4096),
    "fine": dict(experts=128, tokens=128 * 512, k=2048, n=1536),
    "membound": dict(experts=128, tokens=128 * 16, k=2048, n=1536),
    "skewed": dict(experts=32, tokens=16384, k=2048, n=1536, skew=True),
}
MODES = ("fprop", "dgrad", "wgrad")
FORMATS = ("bf16", "mxfp8", "nvfp4", "nvfp4-rs")
QUICK = dict(shapes=["qwen-fc2", "membound"], formats=["bf16", "mxfp8", "nvfp4"], iters=5,
             warmup=2)


def make_splits(spec, rng) -> list[int]:
    e, t = spec["experts"], spec["tokens"]
    if not spec.get("skew"):
        return [t // e] * (e - 1) + [t - (t // e) * (e - 1)]
    w = 1.0 / np.arange(1, e + 1) ** 1.2
    w[3::4] = 0.0  # every fourth expert gets no tokens
    w = rng.permutation(w)
    s = np.floor(w / w.sum() * t).astype(np.int64)
    s[int(np.argmax(s))] += t - int(s.sum())
    return [int(v) for v in s]


def _reps(single_ms: float) -> int:
    """Back-to-back calls per timed sample: enough for ~2 ms of work, at most 50."""
    return max(1, min(50, int(2.0 / max(single_ms, 1e-3))))


#: GPU hold (main() sets it on the GPU; None: no hold): a function enqueuing a kernel that keeps
#: the GPU busy for the given microseconds, and the host enqueue us per call seen so far per fn.
_HOLD = None
_HOST_US: dict = {}


def _gpu_hold(cp):
    """A function us -> None enqueuing a one-thread kernel on the default stream that spins on
    the global timer for `us` microseconds (CuPy and torch both time on that stream)."""
    kern = cp.RawKernel(r'''
extern "C" __global__ void lpm_bench_hold(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}''', "lpm_bench_hold")
    return lambda us: kern((1,), (1,), (np.uint64(int(us * 1e3)),))


def _burst(event, elapsed, fn, reps) -> tuple[float, float]:
    """One timed sample: (ms per call, host enqueue us per call) over `reps` back-to-back calls
    between two events, so a call's host work overlaps the previous call's kernel (a single
    call between two events would also time the host's enqueue while the GPU idles). With a
    GPU hold (_HOLD), the GPU spins for 1.5x the host time the calls took last time before the
    first event, so the host enqueues ahead of the kernels and the sample times the GPU alone;
    without one, a host slower than the kernel starves the GPU and the sample shows the host."""
    start, end = event(), event()
    if _HOLD is not None and fn in _HOST_US:
        _HOLD(1.5 * reps * _HOST_US[fn] + 50.0)
    start.record()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    host = (time.perf_counter() - t0) / reps * 1e6
    end.record()
    end.synchronize()
    _HOST_US[fn] = max(host, _HOST_US.get(fn, 0.0))
    return elapsed(start, end) / reps, host


def _calibrate(event, sync, elapsed, fn, warmup) -> int:
    """Warm `fn` up and return the calls per sample (_reps of one timed call)."""
    for _ in range(warmup):
        fn()
    sync()
    return _reps(_burst(event, elapsed, fn, 1)[0])


def _burst_median_ms(event, sync, elapsed, fn, warmup, iters) -> tuple[float, float]:
    """(median ms per call, median host enqueue us per call) over `iters` samples (_burst)."""
    reps = _calibrate(event, sync, elapsed, fn, warmup)
    samples = [_burst(event, elapsed, fn, reps) for _ in range(iters)]
    return (statistics.median(s[0] for s in samples),
            statistics.median(s[1] for s in samples))


def _paired_median_ms(ours, peer, warmup, iters) -> tuple[float, float, float, float]:
    """Ours and a peer timed in alternation: each of `iters` rounds takes one peer sample, then
    one of ours, so both see the same clocks (back-to-back runs of the same code on the H200
    differ by up to ~12 %). `ours` / `peer`: (event, sync, elapsed,
    fn). Returns (ours median ms, ours median host us, peer median ms, median of the per-round
    ratios peer ms / ours ms)."""
    reps_o = _calibrate(*ours, warmup)
    reps_p = _calibrate(*peer, warmup)
    mine, theirs, ratios = [], [], []
    for _ in range(iters):
        p_ms, _ = _burst(peer[0], peer[2], peer[3], reps_p)
        o_ms, o_host = _burst(ours[0], ours[2], ours[3], reps_o)
        mine.append((o_ms, o_host))
        theirs.append(p_ms)
        ratios.append(p_ms / o_ms)
    return (statistics.median(m[0] for m in mine), statistics.median(m[1] for m in mine),
            statistics.median(theirs), statistics.median(ratios))


def _cupy_timer(cp, fn):
    """(event, sync, elapsed, fn) for CuPy's CUDA events."""
    return cp.cuda.Event, cp.cuda.Device().synchronize, cp.cuda.get_elapsed_time, fn


def _median_ms(cp, fn, warmup, iters) -> float:
    """Median ms per call of a CuPy-launched function timed alone (_burst_median_ms)."""
    return _burst_median_ms(*_cupy_timer(cp, fn), warmup, iters)[0]


def _quantize(lpm, x, splits, fmt, **kw):
    """GPU quantization, or the NumPy reference + upload when the GPU kernel is unavailable."""
    import cupy as cp

    try:
        return lpm.GroupedTensor.quantize(x, splits, fmt, **kw), "gpu"
    except (NotImplementedError, ImportError, AttributeError) as exc:
        print(f"  (GPU quantize unavailable: {type(exc).__name__}: {exc}; using the NumPy "
              "reference)")
        import dataclasses

        g = lpm.GroupedTensor.quantize(cp.asnumpy(x), splits, fmt, **kw)
        arrays = {f: cp.asarray(getattr(g, f)) for f in (
            "rowwise_data", "rowwise_scale", "columnwise_data", "columnwise_scale",
            "amax_rowwise", "amax_columnwise") if getattr(g, f) is not None}
        return dataclasses.replace(g, **arrays), "host"


def _nbytes(obj) -> int:
    return int(obj.nbytes)


def operands(lpm, mode, fmt, x, w, dy, splits):
    """(a, b) for one mode and format; quantized operands carry only the copies the GEMM uses."""
    e, n, k = w.shape
    if fmt == "bf16":
        return {"fprop": (x, w), "dgrad": (dy, w), "wgrad": (dy, x)}[mode]
    base = "nvfp4" if fmt.startswith("nvfp4") else "mxfp8"
    rs = fmt == "nvfp4-rs"
    w2 = w.reshape(e * n, k)
    wkw = dict(block_2d=True) if base == "nvfp4" else {}
    if mode == "fprop":
        a, _ = _quantize(lpm, x, splits, base, row_scaled=rs)
        b, _ = _quantize(lpm, w2, [n] * e, base, **wkw)
    elif mode == "dgrad":
        a, _ = _quantize(lpm, dy, splits, base)
        b, _ = _quantize(lpm, w2, [n] * e, base, rowwise=False, columnwise=True, **wkw)
    else:
        a, _ = _quantize(lpm, dy, splits, base, rowwise=False, columnwise=True)
        b, _ = _quantize(lpm, x, splits, base, rowwise=False, columnwise=True, row_scaled=rs)
    return a, b


def torch_setup(mode, splits, n, k):
    """A closure running torch._grouped_mm on random bf16 data of the same problem, or None."""
    try:
        import torch
    except Exception:
        return None, "torch not importable"
    if not torch.cuda.is_available():
        return None, "torch without CUDA"
    dev = "cuda"
    t = int(sum(splits))
    e = len(splits)
    g = torch.Generator(device=dev).manual_seed(0)
    offs = torch.tensor(np.cumsum(splits), dtype=torch.int32, device=dev)
    x = torch.randn(t, k, device=dev, dtype=torch.bfloat16, generator=g)
    dy = torch.randn(t, n, device=dev, dtype=torch.bfloat16, generator=g)
    w = torch.randn(e, n, k, device=dev, dtype=torch.bfloat16, generator=g)
    if mode == "fprop":
        variants = [lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)]
    elif mode == "dgrad":
        variants = [lambda: torch._grouped_mm(dy, w, offs=offs),
                    lambda: torch._grouped_mm(dy, w.transpose(-2, -1).contiguous()
                                              .transpose(-2, -1), offs=offs)]
    else:
        dyt = dy.t().contiguous()
        variants = [lambda: torch._grouped_mm(dy.t(), x, offs=offs),
                    lambda: torch._grouped_mm(dyt, x, offs=offs),
                    lambda: torch._grouped_mm(dy.t(), x.t().contiguous().t(), offs=offs)]
    err = None
    for fn in variants:
        try:
            fn()
            torch.cuda.synchronize()
            return fn, None
        except Exception as exc:  # layout / alignment not supported by this torch build
            err = f"{type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
    return None, err


def _torch_timer(fn):
    """(event, sync, elapsed, fn) for torch's CUDA events."""
    import torch

    return (lambda: torch.cuda.Event(enable_timing=True), torch.cuda.synchronize,
            lambda s, e: s.elapsed_time(e), fn)


def torch_time(fn, warmup, iters) -> float:
    """Median ms per call of a torch function timed alone (_burst_median_ms)."""
    return _burst_median_ms(*_torch_timer(fn), warmup, iters)[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="reduced run (< 60 s)")
    ap.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=None)
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    ap.add_argument("--formats", nargs="+", choices=FORMATS, default=None)
    ap.add_argument("--iters", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--no-hold", action="store_true",
                    help="no GPU hold before each sample (time host-bound calls as they run)")
    args = ap.parse_args()
    shapes = args.shapes or (QUICK["shapes"] if args.quick else list(SHAPES))
    formats = args.formats or (QUICK["formats"] if args.quick else list(FORMATS))
    iters = args.iters or (QUICK["iters"] if args.quick else 20)
    warmup = args.warmup or (QUICK["warmup"] if args.quick else 5)

    import cupy as cp
    import ml_dtypes

    import lowprec_moe as lpm
    from lowprec_moe.backends.cupy.gemm import launch as C
    from lowprec_moe.gemm import _validate, grouped_gemm

    global _HOLD
    _HOLD = None if args.no_hold else _gpu_hold(cp)
    t_start = time.time()
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    print(f"device: {props['name'].decode()}  (cc {dev.compute_capability}), "
          f"iters {iters}, warm-up {warmup}, GPU hold {'off' if args.no_hold else 'on'}")
    rows = []
    rng = np.random.default_rng(0)
    for shape in shapes:
        spec = SHAPES[shape]
        splits = make_splits(spec, rng)
        e, t, n, k = len(splits), sum(splits), spec["n"], spec["k"]
        flops = 2.0 * t * n * k
        xh = cp.random.standard_normal((t, k), dtype=cp.float32)
        x = xh.astype(ml_dtypes.bfloat16)
        dy = cp.random.standard_normal((t, n), dtype=cp.float32).astype(ml_dtypes.bfloat16)
        w = (cp.random.standard_normal((e, n, k), dtype=cp.float32) * 0.05).astype(
            ml_dtypes.bfloat16)
        del xh
        for mode in args.modes:
            tfn, terr = (None, "disabled") if args.no_torch else torch_setup(mode, splits, n, k)
            for fmt in formats:
                if fmt == "nvfp4-rs" and mode == "dgrad":
                    continue
                label = f"{shape:9s} {mode:5s} {fmt:8s}"
                try:
                    a, b = operands(lpm, mode, fmt, x, w, dy, splits)
                    out_shape = (t, n) if mode == "fprop" else (t, k) if mode == "dgrad" \
                        else (e, n, k)
                    out = cp.empty(out_shape, dtype=ml_dtypes.bfloat16)
                    p = _validate(mode, a, b, splits, bias=None, probs=None, out_dtype=None,
                                  out=out, accumulate=False)
                    info = C.kernel_info(p)
                    fn = lambda: grouped_gemm(a, b, splits, mode=mode, out=out)  # noqa: E731
                    t_ms = ratio = None
                    if tfn:
                        ms, host_us, t_ms, ratio = _paired_median_ms(
                            _cupy_timer(cp, fn), _torch_timer(tfn), warmup, iters)
                    else:
                        ms, host_us = _burst_median_ms(*_cupy_timer(cp, fn), warmup, iters)
                except Exception as exc:
                    print(f"{label} FAILED: {type(exc).__name__}: {exc}")
                    rows.append((shape, mode, fmt, None, None, None, None, None, "failed"))
                    continue
                tf = flops / (ms * 1e-3) / 1e12
                nbytes = sum(_nbytes(arr) for obj in (a, b) for arr in (
                    [obj] if not hasattr(obj, "format") else
                    [v for v in (obj.rowwise_data, obj.rowwise_scale, obj.columnwise_data,
                                 obj.columnwise_scale) if v is not None])) + out.nbytes
                gbs = nbytes / (ms * 1e-3) / 1e9
                t_tf = flops / (t_ms * 1e-3) / 1e12 if t_ms else None
                instr = f"{info['instruction']} {info['tile'][0]}x{info['tile'][1]}"
                rows.append((shape, mode, fmt, ms, tf, gbs, t_tf, ratio, instr))
                print(f"{label} {ms:9.3f} ms {tf:8.1f} TFLOP/s {gbs:8.1f} GB/s  torch "
                      f"{'%8.1f' % t_tf if t_tf else '     n/a'}  ratio "
                      f"{'%5.3f' % ratio if ratio else '  n/a'}  {instr}  host {host_us:.0f} us",
                      flush=True)
            if terr and not tfn:
                print(f"{shape:9s} {mode:5s} torch._grouped_mm unavailable: {terr}")
        del x, dy, w
        cp.get_default_memory_pool().free_all_blocks()

    # three decimals: some cells lie within a few thousandths of the 0.6x target
    print("\n== summary (bf16 outputs; ratio = ours / torch._grouped_mm bf16)")
    hdr = (f"{'shape':9s} {'mode':5s} {'format':8s} {'ms':>9s} {'TFLOP/s':>8s} {'GB/s':>8s} "
           f"{'torch':>8s} {'ratio':>6s}  instruction")
    print(hdr)
    print("-" * len(hdr))
    for shape, mode, fmt, ms, tf, gbs, t_tf, ratio, instr in rows:
        if ms is None:
            print(f"{shape:9s} {mode:5s} {fmt:8s} {'failed':>9s}")
            continue
        print(f"{shape:9s} {mode:5s} {fmt:8s} {ms:9.3f} {tf:8.1f} {gbs:8.1f} "
              f"{'%8.1f' % t_tf if t_tf else '     n/a'} {'%6.3f' % ratio if ratio else '   n/a'}"
              f"  {instr}")
    print(f"(total {time.time() - t_start:.1f} s)")


if __name__ == "__main__":
    main()
