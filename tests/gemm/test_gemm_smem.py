"""The shared-memory formulas of the GPU GEMM kernels (``lowprec_moe.backends.cupy.gemm.smem``, mirrors
of raw_kernels/gemm/grouped_gemm_base.cuh), checked on the CPU against hand-computed layouts and the
227 KiB opt-in limit.
"""

from __future__ import annotations



def test_ws_smem_formula():
    """The warp-specialised NVFP4 kernel's shared memory (mirrors ws_smem_bytes): 6 raw stages
    of a 128-row A and a 256-row B tile, 3 canonical B buffers (no canonical A: it is decoded
    into registers), 1 KiB alignment; the fp32 epilogue tile fits in it, and so does the whole
    under the 227 KiB opt-in limit."""
    from conftest import gemm_internals
    C = gemm_internals()

    nv = C._ws_smem_bytes(C.KIND_FP4_K, C.KIND_FP4_K)
    stage = (128 * 32 + 128 * 4) + (256 * 32 + 256 * 4)  # nibbles + E4M3 scale bytes
    ring = -(-6 * stage // 1024) * 1024  # rounded up to 1 KiB
    assert nv == ring + 3 * 256 * 128 + 1024 == 81 * 1024 + 96 * 1024 + 1024
    assert 128 * (256 + 8) * 4 + 1024 <= nv <= 227 * 1024


def test_ws_tma_smem_formula():
    """The TMA build of the warp-specialised kernel (mirrors ws_tma_smem_bytes): 6 raw stages
    of data only, 3 canonical B buffers, 3 scale slots of 16 bytes (4 k-tiles) per row (128 + 256
    rows), 3 A-fragment buffers (2 steps x 256 consumer threads x 16 bytes), 1 KiB alignment;
    under the opt-in limit with the 1 KiB of static mbarrier space; the step count agrees with
    the kernel header."""
    from conftest import gemm_internals
    C = gemm_internals()
    from lowprec_moe.backends.cupy.gemm import smem as S

    assert S.WS_FRAG_STEPS == 2
    nv = C._ws_tma_smem_bytes()
    assert nv == (6 * (128 + 256) * 32 + 3 * 256 * 128 + 3 * (128 + 256) * 16
                  + 3 * 2 * 256 * 16 + 1024)
    assert nv + 1024 <= 227 * 1024


def test_ws_p_smem_formula():
    """The persistent NVFP4 kernel (mirrors ws_p_smem_bytes): the TMA build's 6 raw stages, 3
    canonical buffers and 3 scale slots, 8 consumer warps' [16][68] fp32 staging buffers and
    128-float column tables, 1 KiB
    alignment; under the opt-in limit with the 1 KiB of static mbarrier space; the padding
    constant agrees with the kernel header."""
    from conftest import gemm_internals
    C = gemm_internals()

    pers = C._ws_p_smem_bytes()
    assert pers == 6 * (128 + 256) * 32 + 3 * 256 * 128 + 3 * (128 + 256) * 16 \
        + 8 * (16 * 68 + 128) * 4 + 1024
    assert pers + 1024 <= C.MAX_SMEM


def test_ws_mx_smem_formula():
    """The warp-specialised MXFP8 kernel (mirrors ws_mx_smem_bytes): 6 raw A stages (128 rows of
    64 bytes) and 4 raw B stages (256 rows), 3 canonical B buffers, 2 scale slots of 16 bytes
    (8 k-tiles) per row, the rows' and columns' largest codes, 1 KiB alignment; under the opt-in
    limit with the 1 KiB of static shared memory that ptxas reports for the kernel."""
    from conftest import gemm_internals
    C = gemm_internals()

    mx = C._ws_mx_smem_bytes()
    assert mx == (6 * 128 * 64 + 4 * 256 * 64 + 3 * 256 * 128 + 2 * (128 + 256) * 16 + 384
                  + 1024)
    assert mx + 1024 <= 227 * 1024


def test_ws_mx_p_smem_formula():
    """The persistent MXFP8 kernel (mirrors ws_mx_p_smem_bytes): the per-tile kernel's A
    stages, one B stage fewer (copies 2 k-tiles ahead), its canonical buffers and scale slots,
    the 8 consumer warps' staging buffers (16 rows x 64 columns of 16-bit values, rows padded to
    144 bytes), two window slots (128 + 256 codes and their range, padded to 416 bytes), 1 KiB
    alignment; the slot size and the new constants agree with the kernel
    header; under the opt-in limit with the 1 KiB of static shared memory."""
    from conftest import gemm_internals
    C = gemm_internals()
    from lowprec_moe.backends.cupy.gemm import smem as S

    assert S.WMX_WIN_SLOT == 416
    assert (S.WMX_P_AHEAD, S.WMX_EPI_STAGING) == (2, 8 * 16 * (2 * 64 + 16))
    mx = C._ws_mx_p_smem_bytes()
    assert mx == (6 * 128 * 64 + 3 * 256 * 64 + 3 * 256 * 128 + 2 * (128 + 256) * 16
                  + 8 * 16 * 144 + 2 * 416 + 1024)
    assert mx + 1024 <= C.MAX_SMEM


def test_swap_smem_formula():
    """The swapped-operand kernel's shared memory (mirrors swap_smem_bytes): NVFP4 leaves room
    for four CTAs per SM (1 KiB reserved per CTA; its 80-register bound allows three), MXFP8
    two."""
    from conftest import gemm_internals
    C = gemm_internals()

    nv = C._swap_smem_bytes(C.KIND_FP4_K, C.KIND_FP4_K)
    mx = C._swap_smem_bytes(C.KIND_FP8_K, C.KIND_FP8_K)
    # ring: 6 (NVFP4) / 4 (MXFP8) x (128 weight rows + 32 token rows) raw, rounded to 1 KiB;
    # 2 x canonical rows of 128 B: NVFP4 the 32 token rows (weights go to registers), MXFP8 160
    assert nv == 34 * 1024 + 2 * 32 * 128 + 1024
    assert mx == 45 * 1024 + 2 * 160 * 128 + 1024
    assert 4 * (nv + 1024) <= 228 * 1024 and 2 * (mx + 1024) <= 228 * 1024
    # the wide NVFP4 TMA build: 256 weight rows per stage, two CTAs per SM
    wide = C._swap_smem_bytes(C.KIND_FP4_K, C.KIND_FP4_K, wide=True)
    assert wide == 61 * 1024 + 2 * 32 * 128 + 1024
    assert 2 * (wide + 1024) <= 228 * 1024


def test_mxfp8_wgmma_smem_has_exponent_bytes():
    """The MXFP8 wgmma kernels keep one byte per tile row and column (the fp16 window's largest
    block codes) after their canonical buffers; NVFP4 and mma.sync kernels do not."""
    from conftest import gemm_internals
    C = gemm_internals()

    def formula(ak, bk, bm, wg, extra):
        ring = C._raw_ring_bytes(ak, bk, bm, 256)
        canon = C._canon(bm) + C._canon(256)
        ncb = 3 if wg and ring + 3 * canon + 1024 <= C.MAX_SMEM else 2
        return max(ring + ncb * canon + extra, C._epi_bytes(bm, 256)) + 1024

    fp8k, fp8mn, fp4 = C.KIND_FP8_K, C.KIND_FP8_MN, C.KIND_FP4_K
    for bm in (64, 128):
        for bk in (fp8k, fp8mn):
            assert C._smem_bytes(fp8k, bk, bm, 256, True) == formula(fp8k, bk, bm, True, bm + 256)
            assert C._smem_bytes(fp8k, bk, bm, 256, False) == formula(fp8k, bk, bm, False, 0)
        assert C._smem_bytes(fp4, fp4, bm, 256, True) == formula(fp4, fp4, bm, True, 0)


def test_ws_g_tma_smem_formula():
    """The ragged NVFP4 kernel's TMA build (mirrors ws_g_tma_smem_bytes): 5 stages (2 k-tiles
    requested ahead + 3 canonical buffers) of each operand's even rows (32 bytes each), odd rows
    (48: a box starting 8 bytes early) and E4M3 scale bytes (4 a row), rounded up to 1 KiB, the 3
    canonical B buffers, 1 KiB alignment; under the opt-in limit with the 1 KiB of static
    mbarrier space; the look-ahead agrees with the kernel header."""
    from lowprec_moe.backends.cupy.gemm import smem as S

    assert S.WS_G_TMA_AHEAD == 2
    stage = (64 * 32 + 64 * 48 + 128 * 4) + (128 * 32 + 128 * 48 + 256 * 4)
    assert stage == 16896
    nv = S._ws_g_tma_smem_bytes()
    assert nv == -(-5 * stage // 1024) * 1024 + 3 * 256 * 128 + 1024 == 180 * 1024
    assert nv + 1024 <= 227 * 1024
