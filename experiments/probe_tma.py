"""Does a TMA tile load through a tensor map passed by value land the right bytes?

Usage::

    python experiments/probe_tma.py

Encodes a tiled map of a 300 x 96-byte array (box 128 rows x 32 bytes) with
``lowprec_moe.backends.cupy.tensor_map``, passes it to a kernel as a ``__grid_constant__`` parameter and loads
the boxes at several coordinates, including ones that run past the last row and the last
column (zero fill). Prints OK or the first mismatch; exits 1 on a mismatch.
"""

from __future__ import annotations

import sys
from pathlib import Path

import cupy as cp
import numpy as np

from lowprec_moe.backends.cupy import tma

SOURCE = r"""
#include "grouped_gemm_tma.cuh"
extern "C" __global__ void probe(const __grid_constant__ lpm_gg::TmaMap map, int c0, int c1,
                                 unsigned char* out) {
    __shared__ __align__(128) unsigned char tile[128 * 32];
    __shared__ __align__(8) unsigned long long bar;
    const unsigned b = static_cast<unsigned>(__cvta_generic_to_shared(&bar));
    if (threadIdx.x == 0) {
        lpm_gg::mbar_init(b, 1);
        lpm_gg::mbar_init_fence();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        lpm_gg::mbar_arrive_expect_tx(b, 128 * 32);
        lpm_gg::tma_load_2d(static_cast<unsigned>(__cvta_generic_to_shared(tile)), &map, b, c0,
                            c1);
    }
    lpm_gg::mbar_wait(b, 0);
    for (int i = threadIdx.x; i < 128 * 32; i += blockDim.x) out[i] = tile[i];
}
"""


def main() -> int:
    kdir = Path(__file__).resolve().parents[1] / "raw_kernels"
    mod = cp.RawModule(code=SOURCE, options=("-std=c++17", f"-I{kdir}", "-arch=sm_90a"))
    fn = mod.get_function("probe")
    rows, inner = 300, 96
    host = np.random.default_rng(0).integers(1, 256, size=(rows, inner), dtype=np.uint8)
    dev = cp.asarray(host)
    m = tma.map_2d_u8(int(dev.data.ptr), inner, rows, inner, 32, 128)
    out = cp.zeros(128 * 32, dtype=cp.uint8)
    bad = 0
    for c0, c1 in ((0, 0), (32, 64), (64, 200), (80, 250)):
        fn((1,), (128,), (m, np.int32(c0), np.int32(c1), out))
        got = cp.asnumpy(out).reshape(128, 32)
        want = np.zeros((128, 32), np.uint8)
        r1, k1 = min(rows, c1 + 128), min(inner, c0 + 32)
        want[: r1 - c1, : k1 - c0] = host[c1:r1, c0:k1]
        if not np.array_equal(got, want):
            idx = np.argwhere(got != want)[0]
            print(f"MISMATCH at box ({c0}, {c1}) element {tuple(idx)}: "
                  f"{got[tuple(idx)]} != {want[tuple(idx)]}")
            bad += 1
    print("OK" if not bad else f"{bad} boxes wrong")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
