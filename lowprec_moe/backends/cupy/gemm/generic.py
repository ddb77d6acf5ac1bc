"""Grouped-GEMM kernel configs for every GPU: the ``mma.sync`` tensor-core kernels (sm_80 on)
and the fp32 SIMT kernel, with their legality rules and ranking.

On Hopper these run only when asked for by name (cross-checks) or, the SIMT kernel, when no
tensor-core kernel can stream the operands (float32 operands, rows that allow no 16-byte copy);
elsewhere they are the whole table. Within the ``mma.sync`` family every tile gives each output
the same products in the same order, so the split-dependent tile choice never changes results.
"""

from __future__ import annotations

from lowprec_moe.backends.cupy.gemm.configs import KernelConfig, f16_arg, kind_args, operand_kinds
from lowprec_moe.backends.cupy.gemm.plan import SIMT_TILE, THREADS
from lowprec_moe.backends.cupy.gemm.rules import Facts, pick_small_tile
from lowprec_moe.backends.cupy.gemm.smem import _smem_bytes

#: The SIMT kernel (``raw_kernels/gemm/grouped_gemm_simt.cu``): any format and layout, fp32 operand
#: values, non-flushing fma accumulation -- the fp32-accurate path.
SIMT = KernelConfig("any", "any", "any", "simt", "plain", "cpasync", "tile", SIMT_TILE,
                    SIMT_TILE, THREADS, 0, 0, "grouped_gemm_simt", "")

#: Rows of the two mma.sync CTA tiles and their warp arrangement (warps along M).
_MMA_TILES = ((128, 2), (32, 1))


def _mma(fmt: str, layout: str, bm: int, warps_m: int, chunk: int = 16) -> KernelConfig:
    a, b = operand_kinds(fmt, layout)
    ka, kb = kind_args(fmt, layout)
    return KernelConfig(
        "sm80", fmt, layout, "mma", "plain", "cpasync", "tile", bm, 256, THREADS, chunk,
        _smem_bytes(a, b, bm, 256, False), f"grouped_gemm_sm80_{fmt}", "LPM_GG_DEFINE",
        (str(bm), "256", str(warps_m), ka, kb, f16_arg(fmt), str(chunk)),
        f"lpm_gg::gemm_smem_bytes({ka}, {kb}, {bm}, 256, false)", "lpm_gg::kThreads")


def _table() -> tuple[KernelConfig, ...]:
    out = []
    for fmt in ("bf16", "fp16", "mxfp8"):
        for layout in ("kk", "kn", "nn"):
            for bm, wm in _MMA_TILES:
                if layout == "nn" and bm != 128:
                    continue  # wgrad always takes the 128-row tile
                out.append(_mma(fmt, layout, bm, wm))
    for chunk in (16, 8):
        for bm, wm in _MMA_TILES:
            out.append(_mma("nvfp4", "kk", bm, wm, chunk))
    return tuple(out) + (SIMT,)


#: Every config of this file.
CONFIGS: tuple[KernelConfig, ...] = _table()


def illegal(c: KernelConfig, f: Facts) -> str | None:
    """Why config ``c`` cannot compute problem ``f`` (None: it can)."""
    if c.simt:
        return None
    if c.fmt != f.fmt or c.layout != f.layout:
        return f"it multiplies {c.fmt} operands in layout {c.layout}"
    if c.chunk > f.chunk:
        return f"it copies {c.chunk}-byte chunks, the operands allow {f.chunk}"
    if f.cc < (8, 0):
        return "mma.sync needs sm_80 or newer"
    return None


def rank(c: KernelConfig, f: Facts) -> tuple:
    """Sort key of a legal config on a GPU without wgmma (lower runs first): the tile the
    problem's splits favour, then the widest copy, the SIMT kernel last."""
    if c.simt:
        return (2,)
    want = pick_small_tile(f, 32) if f.mode != "wgrad" else 128
    return (0, c.bm != want, -c.chunk)
