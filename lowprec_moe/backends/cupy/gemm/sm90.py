"""Grouped-GEMM kernel configs for Hopper (sm_90a), their legality rules and their ranking.

Selection (:mod:`.select`) enumerates this table plus the generic one, drops every config that
cannot compute the problem (:func:`illegal`, the reason is what an explicit ``kernel=`` request
that does not fit is told), and runs the first by :func:`rank`. The families, from the few-tokens
end to the long-contraction end:

* **swap** (``wgmma`` with the weights on M, tokens on N; 32 tokens x 128 output columns per CTA,
  several CTAs per SM): M-grouped GEMMs on quantized K-major operands with at most 32 tokens per
  expert. NVFP4 loads its data with TMA when one tensor map covers every expert, in the wide
  32 x 256 form when that grid still gives every SM four CTAs, with 16-token tiles
  (``m64n16k16``) when no expert has more.
* **plain** (every warp copies, converts and multiplies; 128 x 256 or 64 x 256): bf16 / fp16, MXFP8
  where the warp-specialised kernel does not apply, and the 64-row tile for few tokens.
* **ws** (warp-specialised, 128 x 256): producers copy both quantized tiles and widen B, consumers
  decode A straight into wgmma registers. NVFP4: a 384-thread TMA build on ``m64n256k16`` (one
  tensor map per operand), its persistent form (one CTA per SM over all tiles, the next tile's
  copies under this tile's epilogue) with more tiles than SMs, the ragged persistent row-pair
  TMA build for wgrad of uneven experts, and the 512-thread cp.async build for everything else.
  MXFP8: a 512-thread TMA build and its persistent form.

Every config of one format and MMA family multiplies the same canonical values with the same
instruction sequence per output, so the split-dependent choice never changes results (grouped
== per-expert, bitwise). The exception is MXFP8, whose tiles multiply on fp16 when their block
scales fit the fp16 window: bits are those of the bf16 path except for blocks below ~1e-35,
where they depend on which tiles a launch forms (see ``docs/NUMERICS.md``).
"""

from __future__ import annotations

from lowprec_moe.backends.cupy.gemm.configs import KernelConfig, f16_arg, kind_args, operand_kinds
from lowprec_moe.backends.cupy.gemm.plan import SWAP_TILE, SWAP_WIDE16_TILE, SWAP_WIDE_TILE, THREADS, WS_N256_THREADS, WS_THREADS, WS_TILE
from lowprec_moe.backends.cupy.gemm.rules import PERSIST_MX_MAX_KTILES, Facts, pick_small_tile, swap_tile_fits
from lowprec_moe.backends.cupy.gemm.smem import (_smem_bytes, _swap_smem_bytes, _ws_g_tma_smem_bytes, _ws_mx_p_smem_bytes,
                   _ws_mx_smem_bytes, _ws_p_smem_bytes, _ws_smem_bytes, _ws_tma_smem_bytes)
from lowprec_moe.backends.cupy.gemm import configs as _configs

_MX_MN = {"kk": ("false", "false"), "kn": ("false", "true"), "nn": ("true", "true")}


def _plain(fmt, layout, bm, chunk=16):
    a, b = operand_kinds(fmt, layout)
    ka, kb = kind_args(fmt, layout)
    return KernelConfig(
        "sm90", fmt, layout, "wgmma", "plain", "cpasync", "tile", bm, 256, THREADS, chunk,
        _smem_bytes(a, b, bm, 256, True), f"grouped_gemm_sm90_{fmt}", "LPM_GG_DEFINE_WG",
        (str(bm), ka, kb, f16_arg(fmt), str(chunk)),
        f"lpm_gg::gemm_smem_bytes({ka}, {kb}, {bm}, 256, true)", "lpm_gg::kThreads")


def _swap(fmt, loader, tile, chunk=16):
    a, b = operand_kinds(fmt, "kk")
    ka, kb = kind_args(fmt, "kk")
    wide = tile != SWAP_TILE
    mw = 2 if wide else 1
    if loader == "cpasync":
        macro, args, min_ctas = "LPM_GG_DEFINE_SWAP", (ka, kb, f16_arg(fmt), str(chunk)), (
            3 if fmt == "nvfp4" else 2)
        args += (str(min_ctas),)
    elif not wide:
        macro, args, min_ctas = "LPM_GG_DEFINE_SWAP_TMA", (ka, kb, f16_arg(fmt), "3"), 3
    else:
        macro = "LPM_GG_DEFINE_SWAP_TMA_WIDE16" if tile == SWAP_WIDE16_TILE else \
            "LPM_GG_DEFINE_SWAP_TMA_WIDE"
        args, min_ctas = (ka, kb, f16_arg(fmt)), 2
    return KernelConfig(
        "sm90", fmt, "kk", "wgmma", "swap", loader, "tile", tile[0], tile[1], THREADS, chunk,
        _swap_smem_bytes(a, b, wide=wide), f"grouped_gemm_sm90_{fmt}", macro, args,
        f"lpm_gg::swap_smem_bytes({ka}, {kb}, {mw})", "lpm_gg::kThreads", min_ctas)


def _nvfp4_ws(loader, schedule, chunk=16):
    ka, kb = kind_args("nvfp4", "kk")
    bm, bn = WS_TILE
    if loader == "cpasync":
        return KernelConfig(
            "sm90", "nvfp4", "kk", "wgmma", "ws", loader, schedule, bm, bn, WS_THREADS, chunk,
            _ws_smem_bytes(*operand_kinds("nvfp4", "kk")), "grouped_gemm_sm90_nvfp4_ws",
            "LPM_GG_DEFINE_WS", (ka, kb, "true", str(chunk)),
            f"lpm_gg::ws_smem_bytes({ka}, {kb})", "lpm_gg::kWsThreads")
    if loader == "rowpair_tma":
        return KernelConfig(
            "sm90", "nvfp4", "kk", "wgmma", "ws", loader, schedule, bm, bn, WS_THREADS, chunk,
            _ws_g_tma_smem_bytes(), "grouped_gemm_sm90_nvfp4_ws_ragged", "LPM_GG_DEFINE_WS_H",
            (str(chunk),), "lpm_gg::ws_g_tma_smem_bytes()", "lpm_gg::kWsThreads")
    if schedule == "persistent":
        return KernelConfig(
            "sm90", "nvfp4", "kk", "wgmma", "ws", loader, schedule, bm, bn, WS_N256_THREADS,
            chunk, _ws_p_smem_bytes(), "grouped_gemm_sm90_nvfp4_ws", "LPM_GG_DEFINE_WS_NP", (),
            "lpm_gg::ws_p_smem_bytes()", "lpm_gg::kWnThreads")
    return KernelConfig(
        "sm90", "nvfp4", "kk", "wgmma", "ws", loader, schedule, bm, bn, WS_N256_THREADS, chunk,
        _ws_tma_smem_bytes(), "grouped_gemm_sm90_nvfp4_ws", "LPM_GG_DEFINE_WS_N256", (),
        "lpm_gg::ws_tma_smem_bytes()", "lpm_gg::kWnThreads")


def _mxfp8_ws(layout, schedule):
    bm, bn = WS_TILE
    persistent = schedule == "persistent"
    return KernelConfig(
        "sm90", "mxfp8", layout, "wgmma", "ws", "tma", schedule, bm, bn, WS_THREADS, 16,
        _ws_mx_p_smem_bytes() if persistent else _ws_mx_smem_bytes(),
        "grouped_gemm_sm90_mxfp8_ws" + ("_persistent" if persistent else ""),
        "LPM_GG_DEFINE_WS_MX_P" if persistent else "LPM_GG_DEFINE_WS_MX", _MX_MN[layout],
        "lpm_gg::ws_mx_p_smem_bytes()" if persistent else "lpm_gg::ws_mx_smem_bytes()",
        "lpm_gg::kWsThreads")


def _table() -> tuple[KernelConfig, ...]:
    out = []
    for fmt in ("bf16", "fp16", "mxfp8"):
        for layout in ("kk", "kn", "nn"):
            out += [_plain(fmt, layout, 128)] + ([_plain(fmt, layout, 64)] if layout != "nn" else [])
    out.append(_swap("mxfp8", "cpasync", SWAP_TILE))
    for layout in ("kk", "kn", "nn"):
        out += [_mxfp8_ws(layout, "tile"), _mxfp8_ws(layout, "persistent")]
    for chunk in (16, 8):
        out += [_plain("nvfp4", "kk", 64, chunk), _swap("nvfp4", "cpasync", SWAP_TILE, chunk),
                _nvfp4_ws("cpasync", "tile", chunk), _nvfp4_ws("rowpair_tma", "ragged", chunk)]
    out += [_swap("nvfp4", "tma", SWAP_TILE), _swap("nvfp4", "tma", SWAP_WIDE_TILE),
            _swap("nvfp4", "tma", SWAP_WIDE16_TILE), _nvfp4_ws("tma", "tile"),
            _nvfp4_ws("tma", "persistent")]
    return tuple(out)


#: Every Hopper config.
CONFIGS: tuple[KernelConfig, ...] = _table()

#: The ragged row-pair TMA build's map builder, a helper kernel of its module.
PAIR_MAPS_MODULE = "grouped_gemm_sm90_nvfp4_ws_ragged"
PAIR_MAPS_KERNEL = "grouped_gemm_sm90_nvfp4_rowpair_maps"
_configs.EXTRA_ENTRIES[PAIR_MAPS_MODULE] = (f"LPM_GG_DEFINE_WS_H_MAPS({PAIR_MAPS_KERNEL})",)
#: The block-code range kernel the warp-specialised MXFP8 configs read (:mod:`.ranges`).
RANGES_MODULE = "grouped_gemm_sm90_mxfp8_ranges"
RANGES_KERNEL = "grouped_gemm_sm90_mxfp8_block_code_ranges"
_configs.EXTRA_ENTRIES[RANGES_MODULE] = (f"LPM_GG_DEFINE_MX_RANGES({RANGES_KERNEL})",)


def illegal(c: KernelConfig, f: Facts) -> str | None:
    """Why Hopper config ``c`` cannot compute problem ``f`` (None: it can)."""
    if f.cc != (9, 0):
        return f"it needs an sm_90 GPU (wgmma), this one is sm_{f.cc[0]}{f.cc[1]}"
    if c.fmt != f.fmt or c.layout != f.layout:
        return f"it multiplies {c.fmt} operands in layout {c.layout}"
    if c.chunk > f.chunk:
        return f"it copies {c.chunk}-byte chunks, the operands allow {f.chunk}"
    if c.chunk == 8 and f.chunk != 8:
        return "its 8-byte copies are only for rows that allow no 16-byte copy"
    if c.role == "swap":
        if f.mode == "wgrad" or not f.quantized_k:
            return "the swapped-operand kernels take M-grouped GEMMs on K-major quantized operands"
        if f.rows_max > c.bm or not swap_tile_fits(f):
            return f"an expert has more than {min(c.bm, 32)} tokens"
        if c.fmt == "nvfp4" and not f.scales_word_aligned:
            return "NVFP4 block-scale rows of a k-tile are not 4-byte aligned"
        if c.tma and not (f.swap_wide_tma if c.bn == 256 else f.swap_tma):
            return "no single tensor map covers every expert's rows"
        return None
    if c.role == "ws" and c.fmt == "nvfp4":
        if c.loader == "tma":
            if not f.ws_tma:
                return "data and block scales need one 16-byte row stride and one contraction"
            if c.persistent and not f.nvfp4_persistent_ok:
                return "the contraction is not a whole number of scale groups"
        if c.loader == "rowpair_tma":
            if not f.pair_tma:
                return "an expert's rows cannot be mapped in pairs"
            if not (f.reg_epilogue and f.ragged_words_ok):
                return "it needs 16-bit output without bias or accumulation and int32 strides"
        return None
    if c.role == "ws" and c.fmt == "mxfp8":
        if not f.ws_tma:
            return "data and block scales need one 16-byte row stride per operand"
        if c.persistent and not f.mxfp8_persistent_ok:
            return ("it needs one contraction of whole scale groups and 16-bit output without "
                    "bias or accumulation")
        return None
    return None


def rank(c: KernelConfig, f: Facts) -> tuple:
    """Sort key of a legal config on Hopper (lower runs first).

    1. The tile family the problem's shape asks for: swap for few tokens per expert, the 64-row
       tile where the per-tile cost model favours it, otherwise the 128-row family (always
       for wgrad).
    2. Within it, whether the config's own preference holds (persistent forms want more tiles
       than SMs, the wide swap build a full grid, MXFP8's warp-specialised wgrad a long
       contraction, the ragged NVFP4 build wgrad with more tiles than SMs).
    3. A fixed order: TMA and persistent builds before cp.async and per-tile ones.
    4. The wider copy chunk.
    The generic configs (``mma.sync``, SIMT) rank after every Hopper config.
    """
    if c.arch != "sm90":
        return (1,) if not c.simt else (2,)
    return (0, _family(c) != _wanted_family(f), not _preferred(c, f), _ORDER[_kind(c)],
            -c.chunk)


def _wanted_family(f: Facts) -> str:
    if f.mode == "wgrad":
        return "large"
    if f.quantized_k and swap_tile_fits(f) and (f.fmt != "nvfp4" or f.scales_word_aligned):
        return "swap"
    return "small" if pick_small_tile(f, 64) != 128 else "large"


def _family(c: KernelConfig) -> str:
    return "swap" if c.role == "swap" else "small" if c.bm == 64 else "large"


def _kind(c: KernelConfig) -> str:
    return f"{c.role}_{c.loader}_{c.schedule}_{c.bn}_{c.bm}"


#: Fixed order within a family (lower first).
_ORDER = {
    "swap_tma_tile_256_16": 0, "swap_tma_tile_256_32": 1, "swap_tma_tile_128_32": 2,
    "swap_cpasync_tile_128_32": 3,
    "ws_tma_persistent_256_128": 0, "ws_tma_tile_256_128": 1, "ws_rowpair_tma_ragged_256_128": 2,
    "ws_cpasync_tile_256_128": 3, "plain_cpasync_tile_256_128": 4,
    "plain_cpasync_tile_256_64": 0,
}


def _preferred(c: KernelConfig, f: Facts) -> bool:
    if c.role == "swap" and c.bn == 256:
        return f.swap_wide
    if c.role != "ws":
        return True
    if c.fmt == "mxfp8":
        long_enough = f.layout != "nn" or f.long_wgrad
        if c.persistent:
            return (long_enough and f.tiles_128x256 > f.sms
                    and (f.mode != "fprop" or f.ktiles <= PERSIST_MX_MAX_KTILES))
        return long_enough
    if c.schedule == "persistent":
        return f.tiles_128x256 > f.sms
    if c.schedule == "ragged":
        return f.mode == "wgrad" and bool((f.pl.length > 0).any()) and f.tiles_128x256 > f.sms
    return True
