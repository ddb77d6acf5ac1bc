"""Do fp16 and bf16 tensor-core GEMMs give the same bits on values exact in both formats?

Usage::

    python experiments/probe_f16_bf16_mma.py [--k 2048] [--spread 4] [--seeds 3]

The question behind a cheaper MXFP8 path (the former benchmarks/RESULTS.md, in git history, ninth session): fp8 * 2^s
is exact in fp16 when the block-scale exponents of a row stay inside a window, so MXFP8 could
multiply on fp16 wgmma with the exact power-of-two offsets applied in the epilogue, instead of
widening every element to fp32 for its bf16 form. That keeps the library's bitwise guarantees
only if (1) fp16 and bf16 MMAs accumulate identical products into identical fp32 bits, and (2)
scaling A's rows and B's columns by powers of two scales the fp32 result exactly.

The probe builds operands whose elements are 4-bit integers times a power of two per 32-block
(2^-spread .. 2^spread; exact in fp16 and in bf16), runs the same grouped fprop with bf16
operands, with fp16 operands, and with fp16 operands whose rows / columns were scaled by
2^-a_row / 2^-b_col (rescaled afterwards in float64, exact), and counts mismatching fp32 outputs.
The kernels are the library's own (``grouped_gemm``, default family); needs CuPy and a GPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _operand(rng, shape, spread):
    """4-bit integers times 2^e, e uniform in [-spread, spread] per 32-element block."""
    ints = rng.integers(-15, 16, size=shape).astype(np.float64)
    blocks = shape[:-1] + (shape[-1] // 32, 1)
    e = rng.integers(-spread, spread + 1, size=blocks)
    return (ints.reshape(blocks[:-1] + (32,)) * np.exp2(e)).reshape(shape)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--spread", type=int, default=4)
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    if args.k % 32:
        raise SystemExit(f"--k={args.k} must be a multiple of 32")

    import cupy as cp
    import ml_dtypes

    from lowprec_moe.backends.cupy.gemm.launch import kernel_info
    from lowprec_moe.gemm import _validate, grouped_gemm

    splits, n, k = [384, 0, 200, 440], 512, args.k
    m, g = sum(splits), len(splits)
    for seed in range(args.seeds):
        rng = np.random.default_rng(seed)
        x = _operand(rng, (m, k), args.spread)
        w = _operand(rng, (g, n, k), args.spread)
        a_row = rng.integers(0, 6, size=(m, 1))     # power-of-two offsets per row of x
        b_col = rng.integers(0, 6, size=(g, n, 1))  # and per row of W (output column)

        def run(xa, wa):
            xa, wa = cp.asarray(xa), cp.asarray(wa)
            p = _validate("fprop", xa, wa, splits, bias=None, probs=None, out_dtype="float32",
                          out=None, accumulate=False)
            out = grouped_gemm(xa, wa, splits, mode="fprop", out_dtype="float32")
            return cp.asnumpy(out), kernel_info(p)["kernel"]

        bf, kb = run(x.astype(ml_dtypes.bfloat16), w.astype(ml_dtypes.bfloat16))
        hf, kh = run(x.astype(np.float16), w.astype(np.float16))
        xs = (x * np.exp2(-a_row)).astype(np.float16)
        ws = (w * np.exp2(-b_col)).astype(np.float16)
        sc, _ = run(xs, ws)
        # undo the offsets: row r of the output by 2^a_row[r], column c of expert e by 2^b_col
        col = np.concatenate([np.broadcast_to(b_col[e].T, (s, n)) for e, s in enumerate(splits)])
        sc = (sc.astype(np.float64) * np.exp2(a_row + col)).astype(np.float32)
        assert np.array_equal(x.astype(np.float16).astype(np.float64), x), "x not exact in fp16"
        assert np.array_equal(xs.astype(np.float64) * np.exp2(a_row), x), "scaled x not exact"
        mis_h = int(np.sum(bf.view(np.uint32) != hf.view(np.uint32)))
        mis_s = int(np.sum(bf.view(np.uint32) != sc.view(np.uint32)))
        print(f"seed {seed}: k={k} spread={args.spread} ({kb} / {kh}): fp16 vs bf16 "
              f"{mis_h} of {bf.size} outputs differ; fp16 with row / column offsets vs bf16 "
              f"{mis_s} differ")


if __name__ == "__main__":
    main()
