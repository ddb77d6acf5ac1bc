"""Throughput of the instructions the GEMM expansion is made of (a probe, not a library kernel).

Usage::

    python experiments/probe_convert.py [--iters 4096]

For each instruction, a kernel runs 8 independent dependency chains per thread over enough
CTAs to fill the GPU, and the run reports lane operations per SM per ns (32 per warp
instruction). The ratios between rows are what matter (measured in the same run, so the clock
cancels out): the grouped GEMM's NVFP4 / MXFP8 expansion issues one
``cvt.rn.f16x2.e4m3x2`` (SASS F2FP) per element pair, and MXFP8 two ``cvt.f32.f16`` more;
the former benchmarks/RESULTS.md, in git history (warp-specialised kernel) suspects the conversion pipe to be the limit.
CUDA events, warm-up, median of 5 (bench_gemm's timer).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

# One step of a chain on the 32-bit register %0 (PTX; %1: the constant 0x3C003C01, f16x2
# (1, 1 + 2^-10)), per probed instruction.
OPS = {
    "cvt.rn.f16x2.e4m3x2 (F2FP)":
        "{ .reg .b16 l, h; mov.b32 {l, h}, %0; cvt.rn.f16x2.e4m3x2 %0, l; }",
    "cvt.f32.f16 (widen)":
        "{ .reg .b16 l, h; .reg .f32 f; mov.b32 {l, h}, %0; cvt.f32.f16 f, l; "
        "mov.b32 %0, f; }",
    "mul.rn.f16x2 (HMUL2)": "mul.rn.f16x2 %0, %0, %1;",
    "mul.rn.f32 (FMUL)": "{ .reg .f32 f; mov.b32 f, %0; mul.rn.f32 f, f, 0f3F800001; "
                         "mov.b32 %0, f; }",
    "lop3 (LOP3)": "lop3.b32 %0, %0, 0x1C1C1C1C, 0x80808080, 0x6A;",
    "prmt (PRMT)": "prmt.b32 %0, %0, 0x12345678, 0x5140;",
}

SRC = r"""
extern "C" __global__ void probe(unsigned* out, int iters) {
    const unsigned k = 0x3C003C01u;
    unsigned x[8];
#pragma unroll
    for (int c = 0; c < 8; ++c) x[c] = threadIdx.x * 2654435761u + c * 40503u + 0x3800u;
    for (int i = 0; i < iters; ++i) {
#pragma unroll
        for (int j = 0; j < 16; ++j) {
#pragma unroll
            for (int c = 0; c < 8; ++c) asm volatile("OP" : "+r"(x[c]) : "r"(k));
        }
    }
    unsigned acc = 0u;
#pragma unroll
    for (int c = 0; c < 8; ++c) acc ^= x[c];
    out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=4096)
    args = ap.parse_args()
    import cupy as cp
    from bench_gemm import _median_ms

    dev = cp.cuda.Device()
    sms = dev.attributes["MultiProcessorCount"]
    threads, blocks = 256, sms * 8
    out = cp.empty(blocks * threads, dtype=cp.uint32)
    print(f"{sms} SMs, {blocks} CTAs x {threads} threads, {args.iters} x 16 x 8 steps per thread")
    print(f"{'instruction':32s} {'ms':>9s} {'lane-ops / SM / ns':>20s}")
    for name, op in OPS.items():
        src = SRC.replace("OP", op)
        fn = cp.RawModule(code=src, options=("-std=c++17",)).get_function("probe")
        ms = _median_ms(cp, lambda: fn((blocks,), (threads,), (out, cp.int32(args.iters))),
                        1, 5)
        lane_ops = blocks * threads * args.iters * 16 * 8
        print(f"{name:32s} {ms:9.3f} {lane_ops / (ms * 1e6) / sms:20.1f}")


if __name__ == "__main__":
    main()
