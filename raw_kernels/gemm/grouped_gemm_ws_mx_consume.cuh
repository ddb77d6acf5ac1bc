// lowprec_moe grouped GEMM (part of grouped_gemm_common.cuh, which has the overview): the
// consumer k-loop of the warp-specialised MXFP8 kernel (grouped_gemm_ws_mx.cuh) and of its
// persistent form (grouped_gemm_ws_mx_persist.cuh), wmx_consume: per 16-deep step a consumer
// thread widens its A fragments straight from the raw stage into registers (rows ar, ar + 8;
// contraction 2q, 2q+1, 2q+8, 2q+9: half-word q % 2 of words q / 2 and q / 2 + 2 of the step's
// 16-byte chunk) and its warpgroup issues two m64n128k16 with B from a canonical buffer. An
// MN-major A (one raw panel of 64 lines x 128 rows, 128-byte swizzle) is read with
// ldmatrix.trans of 16-bit row pairs, two steps per load: fragment rows ar and ar + 8 then hold
// tile rows 2 (lane/4) and 2 (lane/4) + 1 of the warp's 16 (frag_row), a permutation of the
// rows that the window rescale and the epilogue undo -- each output is the same dot product.

#ifndef LPM_GROUPED_GEMM_WS_MX_CONSUME_CUH
#define LPM_GROUPED_GEMM_WS_MX_CONSUME_CUH

#include "grouped_gemm_dequant.cuh"
#include "grouped_gemm_ws_roles.cuh"
#include "grouped_gemm_mxf16.cuh"
#include "grouped_gemm_ws_mx_produce.cuh"

namespace lpm_gg {

// Where consumer thread tid's A fragments and block codes lie in a raw A stage and a scale slot
// (layout L: WmxLayout).
template <bool AMN, class L>
struct WmxFrag {
    int wm0, lane;
    // The tile rows of the thread's fragment rows lane/4 and lane/4 + 8: ar and ar + 8, or for
    // an MN-major A (frag_row<AMN>: ldmatrix.trans hands each thread a pair of adjacent rows)
    // wm0 + 2 (lane/4) and the next; the epilogue and mx_rescale follow the same map.
    int ra0, ra1;
    // Row ar's words in a raw stage: step s reads 16-byte chunk s, stored at chunk s ^ sw,
    // words aq / 2 and aq / 2 + 2 of it (a_off); row ar + 8 (the same swizzle) 8 rows further
    // on; sel picks the thread's half-word of each word; s_off: its block codes in a slot.
    unsigned sw, a_off, sel, s_off;
    // MN-major A (raw panel [64 lines][128 bytes], 128-byte swizzle: chunk c of line l at
    // c ^ (l & 7)): steps 2p and 2p + 1 in one ldmatrix.x4.trans of 16-bit row pairs, lane l
    // addressing line 32p + l at the warp's chunk wm0 / 16 -- the four 8 x 8 matrices are
    // lines 0-7, 8-15 of step 2p and of step 2p + 1; each thread gets rows ra0, ra1 of
    // contraction lines 2 (lane%4) and 2 (lane%4) + 1 (+ 8 in the second matrix).
    unsigned a_mn;
    __device__ __forceinline__ explicit WmxFrag(unsigned tid) {
        const int warp = static_cast<int>(tid >> 5);
        lane = static_cast<int>(tid & 31u);
        wm0 = 64 * (warp >> 2) + 16 * (warp & 3);
        const int ar = wm0 + (lane >> 2), aq = lane & 3;
        ra0 = frag_row<AMN>(wm0, lane, 0);
        ra1 = frag_row<AMN>(wm0, lane, 1);
        sw = static_cast<unsigned>((ar >> 1) & 3);
        a_off = static_cast<unsigned>(ar * kBK + ((aq >> 1) << 2));
        sel = (aq & 1) ? 0x7632u : 0x5410u;
        s_off = static_cast<unsigned>(AMN ? ra0 : ar * L::T_SLD);
        a_mn = static_cast<unsigned>(lane * 128 + (((wm0 >> 4) ^ (lane & 7)) << 4));
    }
};

// The consumer k-loop over k-tiles j0 .. jend - 1 of the CTA's k-tile sequence (one tile's; J:
// the sequence's length, after which no canonical buffer is handed back): the ring positions
// (A's stage, canonical buffer, scale slot) and phases follow the sequence index, so one tile
// can start where the previous one ended. H: the fp16 window (fka / fkb: rows ra0's and ra1's
// parts of their factor words, mx_window_row); E5: E5M2 A. The caller retires the last groups
// (wg_wait0) and hands back the last k-tile's canonical buffer (a tile's first k-tile does not
// hand back the one before). tail_len (MN-major A, TAIL): shared word with the contraction's
// length in its last k-tile, 1..64; without TAIL every k-tile is whole. exps_a (fp16 window,
// TAIL): the tile rows' largest codes. k-tile kt reads group kt / kWmxScaleTiles (j0 a multiple
// of kWmxScaleTiles).
template <bool AMN, bool BMN, class L, bool H, bool E5, int NACC, bool TAIL = true>
__device__ __forceinline__ void wmx_consume(float* accf, const WmxFrag<AMN, L>& fr, unsigned s0,
                                            unsigned abar, unsigned sbar, unsigned tail_len,
                                            const unsigned char* exps_a, unsigned fka,
                                            unsigned fkb, int j0, int jend, int J) {
    constexpr int BM = L::BM, NSA = kWmxAStages, NCB = kWmxCanonBuffers;
    constexpr int NSG = kWmxScaleSlots, SGT = kWmxScaleTiles;
    constexpr int T_DA = L::T_DA, CANON_B = L::CANON_B, T_CANON = L::T_CANON;
    constexpr int T_SLD = L::T_SLD, T_SC = L::T_SC, T_SLOT = L::T_SLOT;
    constexpr int B_STEP = BMN ? 16 * 128 : 32;  // bytes of a 16-deep step in a canonical B
    // NCB k-tiles at a time (group c): the canonical buffer is a constant of the unrolled
    // k-tiles, A's stage NCB (c % 2) + u and its phase (c / 2) & 1 (NSA = 2 NCB) bit
    // operations on the group index, so the k-tile head needs no division by 3 or 6
    // (unrolled over A's whole ring instead, ptxas serializes the wgmma: C7512)
    static_assert(NSA == 2 * NCB, "two groups of NCB k-tiles per turn of A's stage ring");
    for (int c = j0 / NCB; NCB * c < jend; ++c) {
#pragma unroll
        for (int u = 0; u < NCB; ++u) {
            const int kt = NCB * c + u;
            if (kt < j0) continue;
            if (kt >= jend) break;
            const int cb = u;
            named_sync(WS_BAR_FULL + cb, kWsThreads);  // B of tile kt widened into buffer cb
            // (unsigned: the sequence indices are never negative; shifts, not signed divisions)
            const unsigned ukt = static_cast<unsigned>(kt), uc = static_cast<unsigned>(c);
            const int st = NCB * static_cast<int>(uc & 1u) + u;
            // the k-tile's scale group and place in it
            const unsigned g = ukt / SGT;
            const unsigned ph_a = (uc >> 1) & 1u;
            // A's copies were issued with B's, which the producers waited for before arriving at
            // FULL; the wait makes A's TMA writes visible to this thread (and is usually one
            // try_wait)
            mbar_wait(abar + 8 * st, ph_a);
            mbar_wait(sbar + 8 * (g % NSG), (g / NSG) & 1u);
            if constexpr (AMN && TAIL) {
                // a last k-tile that ends early: its lines from tail_len on become zeros -- of
                // B's canonical buffer (bytes 128 * tail_len on of each 64-column panel) and of
                // A's raw panel (the next expert's lines), so that the steps there multiply zero
                // fragments by zeros, +0 products as in the plain kernel's zero-filled tail --
                // and, when the whole second block lies past it, A's codes of that block become
                // finite factors' (they are the next expert's: a NaN code, or in the fp16 window
                // a code outside it, would make 0 * NaN or 0 * inf). Once per tile, instead of
                // zeroing the A fragments after decoding in every step past the end -- which
                // measured 0.5-2 % faster on four wgrad shapes (H200), though its code sits in
                // every step.
                if (kt == jend - 1) {
                    const unsigned tail = lds_u32_volatile(tail_len);
                    if (tail < kBK) {
                        const unsigned pb = s0 + T_CANON + cb * CANON_B +
                                            (threadIdx.x >> 6) * (kBK * 128);
                        for (unsigned o = tail * 128 + 16 * (threadIdx.x & 63); o < kBK * 128;
                             o += 64 * 16)
                            sts_v4(pb + o, 0u, 0u, 0u, 0u);
                        const unsigned pa = s0 + st * T_DA;
                        for (unsigned o = tail * 128 + 16 * threadIdx.x; o < kBK * 128;
                             o += kWsConsumers * 16)
                            sts_v4(pa + o, 0u, 0u, 0u, 0u);
                        if (tail <= LPM_MXFP8_BLOCK && threadIdx.x < BM / 4) {
                            // row r's code: its largest (fp16 window: a factor in the window)
                            // or 2^0 (bf16)
                            unsigned w4 = LPM_E8M0_BIAS * 0x01010101u;
                            if constexpr (H) {
                                w4 = 0u;
#pragma unroll
                                for (int i = 0; i < 4; ++i)
                                    w4 |= static_cast<unsigned>(exps_a[4 * threadIdx.x + i])
                                          << (8 * i);
                            }
                            sts_u32(s0 + T_SC + (g % NSG) * T_SLOT +
                                        (ukt % SGT) * 2 * BM + BM +
                                        4 * threadIdx.x,
                                    w4);
                        }
                        fence_proxy_async();
                        named_sync(WS_BAR_EPI, kWsConsumers);
                    }
                }
            }
            // B's canonical buffer (MN-major: 64-row panels 8 KiB apart, a step = 16 lines)
            const unsigned long long db =
                wg_desc(s0 + T_CANON + cb * CANON_B, BMN ? kBK * 128 : 16, 1024);
            const unsigned ra = s0 + st * T_DA + (AMN ? fr.a_mn : fr.a_off);
            const unsigned rsc = s0 + T_SC + (g % NSG) * T_SLOT +
                                 (ukt % SGT) * 2 * (AMN ? BM : 1) +
                                 fr.s_off;
            // the block codes of rows ra0 (ma*) and ra1 (mb*), blocks 0 and 1 (K-major: one
            // half-word per row; MN-major: one per block line, rows ra0 and ra1 side by side)
            const unsigned ca = lds_u16(rsc), cr = lds_u16(rsc + (AMN ? BM : 8 * T_SLD));
            const unsigned ea0 = ca & 0xFFu, ea1 = (AMN ? cr : ca >> 8) & 0xFFu;
            const unsigned eb0 = AMN ? ca >> 8 : cr & 0xFFu, eb1 = cr >> 8;
            // fp16 window: one IMAD per factor (codes of rows past the valid ones give other
            // bits: those rows are never stored; a block past the contraction has its data
            // zeroed and its codes replaced above); bf16: 2^(e - 127)
            const unsigned ma0 = mx_block_factor<H>(ea0, fka), ma1 = mx_block_factor<H>(ea1, fka);
            const unsigned mb0 = mx_block_factor<H>(eb0, fkb), mb1 = mx_block_factor<H>(eb1, fkb);
            auto chunk = [&](int s) { return ra + ((static_cast<unsigned>(s) ^ fr.sw) << 4); };
            // each step's words are loaded one step ahead, before the wgmma wait (MN-major:
            // two steps' words per load, the second pair after step 1's decode)
            unsigned wa0, wa1, wb0, wb1;
            if constexpr (AMN) {
                ldsm_x4_t(ra, wa0, wa1, wb0, wb1);
            } else {
                wa0 = lds_u32(chunk(0));
                wa1 = lds_u32(chunk(0) + 8);
                wb0 = lds_u32(chunk(0) + 8 * kBK);
                wb1 = lds_u32(chunk(0) + 8 * kBK + 8);
            }
            unsigned af[2][4];
#pragma unroll
            for (int s = 0; s < kBK / 16; ++s) {
                ws_step_wait<NACC>(s, kt > j0 && kt - 1 + NCB < J, (u + NCB - 1) % NCB, accf);
                unsigned* const f = af[s & 1];
                if constexpr (AMN) {
                    // step s: lines 0-7 in x, 8-15 in y; bytes (row ra0, line 2q), (ra1, 2q),
                    // (ra0, 2q + 1), (ra1, 2q + 1) of each
                    const unsigned x = (s & 1) ? wb0 : wa0, y = (s & 1) ? wb1 : wa1;
                    mx_decode4<E5, H>(__byte_perm(x, y, 0x6420u), s < 2 ? ma0 : ma1, f[0], f[2]);
                    mx_decode4<E5, H>(__byte_perm(x, y, 0x7531u), s < 2 ? mb0 : mb1, f[1], f[3]);
                    if (s == 1) ldsm_x4_t(ra + 32 * 128, wa0, wa1, wb0, wb1);
                } else {
                    mx_decode4<E5, H>(__byte_perm(wa0, wa1, fr.sel), s < 2 ? ma0 : ma1, f[0],
                                      f[2]);
                    mx_decode4<E5, H>(__byte_perm(wb0, wb1, fr.sel), s < 2 ? mb0 : mb1, f[1],
                                      f[3]);
                    if (s + 1 < kBK / 16) {
                        const unsigned ch = chunk(s + 1);
                        wa0 = lds_u32(ch);
                        wa1 = lds_u32(ch + 8);
                        wb0 = lds_u32(ch + 8 * kBK);
                        wb1 = lds_u32(ch + 8 * kBK + 8);
                    }
                }
                wg_fence();
#pragma unroll
                for (int n = 0; n < 2; ++n)
                    wgmma_m64n128k16_rs<H, BMN ? 1 : 0>(
                        accf + 64 * n, af[s & 1],
                        static_cast<unsigned>(db) + ((n * (128 * 128) + s * B_STEP) >> 4),
                        static_cast<unsigned>(db >> 32));
                wg_commit();
                wg_fence_acc<NACC>(accf);
            }
        }
    }
}

}  // namespace lpm_gg

#endif  // LPM_GROUPED_GEMM_WS_MX_CONSUME_CUH
