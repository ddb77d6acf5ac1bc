"""Diagnostic: the warp-specialised MXFP8 wgrad build against the plain kernel on one expert
(short contractions, fewer output rows than a tile), printing the first mismatches (GPU only)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from test_gemm import _data, _quantize  # noqa: E402
from test_gpu_gemm import gpu  # noqa: E402

from lowprec_moe.gemm import _validate, grouped_gemm  # noqa: E402
from lowprec_moe.cuda import gemm as C  # noqa: E402
import cupy as cp  # noqa: E402


def run(fmt, tokens, m, n, seed=6):
    x, _, dy = _data(seed, tokens, m, n)
    w = np.zeros((1, m, n), np.float32)
    xq, _, dq = _quantize(fmt, x, w, dy, [tokens])
    ga, gb = gpu(dq), gpu(xq)
    out = {}
    for mode in ("all", "off"):
        os.environ[C.MXFP8_WS_ENV] = mode
        p = _validate("wgrad", ga, gb, [tokens], bias=None, probs=None, out_dtype="float32",
                      out=None, accumulate=False)
        name = C.kernel_info(p)["kernel"]
        out[mode] = (name, cp.asnumpy(grouped_gemm(ga, gb, [tokens], mode="wgrad",
                                                    out_dtype="float32")))
    a, b = out["all"][1], out["off"][1]
    bad = np.argwhere(a.view(np.uint32) != b.view(np.uint32))
    print(f"{fmt:13s} tokens={tokens:5d} m={m:4d} n={n:4d} {out['all'][0]} vs {out['off'][0]}: "
          f"{len(bad)} of {a.size} differ", end="")
    if len(bad):
        i = tuple(bad[0])
        rows = sorted(set(int(r) for r in bad[:, 1]))
        cols = sorted(set(int(c) for c in bad[:, 2]))
        print(f"; first {i}: {a[i]!r} vs {b[i]!r}; rows {rows[:12]}.. ({len(rows)}), "
              f"cols {cols[:12]}.. ({len(cols)})", end="")
    print()


if __name__ == "__main__":
    for fmt in ("mxfp8-hybrid", "mxfp8-e4m3"):
        for tokens, m, n in ((37, 96, 160), (300, 96, 160), (64, 128, 256), (320, 128, 256),
                             (512, 96, 160), (512, 128, 256), (37, 320, 384)):
            run(fmt, tokens, m, n)
