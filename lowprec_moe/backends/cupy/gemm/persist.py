"""Persistent-form policy of the grouped-GEMM kernel choice (:mod:`lowprec_moe.backends.cupy.gemm.choice`):
when a warp-specialised launch runs one CTA per multiprocessor over many tiles instead of one
CTA per tile -- NVFP4 ``_kk_o`` / ``_kk_z``, MXFP8 ``_kk_o`` / ``_kn_o`` / ``_nn_o`` and, for
wgrad of uneven experts, ``_nn_g`` and NVFP4's ``_kk_g`` -- and the environment overrides'
parser. Host-only;
re-exported by :mod:`lowprec_moe.backends.cupy.gemm.choice` and :mod:`lowprec_moe.backends.cupy.gemm.launch`.
"""

from __future__ import annotations

import os

import numpy as np

from lowprec_moe import formats as F
from .plan import BK, CONFIGS, Plan, _cdiv
from .smem import WMX_SCALE_TILES, WS_SCALE_TILES
from .tma_rules import _ptr

#: Environment variable for the persistent forms of the warp-specialised NVFP4 TMA build
#: (``_kk_o`` of the 384-thread ``_kk_q``, ``_kk_z`` of ``_kk_y``; one CTA per SM over many
#: tiles), of its cp.async build (``_kk_g``, wgrad of uneven experts) and of the
#: warp-specialised MXFP8 kernel (``_kk_o`` / ``_kn_o`` / ``_nn_o``; with "on" also ``_nn_g``
#: for wgrad of uneven experts): "auto"
#: (default: more tiles than multiprocessors and, ``_kk_z``, at most PERSIST_MAX_KTILES k-tiles
#: per tile, MXFP8 fprop at most PERSIST_MX_MAX_KTILES), "on" (wherever it applies) or "off"
#: (one CTA per tile).
PERSIST_ENV = "LOWPREC_MOE_GEMM_PERSIST"
_PERSIST_MODES = ("auto", "on", "off")
#: Longest contraction (k-tiles) that "auto" runs in the 512-thread persistent form ``_kk_z``
#: (only with ``LOWPREC_MOE_GEMM_WS_N256=off``; the alternative is ``_kk_y``): it saves the
#: per-tile start and hides the epilogue, which matters on short contractions (fine wgrad, 8
#: k-tiles: +6-7 % over ``_kk_q``), while on longer ones the one-CTA-per-tile builds measured
#: faster (qwen-fc2 fprop, 16: ``_kk_q`` 0.7-1.4 %; ``_kk_y`` won on 40 k-tiles and more;
#: benchmarks/RESULTS.md). Measured before ``_kk_z``'s producers stopped dividing by the
#: contraction per copy request, which made it faster (fine wgrad 4 %); not re-measured since.
PERSIST_MAX_KTILES = 8
#: ... and of the 384-thread one, ``_kk_o``: None, any length. It saves ~3 us of each tile's
#: start and drain (fprop K sweep on the H200: 4 k-tiles per tile 36 % faster than ``_kk_q``,
#: 8 15 %) and, since its producers stopped dividing by the contraction per copy request, runs
#: its k-tiles as fast as ``_kk_q`` (A/B: 2-6 % faster at 32 to 112 k-tiles, 10 % at 16, 16 %
#: on fine wgrad at 8; benchmarks/RESULTS.md).
PERSIST_N256_MAX_KTILES = None
#: Longest contraction (k-tiles) that "auto" runs in the persistent MXFP8 fprop form
#: (``_kk_o``): its k-loop runs a tile's k-tiles at an offset in the CTA's sequence, which costs
#: ~13 % more instructions per k-tile than the per-tile kernel's, while the saved tile starts and
#: hidden epilogues weigh more on short contractions (H200, persistent / per-tile time: 8
#: k-tiles, fine wgrad, 0.80; 16 k-tiles, qwen-fc2 fprop 0.960 and 0.976 in two runs; from 32
#: k-tiles fprop 1.01-1.06). dgrad and wgrad (``_kn_o``, ``_nn_o``: B MN-major) take it at any
#: length: from 32 k-tiles dgrad 0.971-1.000 and wgrad 0.975-1.002 in two sessions' A/B
#: (benchmarks/RESULTS.md).
PERSIST_MX_MAX_KTILES = 16

def _env_mode(name: str, modes: tuple) -> str:
    """The value of environment variable `name` (lower case; unset or empty: "auto"), or a
    ValueError naming it when it is not one of `modes`."""
    v = os.environ.get(name, "auto").strip().lower() or "auto"
    if v not in modes:
        raise ValueError(f"{name}={v!r} must be one of {modes}")
    return v



def _persist(pl: Plan, sms: int, n256: bool) -> bool:
    """Whether an NVFP4 problem that takes the ``_kk_y`` build (``n256``: its 384-thread form
    ``_kk_q``) runs persistently, ``_kk_z`` (``_kk_o``; see PERSIST_ENV): it needs the
    contraction (one length for every expert, which ``_kk_y`` already requires) to be a whole,
    nonzero number of scale groups (``WS_SCALE_TILES`` k-tiles), so that a group of block
    scales never straddles two tiles."""
    mode = _env_mode(PERSIST_ENV, _PERSIST_MODES)
    kt = -(-int(pl.length[0]) // BK) if len(pl.length) else 0
    if mode == "off" or kt == 0 or kt % WS_SCALE_TILES:
        return False
    longest = PERSIST_N256_MAX_KTILES if n256 else PERSIST_MAX_KTILES
    return mode == "on" or ((longest is None or kt <= longest)
                            and num_tiles(pl, *CONFIGS["x"]) > sms)


def _persist_mx(p, pl: Plan, sms: int) -> bool:
    """Whether an MXFP8 problem that takes the warp-specialised kernel (``_kk_y``, ``_kn_y``,
    ``_nn_y``) runs in its persistent form (``_kk_o``, ``_kn_o``, ``_nn_o``; see PERSIST_ENV):
    one contraction length for every expert, a whole, nonzero number of scale groups
    (``WMX_SCALE_TILES`` k-tiles) per tile, no partial k-tile, K-major scale rows of whole
    16-byte chunks, and an epilogue the kernel runs from registers --
    16-bit output without bias, whole 8-column groups, a 16-byte aligned output buffer (or one
    the launcher allocates) and no accumulation."""
    mode = _env_mode(PERSIST_ENV, _PERSIST_MODES)
    if mode == "off" or not len(pl.length) or np.any(pl.length != pl.length[0]):
        return False
    kt = -(-int(pl.length[0]) // BK)
    if kt == 0 or kt % WMX_SCALE_TILES or int(pl.length[0]) % BK:  # whole k-tiles
        return False
    # K-major scale rows of whole 16-byte chunks (the window scan's rule, mx_scan_aligned:
    # the kernel's launch-wide staging mode must be every tile's; the TMA build already aligns
    # the rows)
    blocks = -(-int(pl.length[0]) // F.MXFP8_BLOCK)
    if (not pl.a.mn or not pl.b.mn) and blocks % 16:
        return False
    if not _reg_epilogue_ok(p, pl):
        return False
    length_ok = p.mode != "fprop" or kt <= PERSIST_MX_MAX_KTILES
    return mode == "on" or (length_ok and num_tiles(pl, *CONFIGS["x"]) > sms)


def _reg_epilogue_ok(p, pl: Plan) -> bool:
    """Whether the persistent MXFP8 kernels can run a problem's epilogue from registers: 16-bit
    output without bias, whole 8-column groups, a 16-byte aligned output buffer (or one the
    launcher allocates) and no accumulation."""
    out_ok = p.out is None or _ptr(p.out) % 16 == 0
    return (p.out_dtype in ("bfloat16", "float16") and p.bias is None and not p.accumulate
            and pl.n_cols % 8 == 0 and out_ok)


def _persist_ragged(p, pl: Plan, sms: int) -> bool:
    """Whether an MXFP8 wgrad problem that takes the warp-specialised kernel (``_nn_y``) but not
    its persistent form (experts of different contraction lengths, or of a length that is not
    a whole number of scale groups) runs in the ragged persistent form ``_nn_g``: only when
    PERSIST_ENV is "on" (and its epilogue runs from registers, :func:`_reg_epilogue_ok`).
    "auto" keeps the per-tile kernel: on the H200 ``_nn_g`` measured 1.06-1.09x the per-tile
    time on the skewed wgrad split, and 1.11-1.15x ``_nn_o``'s on uniform 8-k-tile experts
    (benchmarks/RESULTS.md)."""
    mode = _env_mode(PERSIST_ENV, _PERSIST_MODES)
    return mode == "on" and _reg_epilogue_ok(p, pl)


#: Longest mean contraction (k-tiles, over the experts that have tokens) for which "auto" runs
#: NVFP4 wgrad on the cp.async build in its ragged persistent form ``_kk_g``: it saves each
#: tile's start and hides its epilogue, but its producers' k-loop is ~7 % slower per k-tile
#: than the per-tile build's. H200, 32 experts of L tokens (ragged / per-tile time): 8 k-tiles
#: 0.93, 32 k-tiles 1.04, 96 k-tiles 1.07; the skewed split (mean 10.7 k-tiles) 0.97, 16 tokens
#: per expert 0.70 (benchmarks/RESULTS.md). Its TMA build ``_kk_h`` has no such limit: faster
#: than the per-tile build at every length measured (8 to 96 k-tiles: 0.72-0.84).
PERSIST_RAGGED_FP4_MAX_KTILES = 16


def _persist_ragged_fp4(p, pl: Plan, sms: int, tma: bool = False) -> bool:
    """Whether an NVFP4 problem that takes the warp-specialised kernel's cp.async build
    (``_kk_x`` / ``_kk_x8``: no tensor map covers its experts, as in wgrad of uneven splits)
    runs in its ragged persistent form ``_kk_g`` / ``_kk_g8`` (see PERSIST_ENV): "on" wherever
    its epilogue runs from registers (:func:`_reg_epilogue_ok`) and its row strides and
    contraction lengths fit in int32, "auto" for wgrad with more tiles than multiprocessors
    and a mean contraction of at most PERSIST_RAGGED_FP4_MAX_KTILES k-tiles -- of any length
    when it would run its TMA build (``tma``: ``_kk_h``)."""
    mode = _env_mode(PERSIST_ENV, _PERSIST_MODES)
    if mode == "off" or not _reg_epilogue_ok(p, pl):
        return False
    words = (pl.a.ld, pl.b.ld, pl.a.sld, pl.b.sld, pl.length)
    if any(np.any(np.asarray(w, np.int64) >= 2**31) for w in words):
        return False
    if mode == "on":
        return True
    length = pl.length[pl.length > 0]
    short = bool(length.size) and (
        tma or float(np.mean(-(-length // BK))) <= PERSIST_RAGGED_FP4_MAX_KTILES)
    return p.mode == "wgrad" and short and num_tiles(pl, *CONFIGS["x"]) > sms


def num_tiles(pl: Plan, bm: int, bn: int) -> int:
    """Output tiles of a launch with bm x bn tiles: row tiles of every expert with rows, times
    the column tiles."""
    rows = pl.rows[pl.rows > 0]
    return int(np.sum(_cdiv(rows, bm))) * int(_cdiv(pl.n_cols, bn))
