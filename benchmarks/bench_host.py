"""Host time per call of the GPU entry points: what the Python launch path costs the caller.

Usage::

    python benchmarks/bench_host.py [--reps 200] [--profile nvfp4] [--profile-out FILE]

Each sample synchronises the stream first (outside the timed region), then times one call with
the host clock: the GPU is idle when the call starts, so the enqueue never waits for a full
launch queue and the number is the time the calling thread spends before it can issue its next
call. Medians over ``--reps`` calls after warm-up (the first calls compile the kernels and fill
the caches). The problems are small (E=8 x 256 tokens, 1024 -> 1024), since only the host side
is timed; the results do not depend on the kernel's speed.

Rows:

* ``gemm <format> <mode>``: one ``grouped_gemm_{fprop,dgrad,wgrad}`` call on pre-quantized
  operands (bf16 arrays, NVFP4 / MXFP8 ``GroupedTensor``), output preallocated.
* ``quantize <format>``: one ``GroupedTensor.quantize`` (rowwise + columnwise).
* ``linear <recipe>``: ``grouped_linear_forward`` + ``grouped_linear_backward`` with host splits.
* ``mlp <recipe>``: ``grouped_mlp_forward`` + ``grouped_mlp_backward`` (SwiGLU, probs).
* ``... @device``: the same call with the splits as a device array (bf16 paths).

Targets: <= 30 us per grouped GEMM call, <= 250 us per GroupedLinear forward + backward.
``--profile RECIPE`` also writes a cProfile of the linear step of that recipe (the 40 most
expensive functions by cumulative time).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import math
import pstats
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import lowprec_moe as lpm  # noqa: E402
from lowprec_moe import gemm as G  # noqa: E402
from lowprec_moe.backend import cupy_available  # noqa: E402
from _harness import Backend, recipes  # noqa: E402

EXPERTS, TOKENS, K, N = 8, 256, 1024, 1024
TARGETS_US = {"gemm": 30.0, "linear": 250.0}


def host_us(fn, sync, *, warmup: int, reps: int) -> float:
    """Median host microseconds of ``fn()``, the stream idle at each call's start."""
    for _ in range(warmup):
        fn()
    sync()
    samples = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    sync()
    return 1e6 * statistics.median(samples)


def cases(be: Backend):
    """(name, callable) of every timed call."""
    xp = be.xp
    g, m = EXPERTS, EXPERTS * TOKENS
    splits = [TOKENS] * g
    x = be.randn((m, K), 1)
    w = be.randn((g, N, K), 2, 1.0 / math.sqrt(K))
    dy = be.randn((m, N), 3, 1.0 / math.sqrt(m))
    probs = be.uniform(m, 4)
    out_f = xp.empty((m, N), dtype=x.dtype)
    out_d = xp.empty((m, K), dtype=x.dtype)
    out_w = xp.empty((g, N, K), dtype=x.dtype)
    rows = []
    rows.append(("gemm bf16 fprop", lambda: G.grouped_gemm_fprop(x, w, splits, out=out_f)))
    rows.append(("gemm bf16 dgrad", lambda: G.grouped_gemm_dgrad(dy, w, splits, out=out_d)))
    rows.append(("gemm bf16 wgrad", lambda: G.grouped_gemm_wgrad(dy, x, splits, out=out_w)))
    for fmt in ("mxfp8", "nvfp4"):
        xq = lpm.GroupedTensor.quantize(x, splits, fmt, columnwise=True)
        dyq = lpm.GroupedTensor.quantize(dy, splits, fmt, columnwise=True)
        wq = lpm.GroupedTensor.quantize(w.reshape(g * N, K), [N] * g, fmt, columnwise=True)
        rows.append((f"gemm {fmt} fprop",
                     lambda xq=xq, wq=wq: G.grouped_gemm_fprop(xq, wq, out=out_f)))
        rows.append((f"gemm {fmt} dgrad",
                     lambda dyq=dyq, wq=wq: G.grouped_gemm_dgrad(dyq, wq, out=out_d)))
        rows.append((f"gemm {fmt} wgrad",
                     lambda dyq=dyq, xq=xq: G.grouped_gemm_wgrad(dyq, xq, out=out_w)))
        rows.append((f"quantize {fmt}",
                     lambda fmt=fmt: lpm.GroupedTensor.quantize(x, splits, fmt,
                                                                columnwise=True)))
    ds = xp.asarray(np.asarray(splits, dtype=np.int64))  # device splits
    for fmt in ("mxfp8", "nvfp4"):
        rows.append((f"quantize {fmt} @device",
                     lambda fmt=fmt: lpm.GroupedTensor.quantize(x, ds, fmt, columnwise=True)))
    rows.append(("gemm bf16 fprop @device",
                 lambda: G.grouped_gemm_fprop(x, w, ds, out=out_f)))
    rows.append(("gemm bf16 wgrad @device",
                 lambda: G.grouped_gemm_wgrad(dy, x, ds, out=out_w)))
    w1 = be.randn((g, 2 * N, K), 5, 1.0 / math.sqrt(K))
    w2 = be.randn((g, K, N), 6, 1.0 / math.sqrt(N))
    dy2 = be.randn((m, K), 7, 1.0 / math.sqrt(m))
    for rname, recipe in recipes(lpm).items():
        def linear(recipe=recipe, splits_arg=splits):
            y, ctx = lpm.grouped_linear_forward(x, splits_arg, w, recipe=recipe, seed=1)
            return lpm.grouped_linear_backward(dy, ctx)

        def mlp(recipe=recipe, splits_arg=splits):
            y, ctx = lpm.grouped_mlp_forward(x, splits_arg, w1, w2, probs=probs, recipe=recipe,
                                             seed=1)
            return lpm.grouped_mlp_backward(dy2, ctx)

        rows.append((f"linear {rname}", linear))
        rows.append((f"mlp {rname}", mlp))
        if rname == "bf16":
            rows.append(("linear bf16 @device", lambda f=linear: f(splits_arg=ds)))
            rows.append(("mlp bf16 @device", lambda f=mlp: f(splits_arg=ds)))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--profile", default=None, choices=sorted(recipes(lpm)),
                    help="also profile the linear step of this recipe")
    ap.add_argument("--profile-out", default=None, help="file for the profile (default: stdout)")
    args = ap.parse_args(argv)
    if not cupy_available():
        print("bench_host.py times the GPU launch path: it needs CuPy and a GPU",
              file=sys.stderr)
        return 2
    be = Backend("gpu")
    print(f"device: {be.name}; E={EXPERTS} x {TOKENS} tokens, K={K}, N={N}; "
          f"median of {args.reps} calls")
    print(f"{'call':28s} {'host us':>9s} {'target':>7s}")
    table = {}
    for name, fn in cases(be):
        us = host_us(fn, be.sync, warmup=args.warmup, reps=args.reps)
        table[name] = us
        target = TARGETS_US.get(name.split()[0])
        print(f"{name:28s} {us:9.1f} {'' if target is None else f'{target:7.0f}'}",
              flush=True)
    if args.profile:
        fn = dict(cases(be))[f"linear {args.profile}"]
        for _ in range(args.warmup):
            fn()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(50):
            fn()
        be.sync()
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(40)
        text = f"profile of 50 x linear {args.profile}\n" + buf.getvalue()
        if args.profile_out:
            Path(args.profile_out).write_text(text)
        else:
            print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
