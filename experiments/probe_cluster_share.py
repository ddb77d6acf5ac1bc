"""What does sharing an expanded B tile between two CTAs of a cluster cost per k-tile?

Usage::

    python experiments/probe_cluster_share.py [--iters 2048]

The quantized wgmma kernels expand every k-tile of B (256 columns x 64 deep, 32 KiB of bf16 /
fp16) into a canonical shared-memory buffer, and that expansion is 18-22 % of the NVFP4 k-tile
and about a third of the MXFP8 one (the former benchmarks/RESULTS.md, in git history, fourteenth and fifteenth sessions).
Two CTAs on adjacent row tiles of one expert read the same B tile; in a cluster of two each could
expand half of it and store that half into both CTAs' buffers (distributed shared memory), which
halves the decode arithmetic. What it adds is the remote stores and a cluster-wide handshake per
k-tile. This probe times the k-loop skeleton of a 128 x 256 tile (two warpgroups, 4 x two
m64n128k16 bf16 wgmma per k-tile on resident A, two B buffers, one CTA per SM) with:

* ``none``:    no B stores; CTA barrier per k-tile (the MMA + barrier floor);
* ``local``:   all 32 KiB of the next B buffer stored by the CTA itself; CTA barrier (today);
* ``cluster``: 16 KiB stored locally and the same 16 KiB into the partner's buffer (the partner
  stores the other half into both); cluster barrier (arrive.release / wait.acquire) per k-tile.

The stores carry no decode arithmetic, so ``cluster - local`` is the price of sharing, to set
against half of the decode instructions. Cycles per k-tile from CUDA events (median of 5).
"""

from __future__ import annotations

import argparse

import numpy as np

from _wgmma_probe import PRELUDE

SOURCE = PRELUDE + r"""
// Shared memory: A 16 KiB (two warpgroups x 4 k16 steps x 2 KiB), B buffers 2 x 32 KiB
// (4 k16 steps x 8 KiB: 256 rows in 32 groups of 256 bytes).
template <int MODE>
__device__ __forceinline__ void body(int iters, float* __restrict__ out, long long* cyc) {
    extern __shared__ __align__(1024) unsigned char smem[];
    const unsigned s0 = (unsigned)__cvta_generic_to_shared(smem);
    const int t = threadIdx.x, wg = t / 128;
    for (int i = t; i < (16 + 64) * 1024 / 16; i += 256)
        reinterpret_cast<uint4*>(smem)[i] = make_uint4(0x3F803F80u, 0, 0x3F803F80u, 0);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    unsigned rank = 0, peer_base = 0;
    if (MODE == 2) {
        asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n"
                     : "=r"(peer_base) : "r"(s0), "r"(rank ^ 1u));
        asm volatile("barrier.cluster.arrive.release.aligned;\n"
                     "barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
    } else {
        __syncthreads();
    }
    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) acc[i] = 0.f;
    const unsigned a0 = s0 + wg * 8192, b0 = s0 + 16384;
    const uint4 v = make_uint4(0x3F803F80u ^ t, 0x3F80u, 0x3F800000u, 0x3F803F80u);
    const long long c0 = clock64();
    for (int kt = 0; kt < iters; ++kt) {
        if (MODE == 2) {
            asm volatile("barrier.cluster.arrive.release.aligned;\n"
                         "barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
        } else {
            __syncthreads();
        }
        const unsigned bb = b0 + (kt & 1) * 32768;
        fence();
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
            mma_bf16<1>(acc, desc(a0 + ks * 2048, 256), desc(bb + ks * 8192, 256));
            mma_bf16<1>(acc + 64, desc(a0 + ks * 2048, 256), desc(bb + ks * 8192 + 4096, 256));
        }
        commit();
        // the next buffer: 32 KiB = 2048 x 16 bytes; thread t owns 8 (local) or 4 (+4 remote)
        const unsigned nb = b0 + ((kt + 1) & 1) * 32768;
        if (MODE == 1) {
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const unsigned a = nb + (j * 256 + t) * 16;
                asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n"
                             :: "r"(a), "r"(v.x + kt), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
            }
        } else if (MODE == 2) {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const unsigned off = ((kt + 1) & 1) * 32768 + 16384 +
                                     ((rank * 4 + j) * 256 + t) * 16;
                asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n"
                             :: "r"(s0 + off), "r"(v.x + kt), "r"(v.y), "r"(v.z), "r"(v.w)
                             : "memory");
                asm volatile("st.shared::cluster.v4.u32 [%0], {%1, %2, %3, %4};\n"
                             :: "r"(peer_base + off), "r"(v.x + kt), "r"(v.y), "r"(v.z),
                                "r"(v.w) : "memory");
            }
        }
        if (MODE == 2) {
            asm volatile("fence.proxy.async.shared::cluster;\n" ::: "memory");
        } else {
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        }
        wait<0>();
    }
    if (MODE == 2) {
        asm volatile("barrier.cluster.arrive.release.aligned;\n"
                     "barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
    }
    const long long c1 = clock64();
    if (t == 0) cyc[blockIdx.x] = c1 - c0;
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 128; ++i) s += acc[i];
    out[blockIdx.x * 256 + t] = s;
}
extern "C" __global__ void __launch_bounds__(256, 1) k_none(int n, float* o, long long* c) { body<0>(n, o, c); }
extern "C" __global__ void __launch_bounds__(256, 1) k_local(int n, float* o, long long* c) { body<1>(n, o, c); }
extern "C" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(256, 1)
k_cluster(int n, float* o, long long* c) { body<2>(n, o, c); }
"""

_SMEM = (16 + 64) * 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=2048)
    args = ap.parse_args()
    import cupy as cp

    mod = cp.RawModule(code=SOURCE, options=("-std=c++17", "-arch=sm_90a"))
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    grid = sms - sms % 2
    out = cp.zeros(grid * 256, dtype=cp.float32)
    cyc = cp.zeros(grid, dtype=cp.int64)
    base = None
    for name in ("none", "local", "cluster"):
        fn = mod.get_function(f"k_{name}")
        fn.max_dynamic_shared_size_bytes = _SMEM
        per = []
        for _ in range(5):
            fn((grid,), (256,), (np.int32(args.iters), out, cyc), shared_mem=_SMEM)
            cp.cuda.runtime.deviceSynchronize()
            per.append(float(np.median(cp.asnumpy(cyc))) / args.iters)
        c = float(np.median(per[1:]))
        base = base or c
        # 128 x 256 x 64 per k-tile; the SM's bf16 wgmma rate is ~4096 flop per cycle
        print(f"{name:8s}: {c:7.0f} cycles per k-tile, median over CTAs ({c / base:.3f} of none; "
              f"MMA alone ~{2 * 128 * 256 * 64 / 4096:.0f})")


if __name__ == "__main__":
    main()
