// lowprec_moe grouped GEMM (part of grouped_gemm_common.cuh, which has the overview): the ragged
// persistent NVFP4 kernel gemm_ws_g and its entry-point macro LPM_GG_DEFINE_WS_H.
//
// NVFP4 wgrad contracts each expert's tokens, padded to the 16-token block, so on uneven splits
// every expert has its own row stride (8-byte aligned only): no one tensor map covers the
// experts, and gemm_ws's cp.async build runs one CTA per 128 x 256 tile. A tile's start
// (barrier set-up, the first copies' latency, the first expansion), its epilogue with idle
// producers and an empty expert's zero tile then cost more than most experts' few k-tiles.
// gemm_ws_g runs one CTA per SM over a list of tiles of any lengths:
//   * Tile list: CTA b runs entries b, b + gridDim.x, ... of the ragged tile table
//     (grouped_gemm_ragged_list.cuh; the launcher's lowprec_moe.backends.cupy.gemm.balance
//     balances the CTAs and pads the lists with entries of no tile, expert -1, whose first
//     k-tile is the CTA's total).
//   * Data tiles arrive through four tensor maps per expert (WsgTmaLayout,
//     grouped_gemm_ws_ragged_tma.cuh: each operand's even and odd rows, viewed as rows of pairs,
//     whose stride is a multiple of 16 bytes; maps built on the device by ws_g_build_maps), one
//     thread issuing a k-tile's four boxes on the stage's mbarrier, which the producers wait on
//     before expanding B and the consumers before decoding A; the block scales are loaded by
//     the producers as in gemm_ws.
//   * The producers keep a cursor on the copy stream (the tile of the next k-tile to request,
//     its copy state built from the expert's descriptor when the stream enters it) and one on
//     the expansion (the tile's valid extents); both skip tiles without k-tiles. Raw stages,
//     canonical buffers and barriers run on the flattened k-tile index j, so the next tile's
//     first k-tiles are requested and expanded while the consumers finish the current one and
//     run its epilogue.
//   * The consumers run each tile's k-tiles as gemm_ws does, then (once every consumer's wgmma
//     retired) their warps' register epilogue, 64 columns at a time, through staging buffers
//     and column tables in the tile's last canonical buffer, which goes back to the producers
//     after the epilogue. An expert without tokens gets +0 (Epilogue::zero_tile).
// Every output element gets gemm_ws's products in the same order and the same epilogue
// arithmetic: the results are its bit for bit. Conditions (the launcher's): every expert with
// tokens 16-byte aligned, with an even row count and a stride that is a multiple of 8 bytes;
// 16-bit output without bias, no accumulation (reg_epi_ok); its shared memory
// (ws_g_tma_smem_bytes).

#ifndef LPM_GROUPED_GEMM_WS_RAGGED_CUH
#define LPM_GROUPED_GEMM_WS_RAGGED_CUH

#include "grouped_gemm_ws.cuh"
#include "grouped_gemm_ragged_list.cuh"
#include "grouped_gemm_ws_ragged_tma.cuh"

namespace lpm_gg {

// The producers' copy state of one tile (entry e of expert descriptor d): the bases of its rows
// in both operands' data and block scales, their strides, the contraction length and the valid
// extents. The per-thread copy objects (gemm_ws's OperandCopy / ScaleCopy) are rebuilt from it
// per k-tile: kept whole across the k-loop they cost the producers (80 registers) spills.
// The expert's row-pair maps (ma: A's even rows, then its odd rows; mb: B's) and the tile's
// first row pairs in them.
struct WsgSource {
    const unsigned char *a, *b, *sa, *sb;
    int a_ld, b_ld, a_sld, b_sld, len, rv, cv;
    const TmaMap *ma, *mb;
    int pa, pb;

    __device__ __forceinline__ WsgSource(const unsigned char* a_data, const unsigned char* a_scale,
                                         const unsigned char* b_data, const unsigned char* b_scale,
                                         const long long* d, const WmxGEntry& e,
                                         const TmaMap* maps)
        : a(a_data + d[D_A_OFF] + e.r0 * d[D_A_LD]),
          b(b_data + d[D_B_OFF] + e.c0 * d[D_B_LD]),
          sa(a_scale + d[D_A_SOFF] + e.r0 * d[D_A_SLD]),
          sb(b_scale + d[D_B_SOFF] + e.c0 * d[D_B_SLD]),
          a_ld(static_cast<int>(d[D_A_LD])),
          b_ld(static_cast<int>(d[D_B_LD])),
          a_sld(static_cast<int>(d[D_A_SLD])),
          b_sld(static_cast<int>(d[D_B_SLD])),
          len(static_cast<int>(d[D_LEN])),
          rv(e.rv),
          cv(e.cv),
          ma(maps + 4 * e.g),
          mb(maps + 4 * e.g + 2),
          pa(e.r0 / 2),
          pb(e.c0 / 2) {}
};

template <int CH>
__device__ __forceinline__ void gemm_ws_g(LPM_GG_PARAMS, const TmaMap* maps, int num_entries) {
    constexpr int AKIND = KIND_FP4_K, BKIND = KIND_FP4_K;
    constexpr int BM = 128, BN = 256;
    constexpr int CANON_B = canon_bytes(BN);
    using TL = WsgTmaLayout;  // the stages
    constexpr int NCB = kWsCanonBuffers;
    constexpr int NST = TL::STAGES, AHEAD = TL::AHEAD;
    constexpr int STAGE = TL::STAGE;
    // block scales in a stage
    constexpr int A_SC = TL::A_SC;
    constexpr int B_SC = TL::B_SC;
    constexpr int CANON_OFF = TL::CANON_OFF;
    constexpr int NW = kWsConsumers / 32;
    constexpr int CCOLS = BN / 4;                     // columns per epilogue chunk
    constexpr int WBUF = reg_epi_bytes<CCOLS>();      // a warp's staging buffer
    constexpr int SMEM = ws_g_tma_smem_bytes();
    constexpr int NI = BN / 8;  // accumulator fragments per consumer warp (16 rows x 256)
    static_assert(CANON_OFF + NCB * CANON_B + 1024 <= SMEM, "shared memory");
    static_assert(NW * (WBUF + 4 * CCOLS) <= CANON_B,
                  "staging buffers and column tables within a canonical buffer");
    static_assert(CANON_OFF % 1024 == 0 && CANON_B % 1024 == 0, "128-byte swizzle atoms");
    static_assert(AHEAD >= 2 && NCB >= 2 && NCB <= 3 && kBK == 64 && NST >= AHEAD + NCB,
                  "pipeline depth");

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned s0;
    unsigned char* const smem = gemm_smem(smem_raw, SMEM, a_ch != CH || b_ch != CH, s0);

    // This CTA's entries (the launcher pads every CTA's list to num_entries / gridDim.x) and its
    // k-tiles J: from its last entry (a padding entry's first k-tile is the CTA's total).
    const int per_cta = num_entries / static_cast<int>(gridDim.x);
    if (per_cta <= 0) return;
    // the raw stages' mbarriers, one arrival (the issuing thread's expect_tx) plus the
    // copies' bytes
    __shared__ __align__(8) unsigned long long g_bar[NST];
    const unsigned dbar = smem_u32(g_bar);
    if (threadIdx.x == kWsConsumers) {
#pragma unroll
        for (int i = 0; i < NST; ++i) mbar_init(dbar + 8 * i, 1);
        mbar_init_fence();
    }
    __syncthreads();
    auto entry = [&](int i) {
        return wmx_g_entry(tiles, i * static_cast<int>(gridDim.x) + static_cast<int>(blockIdx.x));
    };
    auto total = [&]() {
        const WmxGEntry e = entry(per_cta - 1);
        return e.g < 0 ? e.j0 : e.j0 + e.kt;
    };
    // the first entry from i on with k-tiles (the caller knows there is one)
    auto next_real = [&](int i) {
        while (__ldg(tiles + kWmxGEntryWords * (i * static_cast<int>(gridDim.x) +
                                                static_cast<int>(blockIdx.x)) + 2) == 0)
            ++i;
        return i;
    };

    if (threadIdx.x >= kWsConsumers) {
        // ---------------- producer warpgroups ----------------
        regs_release<kWsProducerRegs>();
        const int J = total();
        if (J == 0) return;
        const unsigned t = threadIdx.x - kWsConsumers;
        auto source = [&](int i) {
            const WmxGEntry e = entry(i);
            return WsgSource(a_data, a_scale, b_data, b_scale,
                                  desc + static_cast<long long>(e.g) * kDescWords, e, maps);
        };
        // the copy stream: entry ci, k-tile ck of its ckt, copy state src
        int ci = next_real(0), ck = 0, ckt = entry(ci).kt;
        WsgSource src = source(ci);
        // the copying thread acquires the tile's maps (built by an earlier kernel)
        auto acquire = [&]() {
            if (t == 0) {
                tmap_acquire(src.ma);
                tmap_acquire(src.ma + 1);
                tmap_acquire(src.mb);
                tmap_acquire(src.mb + 1);
            }
        };
        acquire();
        auto advance = [&]() {
            if (++ck == ckt) {
                ci = next_real(ci + 1);
                ck = 0;
                ckt = entry(ci).kt;
                src = source(ci);
                acquire();
            }
        };
        auto issue = [&](int stage) {
            const unsigned sb = s0 + stage * STAGE;
            // one thread: each operand's even rows' box, then its odd rows'
            if (t == 0) {
                const unsigned bar = dbar + 8 * stage;
                const int x = ck * TL::ROW;
                mbar_arrive_expect_tx(bar, TL::TX);
                tma_load_2d(sb + TL::A_EVEN, src.ma, bar, x, src.pa);
                tma_load_2d(sb + TL::A_ODD, src.ma + 1, bar, x + src.a_ld - (src.a_ld & 8),
                            src.pa);
                tma_load_2d(sb + TL::B_EVEN, src.mb, bar, x, src.pb);
                tma_load_2d(sb + TL::B_ODD, src.mb + 1, bar, x + src.b_ld - (src.b_ld & 8),
                            src.pb);
            }
        };
        ScaleRegs<AKIND, BM, kWsProducers> sra;
        ScaleRegs<BKIND, BN, kWsProducers> srb;
        auto load_scales = [&]() {
            const long long k0 = static_cast<long long>(ck) * kBK;
            sra.load(ScaleCopy<AKIND, BM, kWsProducers>(src.sa, src.a_sld, t), k0, src.rv,
                     src.len, t);
            srb.load(ScaleCopy<BKIND, BN, kWsProducers>(src.sb, src.b_sld, t), k0, src.cv,
                     src.len, t);
        };
        auto store_scales = [&](int stage) {
            unsigned char* sb = smem + stage * STAGE;
            sra.store(sb + A_SC, t);
            srb.store(sb + B_SC, t);
        };
        // Prologue: k-tiles 0..AHEAD-1 requested and their scales stored; then the stream's
        // next k-tile's scales in registers.
#pragma unroll
        for (int s = 0; s < AHEAD; ++s) {
            if (s < J) {
                load_scales();
                issue(s);
                store_scales(s);
                if (s + 1 < J) advance();
            }
        }
        if (AHEAD < J) load_scales();
        // the expansion: entry xi's valid extents, k-tile xk of its xkt
        int xi = next_real(0), xk = 0, xkt, xrv, xcv, xsh = 0;
        auto expand_in = [&]() {
            const WmxGEntry e = entry(xi);
            xkt = e.kt;
            xrv = e.rv;
            xcv = e.cv;
            // B's odd rows start sh bytes into their boxes
            xsh = static_cast<int>(__ldg(desc + static_cast<long long>(e.g) * kDescWords +
                                         D_B_LD) & 8);
        };
        // this thread's two B units (rows bu and bu + 128, contraction half t % 2,
        // as convert_stage's units t and t + 256) in a stage; an odd row's place moves by xsh
        const int bu = static_cast<int>(t) >> 1, bodd = bu & 1;
        const unsigned b_off = static_cast<unsigned>(
            (bodd ? TL::B_ODD + (bu >> 1) * TL::OROW : TL::B_EVEN + (bu >> 1) * TL::ROW) +
            (static_cast<int>(t) & 1) * 16);
        const unsigned b_d = static_cast<unsigned>(64 * (bodd ? TL::OROW : TL::ROW));
        const unsigned b_so = static_cast<unsigned>(TL::B_SC + 4 * bu + 2 * (t & 1));
        expand_in();
        for (int j = 0; j < J; ++j) {
            // Invariants: k-tiles j..j+AHEAD-1 requested (one commit group each), their scales
            // stored; the stream at k-tile j+AHEAD, its scales in registers.
            const int cb = j % NCB;
            mbar_wait(dbar + 8 * (j % NST), static_cast<unsigned>(j / NST) & 1u);  // landed
            named_sync(WS_BAR_PROD, kWsProducers);  // everyone's (and scales); k-tile j-1 expanded
            // k-tile j-NCB retired: its canonical buffer is free, and so is its raw stage (the
            // consumers read its A half until then), which k-tile j+AHEAD takes.
            if (j >= NCB) named_sync(WS_BAR_EMPTY + cb, kWsThreads);
            const int nt = j + AHEAD;
            if (nt < J) {
                issue(nt % NST);
                store_scales(nt % NST);
                if (nt + 1 < J) {
                    advance();
                    load_scales();
                }
            }
            // Expand k-tile j's B half into canonical buffer cb.
            {
                // convert_stage's loads (8 bytes at a time: odd rows may start 8 bytes into a
                // 16-byte word) and stores
                const unsigned st0 = s0 + (j % NST) * STAGE;
                const unsigned rb = st0 + b_off + (bodd ? xsh : 0);
                UnitRaw<KIND_FP4_K> x0, x1;
                const uint2 p0 = lds_v2(rb), q0 = lds_v2(rb + 8);
                const uint2 p1 = lds_v2(rb + b_d), q1 = lds_v2(rb + b_d + 8);
                x0.w = make_uint4(p0.x, p0.y, q0.x, q0.y);
                x1.w = make_uint4(p1.x, p1.y, q1.x, q1.y);
                x0.s2 = lds_u16(st0 + b_so);
                x1.s2 = lds_u16(st0 + b_so + 128 * 4);
                unsigned char* const cs = smem + CANON_OFF + cb * CANON_B;
                const int u0 = static_cast<int>(t);
                if (unit_live<BKIND>(u0, xcv))
                    unit_store<BKIND, BN, false, false, false>(x0, cs, u0);
                if (unit_live<BKIND>(u0 + kWsProducers, xcv))
                    unit_store<BKIND, BN, false, false, false>(x1, cs, u0 + kWsProducers);
            }
            fence_proxy_async();
            named_arrive(WS_BAR_FULL + cb, kWsThreads);
            if (++xk == xkt && j + 1 < J) {
                xi = next_real(xi + 1);
                xk = 0;
                expand_in();
            }
        }
        return;
    }

    // ---------------- consumer warpgroups ----------------
    // gemm_ws's consumers, tile after tile; at a tile's end every MMA retires, the last
    // k-tile's canonical buffer goes back to the producers at once and each warp runs its rows'
    // epilogue through its own staging buffer.
    regs_claim<kWsConsumerRegs>();
    const int J = total();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int wm0 = 64 * (warp >> 2) + 16 * (warp & 3);
    const int ar = wm0 + (lane >> 2), aq = lane & 3;
    // the warp's staging buffer and column table in a canonical buffer
    const unsigned wbuf = s0 + CANON_OFF + warp * WBUF;
    const unsigned wtab = s0 + CANON_OFF + NW * WBUF + warp * (4 * CCOLS);
    float acc[NI * 4];
    float* const accf = acc;
    // this thread's A rows ar, ar + 8 in a stage (an odd row's place moves by the
    // tile's sh) and their block scales
    const int aodd = ar & 1;
    const unsigned a_off = static_cast<unsigned>(
        aodd ? TL::A_ODD + (ar >> 1) * TL::OROW : TL::A_EVEN + (ar >> 1) * TL::ROW);
    const unsigned a_d8 = static_cast<unsigned>(4 * (aodd ? TL::OROW : TL::ROW));
    const unsigned a_so = static_cast<unsigned>(TL::A_SC + 4 * ar);
    const unsigned sel = static_cast<unsigned>(aq) | (static_cast<unsigned>(aq + 4) << 4);
    int j = 0;
    for (int i = 0; i < per_cta; ++i) {
        const WmxGEntry e = entry(i);
        if (e.g < 0) break;  // past the CTA's tiles
        const long long* const d = desc + static_cast<long long>(e.g) * kDescWords;
        if (e.kt == 0) {  // an expert without tokens
            if (zero_if_empty) {
                const Epilogue ep = LPM_GG_EPILOGUE_OF(d);
                ep.zero_tile(e.r0, e.c0, e.rv, e.cv, kWsConsumers);
            }
            continue;
        }
#pragma unroll
        for (int x = 0; x < NI * 4; ++x) acc[x] = 0.0f;
        const unsigned ash = aodd ? static_cast<unsigned>(d[D_A_LD] & 8) : 0u;
        for (int kt = 0; kt < e.kt; ++kt, ++j) {
            const int cb = j % NCB;
            named_sync(WS_BAR_FULL + cb, kWsThreads);  // B of k-tile j expanded into buffer cb
            const int st = j % NST;
            // the producers waited for the copies; waiting here too makes the TMA writes
            // visible to this thread (one try_wait)
            mbar_wait(dbar + 8 * st, static_cast<unsigned>(j / NST) & 1u);
            const unsigned long long db = wg_desc(s0 + CANON_OFF + cb * CANON_B, 16, 1024);
            // fp4_a_frags's loads and decode on this stage's places
            const unsigned ra = s0 + st * STAGE + a_off + ash;
            const unsigned sa = lds_u32(s0 + st * STAGE + a_so);
            const unsigned sb = lds_u32(s0 + st * STAGE + a_so + 8 * 4);
            ws_fp4_steps<NI * 4>(
                accf, db,
                [&](int s) {
                    ws_step_wait<NI * 4>(s, kt >= 1 && j - 1 + NCB < J, (j + NCB - 1) % NCB,
                                         accf);
                },
                [&](int s, unsigned (&f)[1][4]) {
                    const uint2 wa = lds_v2(ra + s * 8), wb = lds_v2(ra + a_d8 + s * 8);
                    fp4_a_step(s, wa.x, wa.y, wb.x, wb.y, sa, sb, sel, f[0]);
                });
        }
        wg_wait0();
        wg_fence_acc<NI * 4>(accf);
        Epilogue ep = LPM_GG_EPILOGUE_OF(d);
        if (!reg_epi_ok(ep)) __trap();  // the launcher's condition
        ep.init_alpha();
        // every consumer's wgmma retired: the last k-tile's canonical buffer takes the warps'
        // staging buffers, and goes back to the producers after the epilogue
        named_sync(WS_BAR_EPI, kWsConsumers);
        const int cb = (j - 1) % NCB;
        const unsigned cbo = static_cast<unsigned>(cb * CANON_B);
        reg_epi<NI, false, CCOLS / 8>(ep, wbuf + cbo, wtab + cbo, accf, wm0, lane, e.r0, e.c0,
                                      e.rv, e.cv);
        if (j - 1 + NCB < J) named_arrive(WS_BAR_EMPTY + cb, kWsThreads);
    }
}

}  // namespace lpm_gg

// extern "C" entry point NAME of the ragged persistent NVFP4 kernel (sm_90a): the experts'
// row-pair tensor maps, four per expert in `maps` (a device array: A's even and odd rows, then
// B's; see WsgTmaLayout). CH: the launcher's copy chunk, checked only.
#define LPM_GG_DEFINE_WS_H(NAME, CH)                                                           \
    extern "C" __global__ void __launch_bounds__(lpm_gg::kWsThreads, 1)                        \
        NAME(LPM_GG_PARAMS, const lpm_gg::TmaMap* maps, int num_entries) {                     \
        lpm_gg::gemm_ws_g<CH>(LPM_GG_ARGS, maps, num_entries);                           \
    }

#endif  // LPM_GROUPED_GEMM_WS_RAGGED_CUH
