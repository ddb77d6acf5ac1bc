"""Interleaved A/B timing of grouped-GEMM variants in one process (GPU only).

Usage::

    python benchmarks/ab_gemm.py --variants "auto:" \
        "cp_async:kernel=grouped_gemm_sm90_nvfp4_wgmma_ws_cpasync_128x256_kk" \
        [--shapes qwen-fc2 ...] [--modes fprop ...] [--formats nvfp4 ...] [--rounds 15]

A variant is ``name:KEY=VALUE,KEY=VALUE`` with the keys ``kernel`` and ``mxfp8_mma``
(:class:`lowprec_moe.config.GemmOptions`) and ``kernel_dir`` (a copy of the kernel sources,
:func:`lowprec_moe.config.kernel_directory`). Consecutive runs of the same kernel on the H200
differ by up to ~12 %, so single A/B pairs of separate processes cannot resolve small
changes: here every round takes one burst sample of ``torch._grouped_mm`` bf16 (when torch is
importable) and of every variant in turn, on the same operands, and the table reports each
variant's median ms, its median per-round ratio to the first variant and to torch. Problems,
data and timing are bench_gemm.py's (random data, CUDA events, bursts of ~2 ms, warm-up).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_gemm as B  # noqa: E402


_KEYS = ("kernel", "mxfp8_mma", "kernel_dir")


def parse_variant(text: str) -> tuple[str, dict]:
    """``name:KEY=V,KEY2=V2`` -> (name, {KEY: V, ...}); ValueError naming a malformed one or
    an unknown key."""
    name, _, rest = text.partition(":")
    opts = {}
    for item in filter(None, rest.split(",")):
        key, eq, val = item.partition("=")
        if not eq or not key:
            raise ValueError(f"variant {text!r}: {item!r} is not KEY=VALUE")
        if key not in _KEYS:
            raise ValueError(f"variant {text!r}: {key!r} is not one of {_KEYS}")
        opts[key] = val
    if not name:
        raise ValueError(f"variant {text!r} has no name")
    return name, opts


def _with_options(opts: dict, fn):
    """fn() with a variant's options in force (only during the call)."""
    from lowprec_moe import config

    gemm = {k: v for k, v in opts.items() if k != "kernel_dir"}
    with contextlib.ExitStack() as stack:
        stack.enter_context(config.gemm(**gemm))
        if "kernel_dir" in opts:
            stack.enter_context(config.kernel_directory(opts["kernel_dir"]))
        return fn()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", nargs="+", required=True)
    ap.add_argument("--shapes", nargs="+", choices=list(B.SHAPES), default=["qwen-fc2"])
    ap.add_argument("--modes", nargs="+", choices=B.MODES, default=list(B.MODES))
    ap.add_argument("--formats", nargs="+", choices=B.FORMATS, default=["nvfp4"])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--no-hold", action="store_true",
                    help="no GPU hold before each sample (bench_gemm._burst)")
    args = ap.parse_args()
    variants = [parse_variant(v) for v in args.variants]

    import cupy as cp
    import ml_dtypes

    import lowprec_moe as lpm
    from lowprec_moe.backends.cupy.gemm import launch as C
    from lowprec_moe.gemm import _validate, grouped_gemm

    B._HOLD = None if args.no_hold else B._gpu_hold(cp)
    rng = np.random.default_rng(0)
    names = [n for n, _ in variants]
    print("case                      " + " ".join(f"{n:>14s}" for n in names) +
          "   (ms, ratio to the first; torch bf16 ratio = torch ms / ours)")
    for shape in args.shapes:
        spec = B.SHAPES[shape]
        splits = B.make_splits(spec, rng)
        e, t, n, k = len(splits), sum(splits), spec["n"], spec["k"]
        x = cp.random.standard_normal((t, k), dtype=cp.float32).astype(ml_dtypes.bfloat16)
        dy = cp.random.standard_normal((t, n), dtype=cp.float32).astype(ml_dtypes.bfloat16)
        w = (cp.random.standard_normal((e, n, k), dtype=cp.float32) * 0.05).astype(
            ml_dtypes.bfloat16)
        for mode in args.modes:
            tfn, _ = B.torch_setup(mode, splits, n, k)
            for fmt in args.formats:
                if fmt == "nvfp4-rs" and mode == "dgrad":
                    continue
                a, b = B.operands(lpm, mode, fmt, x, w, dy, splits)
                out_shape = (t, n) if mode == "fprop" else (t, k) if mode == "dgrad" \
                    else (e, n, k)
                out = cp.empty(out_shape, dtype=ml_dtypes.bfloat16)
                fn = lambda: grouped_gemm(a, b, splits, mode=mode, out=out)  # noqa: E731
                timer = B._cupy_timer(cp, fn)
                reps = [_with_options(env, lambda: B._calibrate(*timer, args.warmup))
                        for _, env in variants]
                kinds = []
                for _, env in variants:
                    p = _validate(mode, a, b, splits, bias=None, probs=None, out_dtype=None,
                                  out=out, accumulate=False)
                    kinds.append(_with_options(env, lambda: C.kernel_info(p)["kernel"]))
                tt = B._torch_timer(tfn) if tfn else None
                t_reps = B._calibrate(*tt, args.warmup) if tfn else 0
                ms = [[] for _ in variants]
                torch_ms = []
                for _ in range(args.rounds):
                    if tfn:
                        torch_ms.append(B._burst(tt[0], tt[2], tfn, t_reps)[0])
                    for i, (_, env) in enumerate(variants):
                        ms[i].append(_with_options(env, lambda: B._burst(
                            timer[0], timer[2], fn, reps[i])[0]))
                med = [statistics.median(m) for m in ms]
                rel = [statistics.median(m[r] / ms[0][r] for r in range(args.rounds))
                       for m in ms]
                cells = " ".join(f"{med[i]:7.3f} {rel[i]:5.3f}" for i in range(len(variants)))
                line = f"{shape:9s} {mode:5s} {fmt:8s} {cells}"
                if tfn:
                    tr = [statistics.median(torch_ms[r] / ms[i][r] for r in range(args.rounds))
                          for i in range(len(variants))]
                    line += "  torch " + " ".join(f"{v:.2f}" for v in tr)
                print(line + "  [" + " ".join(sorted(set(kinds))) + "]", flush=True)


if __name__ == "__main__":
    main()
