"""One grouped-GEMM call per format on one shape (target for ``ncu``; see the former benchmarks/RESULTS.md, in git history).

Usage: ``python experiments/ncu_gemm_target.py [shape] [mode] [format ...]`` (defaults: qwen-fc2
fprop bf16 mxfp8 nvfp4). Quantization runs first, so profile with a kernel-name filter
(``--kernel-name regex:lpm_gg``).
"""
import sys
from pathlib import Path

import cupy as cp
import ml_dtypes
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import lowprec_moe as lpm  # noqa: E402
from bench_gemm import SHAPES, make_splits, operands  # noqa: E402
from lowprec_moe.gemm import grouped_gemm  # noqa: E402

shape = sys.argv[1] if len(sys.argv) > 1 else "qwen-fc2"
mode = sys.argv[2] if len(sys.argv) > 2 else "fprop"
formats = sys.argv[3:] or ["bf16", "mxfp8", "nvfp4"]
spec = SHAPES[shape]
rng = np.random.default_rng(0)
splits = make_splits(spec, rng)
t, k, n, e = sum(splits), spec["k"], spec["n"], spec["experts"]
g = cp.random.default_rng(0)
bf = ml_dtypes.bfloat16
x = g.standard_normal((t, k), dtype=cp.float32).astype(bf)
w = g.standard_normal((e, n, k), dtype=cp.float32).astype(bf)
dy = g.standard_normal((t, n), dtype=cp.float32).astype(bf)
for fmt in formats:
    a, b = operands(lpm, mode, fmt, x, w, dy, splits)
    shape_out = (e, n, k) if mode == "wgrad" else (t, n if mode == "fprop" else k)
    out = cp.empty(shape_out, dtype=bf)
    cp.cuda.Device().synchronize()
    grouped_gemm(a, b, splits, mode=mode, out=out)
    cp.cuda.Device().synchronize()
    print(fmt, "done")
