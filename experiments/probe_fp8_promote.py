"""Can MXFP8 multiply on E4M3 wgmma with the block scales applied per 32-deep step?

Usage::

    python experiments/probe_fp8_promote.py [--iters 4096]

Hopper's E4M3 ``wgmma`` runs at twice the bf16 rate and reads raw fp8 bytes from shared memory,
so an MXFP8 GEMM could skip expanding its operands: one ``m64nNk32`` per 32-element scale block
into fresh fp32 registers P, then ``acc += P * (2^ea[m] * 2^eb[n])`` on the CUDA cores
("promotion", as DeepGEMM does per 128). Two questions decide whether that is worth a kernel:

1. **Precision.** Is the fp32 sum of one step's 32 products exact enough for the GEMM contract
   (relative error <= 1e-5 against float64)? DeepSeek-V3 reports that FP8 accumulation on
   Hopper keeps only ~14 bits. Part 1 runs single ``m64n8k32`` E4M3 wgmma (B = 1.0 everywhere,
   so each output is a row sum of A) on crafted and random rows, fresh (scale-d = 0) and
   accumulating into a preloaded C, and compares with the float64 sums.
2. **Throughput.** Part 2 times a 128 x 128 tile loop per CTA (two consumer warpgroups, operands
   resident in shared memory, one CTA per SM): E4M3 wgmma accumulating in place (the ceiling),
   E4M3 with per-step promotion (two fp32 ops per accumulator and step, scales read from shared
   memory, P double-buffered so the next step's wgmma overlaps the promotion), and bf16 wgmma in
   place (the rate of the current kernels' MMAs and of cuBLAS).
"""

from __future__ import annotations

import argparse

import numpy as np

from _wgmma_probe import PRELUDE

SOURCE = PRELUDE + r"""
// the no-swizzle K-major layout of desc(): byte (row, k) of a tile
__device__ __forceinline__ int canon(int row, int k, int sbo) {
    return (row >> 3) * sbo + (k >> 4) * 128 + (row & 7) * 16 + (k & 15);
}

// Part 1: one warpgroup, A = 64 x 32 E4M3 codes, B = 8 x 32 of b_code; out[r] = D[r, 0].
extern "C" __global__ void acc_probe(const unsigned char* __restrict__ a, unsigned char b_code,
                                     const float* __restrict__ c_init, int accumulate,
                                     float* __restrict__ out) {
    __shared__ __align__(128) unsigned char sa[64 * 32];
    __shared__ __align__(128) unsigned char sb[8 * 32];
    const int t = threadIdx.x;
    for (int i = t; i < 64 * 32; i += 128) sa[canon(i / 32, i % 32, 256)] = a[i];
    for (int i = t; i < 8 * 32; i += 128) sb[i] = b_code;
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    const int w = t / 32, lane = t % 32;
    const int r0 = w * 16 + lane / 4;
    float d0 = c_init[r0], d1 = c_init[r0], d2 = c_init[r0 + 8], d3 = c_init[r0 + 8];
    const unsigned long long da = desc((unsigned)__cvta_generic_to_shared(sa), 256);
    const unsigned long long db = desc((unsigned)__cvta_generic_to_shared(sb), 256);
    fence();
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, %4, %5, p, 1, 1;\n}\n"
        : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
        : "l"(da), "l"(db), "r"(accumulate));
    commit();
    wait<0>();
    if ((lane & 3) == 0) { out[r0] = d0; out[r0 + 8] = d2; }
}

// acc[i] += p[i] * (sa[row] * sb[col]) for the m64n128 accumulator layout.
__device__ __forceinline__ void promote(float (&acc)[64], const float (&p)[64],
                                        const float* sa, const float* sb, int lane) {
    const float a0 = sa[lane / 4], a1 = sa[lane / 4 + 8];
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        const float2 b = *reinterpret_cast<const float2*>(sb + 8 * j + (lane & 3) * 2);
        acc[4 * j + 0] = fmaf(p[4 * j + 0], a0 * b.x, acc[4 * j + 0]);
        acc[4 * j + 1] = fmaf(p[4 * j + 1], a0 * b.y, acc[4 * j + 1]);
        acc[4 * j + 2] = fmaf(p[4 * j + 2], a1 * b.x, acc[4 * j + 2]);
        acc[4 * j + 3] = fmaf(p[4 * j + 3], a1 * b.y, acc[4 * j + 3]);
    }
}

// Part 2: 256 threads (two warpgroups, 64 rows each) per 128 x 128 tile. MODE 0 = E4M3 in
// place, 1 = E4M3 + promotion after each step's wait (DeepGEMM's order: the other warpgroup's
// wgmma overlaps this one's promotion), 2 = E4M3 + promotion of the previous step while this
// step's wgmma runs (two P sets), 3 = bf16 in place (two k16 per step: the same flops).
template <int MODE>
__device__ __forceinline__ void loop_body(int iters, float* __restrict__ out) {
    extern __shared__ __align__(1024) unsigned char smem[];
    // A: 128 x 64 bytes (bf16 needs 64 bytes per row per step), B: 128 x 64, scales 4 x 256.
    unsigned char* sa = smem;
    unsigned char* sb = smem + 128 * 64;
    float* scales = reinterpret_cast<float*>(smem + 2 * 128 * 64);
    const int t = threadIdx.x, wg = t / 128, lane = t % 32, w = (t / 32) % 4;
    for (int i = t; i < 2 * 128 * 64; i += 256) smem[i] = (unsigned char)(0x30 + (i * 7) % 16);
    for (int i = t; i < 4 * 256; i += 256) scales[i] = ldexpf(1.0f, (i * 5) % 7 - 3);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    const unsigned abase = (unsigned)__cvta_generic_to_shared(sa) + wg * 64 * 64;
    const unsigned long long da = desc(abase, 512);
    const unsigned long long db = desc((unsigned)__cvta_generic_to_shared(sb), 512);
    float acc[64], p0[64], p1[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) { acc[i] = 0.f; p0[i] = 0.f; p1[i] = 0.f; }
    const float* rs = scales + wg * 64 + w * 16;   // this warp's 16 rows
    const float* cs = scales + 128;
    if (MODE == 0) {
        for (int it = 0; it < iters; ++it) { fence(); mma_fp8<1>(acc, da, db); commit(); wait<1>(); }
    } else if (MODE == 3) {
        for (int it = 0; it < iters; ++it) {
            fence(); mma_bf16<1>(acc, da, db); mma_bf16<1>(acc, da + 2, db + 2); commit(); wait<1>();
        }
    } else if (MODE == 1) {
        for (int it = 0; it < iters; ++it) {
            fence(); mma_fp8<0>(p0, da, db); commit(); wait<0>();
            promote(acc, p0, rs + 256 * (it & 3), cs + 256 * (it & 3), lane);
        }
    } else {
        fence(); mma_fp8<0>(p0, da, db); commit();
        for (int it = 0; it < iters; it += 2) {
            fence(); mma_fp8<0>(p1, da, db); commit();
            wait<1>();
            promote(acc, p0, rs + 256 * (it & 3), cs + 256 * (it & 3), lane);
            fence(); mma_fp8<0>(p0, da, db); commit();
            wait<1>();
            promote(acc, p1, rs + 256 * ((it + 1) & 3), cs + 256 * ((it + 1) & 3), lane);
        }
    }
    wait<0>();
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 64; ++i) s += acc[i] + p1[i];
    out[blockIdx.x * 256 + t] = s;
}
extern "C" __global__ void __launch_bounds__(256, 1) loop0(int iters, float* out) { loop_body<0>(iters, out); }
extern "C" __global__ void __launch_bounds__(256, 1) loop1(int iters, float* out) { loop_body<1>(iters, out); }
extern "C" __global__ void __launch_bounds__(256, 1) loop2(int iters, float* out) { loop_body<2>(iters, out); }
extern "C" __global__ void __launch_bounds__(256, 1) loop3(int iters, float* out) { loop_body<3>(iters, out); }
"""

_CRAFTED = 7
_SMEM = 2 * 128 * 64 + 4 * 256 * 4


def _e4m3_values() -> np.ndarray:
    import ml_dtypes

    codes = np.arange(256, dtype=np.uint8)
    vals = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    return vals


def part1(cp, mod) -> None:
    vals = _e4m3_values()
    finite = np.flatnonzero(np.isfinite(vals)).astype(np.uint8)
    code_of = {float(v): c for c, v in zip(range(256), vals) if np.isfinite(v)}
    rng = np.random.default_rng(0)
    rows = []
    names = []
    # crafted rows: one large product and many small ones, cancellations
    tiny, one = code_of[2.0 ** -9], code_of[1.0]
    for big in (448.0, 256.0, 16.0, 2.0, 1.0, 2.0 ** -6):
        rows.append([code_of[big]] + [tiny] * 31); names.append(f"{big:g} + 31 * 2^-9")
    rows.append([code_of[448.0], code_of[-448.0]] + [tiny] * 30)
    names.append("448 - 448 + 30 * 2^-9")
    while len(rows) < 32:
        rows.append(list(rng.choice(finite, 32))); names.append("random, all codes")
    while len(rows) < 64:
        # same exponent range as typical MX blocks: |x| in [2^-2, 448]
        pick = finite[(np.abs(vals[finite]) >= 0.25)]
        rows.append(list(rng.choice(pick, 32))); names.append("random, |x| >= 1/4")
    a = np.array(rows, dtype=np.uint8)
    exact = vals[a].sum(axis=1)
    out = cp.zeros(64, dtype=cp.float32)
    for accumulate, c0 in ((0, 0.0), (1, 0.0), (1, 1024.0), (1, 3.0e6)):
        c_init = cp.full(64, c0, dtype=cp.float32)
        mod.get_function("acc_probe")((1,), (128,), (cp.asarray(a), np.uint8(one), c_init,
                                                     np.int32(accumulate), out))
        got = cp.asnumpy(out).astype(np.float64)
        want = exact + c0
        f32 = want.astype(np.float32).astype(np.float64)   # one rounding of the exact sum
        err = np.abs(got - want)
        scale = np.maximum(np.abs(vals[a]).max(axis=1), abs(c0))
        print(f"part 1, scale-d={accumulate}, C={c0:g}: rows equal to round(exact sum): "
              f"{int(np.sum(got == f32))} / 64; max |err| / max|term| = "
              f"{np.max(err / scale):.3e}; max relative error = "
              f"{np.max(err / np.maximum(np.abs(want), 1e-30)):.3e}")
        for i in range(_CRAFTED):
            print(f"    {names[i]:30s} exact {want[i]!r:>24} got {got[i]!r}")
        rnd = slice(_CRAFTED, 64)
        print(f"    random rows: max relative error {np.max((err / np.abs(want))[rnd]):.3e}, "
              f"max |err| / max|term| {np.max((err / scale)[rnd]):.3e}")


def part2(cp, mod, iters: int) -> None:
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    out = cp.zeros(sms * 256, dtype=cp.float32)
    flops = 2.0 * 128 * 128 * 32 * iters * sms
    for name, mode in (("e4m3 in place", 0), ("e4m3 + promotion after wait", 1),
                       ("e4m3 + promotion, 2 P sets", 2), ("bf16 in place", 3)):
        fn = mod.get_function(f"loop{mode}")
        fn.max_dynamic_shared_size_bytes = _SMEM
        times = []
        for rep in range(7):
            s, e = cp.cuda.Event(), cp.cuda.Event()
            s.record()
            fn((sms,), (256,), (np.int32(iters), out), shared_mem=_SMEM)
            e.record()
            e.synchronize()
            times.append(cp.cuda.get_elapsed_time(s, e))
        ms = float(np.median(times[2:]))
        print(f"part 2, {name:28s}: {ms:8.3f} ms  {flops / ms / 1e9:7.1f} TFLOP/s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=4096)
    args = ap.parse_args()
    import cupy as cp

    mod = cp.RawModule(code=SOURCE, options=("-std=c++17", "-arch=sm_90a"),
                       name_expressions=None)
    part1(cp, mod)
    part2(cp, mod, args.iters)


if __name__ == "__main__":
    main()
