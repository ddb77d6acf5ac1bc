"""Does ``fence.proxy.async`` (SASS: MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC.S) wait for cp.async copies?

Usage::

    python experiments/probe_fence.py [--iters 2000]

The wgmma k-loops issue the cp.async copies of a later k-tile and then, after expanding the
next tile into shared memory, run ``fence.proxy.async`` before the MMA reads it. If the fence
waited for the thread's copies in flight, every k-tile would pay a DRAM latency. Each thread
here issues one 16-byte cp.async per iteration from a 1 GiB buffer (L2 misses), keeps six
groups in flight, stores to shared memory and then runs nothing, the proxy fence or
``membar.cta``; clock64 cycles per iteration, median over 132 CTAs of 256 threads.
Measured on the H200 (the former benchmarks/RESULTS.md, in git history, 2026-12-01): 259-268 / 258-260 / 276 cycles --
the fence does not wait for the copies.
"""

from __future__ import annotations

import argparse

import cupy as cp
import numpy as np

SOURCE = r"""
extern "C" __global__ void probe(const int4* __restrict__ g, long long n16, int iters, int mode,
                                 long long* out) {
    __shared__ __align__(16) int4 ring[8][256];
    __shared__ int sink[256];
    const int t = threadIdx.x;
    const long long idx = (long long)blockIdx.x * 256 + t;
    const long long t0 = clock64();
    for (int i = 0; i < iters; ++i) {
        const unsigned dst = (unsigned)__cvta_generic_to_shared(&ring[i & 7][t]);
        const int4* src = g + ((idx + (long long)i * gridDim.x * 256 * 7) % n16);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
        asm volatile("cp.async.commit_group;\n" ::: "memory");
        sink[t] = i;
        if (mode == 1) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        if (mode == 2) asm volatile("membar.cta;\n" ::: "memory");
        asm volatile("cp.async.wait_group 6;\n" ::: "memory");
    }
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    const long long t1 = clock64();
    if (t == 0) out[blockIdx.x] = t1 - t0;
}
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=2000)
    args = ap.parse_args()
    kernel = cp.RawModule(code=SOURCE, options=("-arch=sm_90a",)).get_function("probe")
    num_ctas = cp.cuda.Device().attributes["MultiProcessorCount"]
    n16 = (1 << 30) // 16
    g = cp.zeros(n16 * 4, dtype=cp.int32)
    out = cp.zeros(num_ctas, dtype=cp.int64)
    for rep in range(2):
        for mode, name in ((0, "no fence"), (1, "fence.proxy.async"), (2, "membar.cta")):
            kernel((num_ctas,), (256,),
                   (g, np.int64(n16), np.int32(args.iters), np.int32(mode), out))
            cp.cuda.Device().synchronize()
            print(f"{name:20s} cycles / iteration {float(cp.median(out)) / args.iters:8.1f}")


if __name__ == "__main__":
    main()
