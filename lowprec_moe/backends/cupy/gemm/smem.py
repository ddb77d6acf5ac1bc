"""Shared-memory sizes of the grouped-GEMM tensor-core kernels, mirroring the formulas in
``raw_kernels/gemm/grouped_gemm_base.cuh`` (gemm_smem_bytes, ws_smem_bytes, swap_smem_bytes): the
launcher requests exactly what a kernel checks for (it traps when given less).
"""

from __future__ import annotations

from lowprec_moe import formats as F
from lowprec_moe.backends.cupy.gemm.plan import (BK, SWAP_TILE, SWAP_WIDE_TILE, WS_TILE, KIND_FP4_K, KIND_FP8_K, KIND_FP8_MN, KIND_HP_K, KIND_HP_MN,
                        SWAP_STAGES, WS_AHEAD, WS_CANON_BUFFERS, _cdiv)

# opt-in shared memory per block on sm_90 (kMaxSmem in raw_kernels/gemm/grouped_gemm_base.cuh)
MAX_SMEM = 227 * 1024


def _canon(r: int) -> int:
    return r * BK * 2


def _raw_bytes(kind: int, r: int) -> int:
    """Raw (quantized) tile of ``r`` rows: data, then block scales (NVFP4: E4M3 bytes; MXFP8:
    fp32 factors, or fp16 ones in the fp16 window), each rounded up to 16 bytes (raw_bytes in
    grouped_gemm_base.cuh)."""
    def r16(x):
        return (x + 15) // 16 * 16

    data = r * BK // 2 if kind == KIND_FP4_K else r * BK if kind in (
        KIND_FP8_K, KIND_FP8_MN) else _canon(r)
    scale = r * BK // F.NVFP4_BLOCK if kind == KIND_FP4_K else 4 * r * BK // F.MXFP8_BLOCK \
        if kind in (KIND_FP8_K, KIND_FP8_MN) else 0
    return r16(data) + r16(scale)


def _raw_ring_bytes(a_kind: int, b_kind: int, bm: int, bn: int, nst: int = 4) -> int:
    """``nst`` raw stages of an A and a B tile, rounded up to 1 KiB (raw_ring_bytes in
    grouped_gemm_base.cuh)."""
    return _cdiv(nst * (_raw_bytes(a_kind, bm) + _raw_bytes(b_kind, bn)), 1024) * 1024


def _epi_bytes(bm: int, bn: int) -> int:
    """fp32 accumulator staging tile of the epilogue, rows padded by 8 floats (epi_bytes in
    grouped_gemm_base.cuh); it reuses the operand buffers."""
    return bm * (bn + 8) * 4


def _smem_bytes(a_kind: int, b_kind: int, bm: int, bn: int, wg: bool = False) -> int:
    """Dynamic shared memory of a tensor-core kernel (mirrors gemm_smem_bytes in
    raw_kernels/gemm/grouped_gemm_base.cuh)."""
    direct = a_kind in (KIND_HP_K, KIND_HP_MN)
    ca, cb = _canon(bm), _canon(bn)
    if direct:
        # wgmma keeps one k-tile in flight across the barrier: one stage more
        nst = (4 if ca + cb <= 40 * 1024 else 3) + (1 if wg else 0)
        main = nst * (ca + cb)
    else:
        ring = _raw_ring_bytes(a_kind, b_kind, bm, bn)
        ncb = 3 if wg and ring + 3 * (ca + cb) + 1024 <= MAX_SMEM else 2
        main = ring + ncb * (ca + cb)
        if wg and a_kind in (KIND_FP8_K, KIND_FP8_MN) and b_kind in (KIND_FP8_K, KIND_FP8_MN):
            main += bm + bn  # MXFP8: the rows' / columns' largest block codes (fp16 window)
    return max(main, _epi_bytes(bm, bn)) + 1024  # + base alignment to 1024 bytes


def _ws_smem_bytes(a_kind: int, b_kind: int) -> int:
    """Dynamic shared memory of the warp-specialised NVFP4 kernel (ws_smem_bytes in
    raw_kernels/gemm/grouped_gemm_base.cuh): WS_AHEAD + WS_CANON_BUFFERS raw stages, canonical
    buffers of the B tile only (A goes from the raw stage to wgmma registers), alignment; the
    fp32 epilogue tile reuses it."""
    bm, bn = WS_TILE
    ring = _raw_ring_bytes(a_kind, b_kind, bm, bn, WS_AHEAD + WS_CANON_BUFFERS)
    return max(ring + WS_CANON_BUFFERS * _canon(bn), _epi_bytes(bm, bn)) + 1024


#: k-tiles requested ahead by the ragged NVFP4 kernel's TMA build (WsgTmaLayout::AHEAD in
#: raw_kernels/gemm/grouped_gemm_ws_ragged_tma.cuh)
WS_G_TMA_AHEAD = 2


def _ws_g_tma_smem_bytes() -> int:
    """Dynamic shared memory of the ragged NVFP4 kernel's TMA build (``rowpair_tma_ragged``;
    ws_g_tma_smem_bytes in raw_kernels/gemm/grouped_gemm_ws_ragged_tma.cuh): WS_G_TMA_AHEAD +
    WS_CANON_BUFFERS stages -- per operand its even rows' k-tile boxes (32 bytes a row), its odd
    rows' (48) and its block scales -- rounded up to 1 KiB, the canonical B buffers (the
    epilogue is staged in one), alignment."""
    bm, bn = WS_TILE
    row = BK // 2
    stage = sum(r // 2 * (2 * row + 16) + r * BK // F.NVFP4_BLOCK for r in (bm, bn))
    ring = _cdiv((WS_G_TMA_AHEAD + WS_CANON_BUFFERS) * stage, 1024) * 1024
    return ring + WS_CANON_BUFFERS * _canon(bn) + 1024


#: k-tiles of block scales per TMA scale slot, and slots, of the warp-specialised kernel's TMA
#: build (kWsScaleTiles / kWsScaleSlots in raw_kernels/gemm/grouped_gemm_base.cuh)
WS_SCALE_TILES = 4
WS_SCALE_SLOTS = 3
WS_FRAG_STEPS = 2  # 16-byte words per consumer thread and canonical buffer of scratch (kWsFragSteps)


def _ws_tma_smem_bytes() -> int:
    """Dynamic shared memory of the warp-specialised NVFP4 kernel's TMA build (ws_tma_smem_bytes
    in raw_kernels/gemm/grouped_gemm_base.cuh): raw stages of the two data tiles only, canonical B
    buffers, then WS_SCALE_SLOTS slots of WS_SCALE_TILES k-tiles of block scales (16 bytes per
    row of A and B), a scratch region per canonical buffer (WS_FRAG_STEPS x 256 consumer
    threads x 16 bytes; the 384-thread build keeps its consumers' B-unit addresses there),
    alignment; the fp32 epilogue tile reuses it."""
    bm, bn = WS_TILE
    stages = (WS_AHEAD + WS_CANON_BUFFERS) * (bm + bn) * BK // 2
    slots = WS_SCALE_SLOTS * (bm + bn) * WS_SCALE_TILES * BK // F.NVFP4_BLOCK
    frags = WS_CANON_BUFFERS * WS_FRAG_STEPS * 16 * 256
    return max(stages + WS_CANON_BUFFERS * _canon(bn) + slots + frags, _epi_bytes(bm, bn)) + 1024


#: floats per row of a consumer warp's epilogue staging buffer in the persistent kernel
#: (kEpiWarpLd in raw_kernels/gemm/grouped_gemm_base.cuh): 64 columns and 4 of padding
EPI_WARP_LD = 68
#: ... and floats per consumer warp of its column-amax table (kEpiColTable)
EPI_COL_TABLE = 128


def _ws_p_smem_bytes() -> int:
    """Dynamic shared memory of the persistent form of the NVFP4 TMA build (ws_p_smem_bytes in
    raw_kernels/gemm/grouped_gemm_base.cuh): the TMA build's stages, canonical buffers and scale
    slots, then a 16-row staging buffer and a column-amax table per consumer warp (8) for the
    epilogue, alignment."""
    bm, bn = WS_TILE
    stages = (WS_AHEAD + WS_CANON_BUFFERS) * (bm + bn) * BK // 2
    slots = WS_SCALE_SLOTS * (bm + bn) * WS_SCALE_TILES * BK // F.NVFP4_BLOCK
    return (stages + WS_CANON_BUFFERS * _canon(bn) + slots
            + 8 * (16 * EPI_WARP_LD + EPI_COL_TABLE) * 4 + 1024)


#: the warp-specialised MXFP8 kernel (kWmx* in raw_kernels/gemm/grouped_gemm_base.cuh): raw tiles in
#: flight ahead of the expansion, canonical B buffers, k-tiles per scale slot, scale slots
WMX_AHEAD = 3
WMX_CANON_BUFFERS = 3
WMX_SCALE_TILES = 8
WMX_SCALE_SLOTS = 2
#: its raw rings: A's stages are held until the consumers retire the k-tile, B's until the
#: producers widened it (kWmxAStages, kWmxBStages)
WMX_A_STAGES = WMX_AHEAD + WMX_CANON_BUFFERS
WMX_B_STAGES = WMX_AHEAD + 1


def _ws_mx_smem_bytes() -> int:
    """Dynamic shared memory of the warp-specialised MXFP8 kernel (ws_mx_smem_bytes in
    raw_kernels/gemm/grouped_gemm_base.cuh): WMX_A_STAGES raw A tiles and WMX_B_STAGES raw B tiles of
    fp8 data, the canonical B buffers, WMX_SCALE_SLOTS slots of WMX_SCALE_TILES k-tiles of E8M0
    codes (16 bytes per row of A and B), the rows' and columns' largest codes (one byte each),
    alignment; the fp32 epilogue tile reuses the front."""
    bm, bn = WS_TILE
    stages = (WMX_A_STAGES * bm + WMX_B_STAGES * bn) * BK
    slots = WMX_SCALE_SLOTS * (bm + bn) * WMX_SCALE_TILES * BK // F.MXFP8_BLOCK
    main = stages + WMX_CANON_BUFFERS * _canon(bn) + slots + bm + bn
    return max(main, _epi_bytes(bm, bn)) + 1024


#: the persistent MXFP8 kernels' window slots (a tile's rows' and columns' largest block codes
#: and their range; kWmxWinSlot): two, or kWmxGWinSlots in the ragged form (a ring with full /
#: empty mbarriers)
WMX_WIN_SLOT = 128 + 256 + 32
#: the persistent MXFP8 kernels request copies kWmxPAhead k-tiles ahead (B's ring: one stage
#: more) and give each consumer warp its own epilogue staging buffer (kWmxEpiStaging: 8 warps x
#: 16 rows x 64 16-bit columns, rows padded by 16 bytes)
WMX_P_AHEAD = 2
WMX_EPI_STAGING = 8 * 16 * (2 * 64 + 16)


def _ws_mx_p_smem_bytes(win_slots: int = 2) -> int:
    """Dynamic shared memory of the persistent warp-specialised MXFP8 kernel (ws_mx_p_smem_bytes
    in raw_kernels/gemm/grouped_gemm_base.cuh): WMX_A_STAGES raw A tiles, WMX_P_AHEAD + 1 raw B tiles,
    the canonical buffers and scale slots of the per-tile kernel, the consumer warps' staging
    buffers, `win_slots` window slots, alignment."""
    bm, bn = WS_TILE
    stages = (WMX_A_STAGES * bm + (WMX_P_AHEAD + 1) * bn) * BK
    slots = WMX_SCALE_SLOTS * (bm + bn) * WMX_SCALE_TILES * BK // F.MXFP8_BLOCK
    return (stages + WMX_CANON_BUFFERS * _canon(bn) + slots + WMX_EPI_STAGING
            + win_slots * WMX_WIN_SLOT + 1024)


def _swap_smem_bytes(x_kind: int, w_kind: int, wide: bool = False) -> int:
    """Dynamic shared memory of the swapped-operand kernel (swap_smem_bytes in
    raw_kernels/gemm/grouped_gemm_base.cuh): raw ring, two canonical buffers (NVFP4: the token tile
    only), alignment. ``wide``: the 256-column NVFP4 TMA builds (``swap_tma_32x256``, and ``swap_tma_16x256``,
    whose 16-token tiles keep the 32-row layout)."""
    tokens, cols = SWAP_WIDE_TILE if wide else SWAP_TILE
    rs = x_kind == w_kind == KIND_FP4_K  # NVFP4: weights decoded into registers
    nst = SWAP_STAGES["nvfp4" if rs else "mxfp8"]
    ring = _raw_ring_bytes(w_kind, x_kind, cols, tokens, nst)
    return ring + 2 * ((0 if rs else _canon(cols)) + _canon(tokens)) + 1024
