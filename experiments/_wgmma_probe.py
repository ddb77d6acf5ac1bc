"""CUDA prelude shared by the wgmma probes (probe_fp8_promote.py, probe_cluster_share.py).

``PRELUDE`` defines, for sources compiled with ``-arch=sm_90a``:

* ``desc(addr, sbo)``: a shared-memory matrix descriptor for the no-swizzle K-major layout
  (core matrix (row / 8, 16-byte column) at (row / 8) * sbo + column * 128);
* ``mma_fp8<SCALE_D>(p, da, db)`` (``m64n128k32`` E4M3) and ``mma_bf16<SCALE_D>(p, da, db)``
  (``m64n128k16`` bf16): D (64 x 128 fp32, the 64 registers ``p``) = A * B (+ D when SCALE_D);
* ``fence()``, ``commit()``, ``wait<N>()``: the wgmma fence, commit and wait.
"""

PRELUDE = r"""
__device__ __forceinline__ unsigned long long desc(unsigned addr, unsigned sbo) {
    unsigned long long d = (unsigned long long)((addr & 0x3FFFF) >> 4);
    d |= (unsigned long long)(128 >> 4) << 16;   // leading byte offset (K direction)
    d |= (unsigned long long)(sbo >> 4) << 32;   // stride byte offset (8-row groups)
    return d;
}
#define R8(i) "+f"(p[i]), "+f"(p[i + 1]), "+f"(p[i + 2]), "+f"(p[i + 3]), \
              "+f"(p[i + 4]), "+f"(p[i + 5]), "+f"(p[i + 6]), "+f"(p[i + 7])
#define D64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
            "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
            "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
            "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
// NAME<SCALE_D>(p, da, db): one wgmma SHAPE_TYPES on shared-memory descriptors; IMMS: the
// immediates after scale-d (operand scales, and transposes for 16-bit types).
#define PROBE_WGMMA_N128(NAME, SHAPE_TYPES, IMMS)                                              \
    template <int SCALE_D>                                                                     \
    __device__ __forceinline__ void NAME(float* p, unsigned long long da,                      \
                                         unsigned long long db) {                              \
        asm volatile("{\n.reg .pred q;\nsetp.ne.b32 q, %66, 0;\n"                              \
                     "wgmma.mma_async.sync.aligned." SHAPE_TYPES " " D64                       \
                     ", %64, %65, q, " IMMS ";\n}\n"                                           \
                     : R8(0), R8(8), R8(16), R8(24), R8(32), R8(40), R8(48), R8(56)            \
                     : "l"(da), "l"(db), "n"(SCALE_D));                                        \
    }
PROBE_WGMMA_N128(mma_fp8, "m64n128k32.f32.e4m3.e4m3", "1, 1")
PROBE_WGMMA_N128(mma_bf16, "m64n128k16.f32.bf16.bf16", "1, 1, 0, 0")
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
"""
