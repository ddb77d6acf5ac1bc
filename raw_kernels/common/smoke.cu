// Smoke kernels: exercise lpm_formats.cuh so the compile check and the GPU tests of the
// non-flushing helpers have something to run.
#include "lpm_formats.cuh"

// For each i < n: out[8*i + 0..7] = a*b, a+b, a-b, a/b, 1/a, fmax(a,b), fmin(a,b), |a|,
// all IEEE fp32 with subnormals (no flush to zero).
extern "C" __global__ void lpm_smoke_fp32_ops(const float* __restrict__ a,
                                              const float* __restrict__ b,
                                              float* __restrict__ out, long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float x = a[i];
    const float y = b[i];
    float* o = out + 8 * i;
    o[0] = lpm_mul_rn(x, y);
    o[1] = lpm_add_rn(x, y);
    o[2] = lpm_sub_rn(x, y);
    o[3] = lpm_div_rn(x, y);
    o[4] = lpm_rcp_rn(x);
    o[5] = lpm_fmax(x, y);
    o[6] = lpm_fmin(x, y);
    o[7] = lpm_fabs_bits(x);
}

// For each code i < 256: e2m1[i] = value of E2M1 code (i & 15), e8m0[i] = 2^(i - 127).
extern "C" __global__ void lpm_smoke_decode(float* __restrict__ e2m1, float* __restrict__ e8m0) {
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= 256u) return;
    e2m1[i] = lpm_e2m1_to_f32(i);
    e8m0[i] = lpm_e8m0_to_f32(i);
}

// For each i < n: out[4*i + 0..3] = Philox4x32-10(counter = ck[6*i + 0..3], key = ck[6*i + 4..5]).
extern "C" __global__ void lpm_smoke_philox(const unsigned int* __restrict__ ck,
                                            unsigned int* __restrict__ out, long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const unsigned int* c = ck + 6 * i;
    const lpm_uint4 r = lpm_philox4x32_10(c[0], c[1], c[2], c[3], c[4], c[5]);
    out[4 * i + 0] = r.x;
    out[4 * i + 1] = r.y;
    out[4 * i + 2] = r.z;
    out[4 * i + 3] = r.w;
}

// The hardware fp32 -> bf16 conversions against the integer round-to-nearest-even of
// lpm_f32_to_bf16_bits_rn, over the fp32 bit patterns base .. base + n - 1 (NaNs skipped):
// counts[0] / counts[1] = mismatches of cvt.rn.bf16.f32 / cvt.rn.bf16x2.f32 (both halves),
// first[0] / first[1] = the smallest mismatching pattern of each (0xFFFFFFFF if none).
extern "C" __global__ void lpm_smoke_bf16_conversions(unsigned int base, unsigned long long n,
                                                      unsigned long long* __restrict__ counts,
                                                      unsigned int* __restrict__ first) {
    unsigned long long bad1 = 0, bad2 = 0;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        const unsigned int bits = base + (unsigned int)i;
        if ((bits & 0x7FFFFFFFu) > 0x7F800000u) continue;
        const float x = __uint_as_float(bits);
        const unsigned short want = lpm_f32_to_bf16_bits_rn(x);
        unsigned short one;
        unsigned int two;
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(one) : "f"(x));
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(two) : "f"(x), "f"(x));
        if (one != want) {
            ++bad1;
            atomicMin(first, bits);
        }
        if ((two & 0xFFFFu) != want || (two >> 16) != want) {
            ++bad2;
            atomicMin(first + 1, bits);
        }
    }
    if (bad1) atomicAdd(counts, bad1);
    if (bad2) atomicAdd(counts + 1, bad2);
}
