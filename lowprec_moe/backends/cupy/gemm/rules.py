"""What kernel selection knows about one planned grouped GEMM (:class:`Facts`), and the rules
the config tables test it with. Host-only: no CuPy needed, so the selection is testable on the
CPU with the device capabilities passed in.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from lowprec_moe import formats as F
from lowprec_moe.backends.cupy.gemm.plan import BK, KIND_FP4_K, KIND_FP8_K, Operand, Plan, SWAP_TILE, SWAP_WIDE_TILE, WS_TILE, _cdiv
from lowprec_moe.backends.cupy.gemm.smem import WMX_SCALE_TILES, WS_SCALE_TILES
from lowprec_moe.backends.cupy.gemm import tma_rules as T

#: CTAs of the wide swapped-operand build per SM (two resident, two waves) from which it is
#: preferred: below that, the 128-column build's twice as many CTAs fill the GPU better.
SWAP_WIDE_MIN_CTAS_PER_SM = 4
#: MXFP8 wgrad prefers the warp-specialised kernel only when its non-empty experts contract at
#: least this many tokens on average (below, the plain kernel is as fast or faster).
MXFP8_WS_WGRAD_MIN_LEN = 512
#: Longest contraction (k-tiles) for which MXFP8 fprop prefers the persistent form: its k-loop
#: costs a little more per k-tile, which longer contractions do not win back (dgrad and wgrad
#: prefer it at any length).
PERSIST_MX_MAX_KTILES = 16


def chunk_bytes(op: Operand, extent_elems: np.ndarray) -> int:
    """Largest cp.async chunk (16 or 8 bytes) every copy of ``op`` can use, or 0.

    ``extent_elems``: per expert, the number of elements along the operand's contiguous dimension
    (contraction length when K-major, rows when MN-major): a chunk must never straddle it.
    """
    extent = np.asarray(extent_elems, np.int64) * op.es_num
    if np.any(extent % op.es_den):
        return 0
    extent //= op.es_den
    for ch in (16, 8):
        if T._ptr(op.data) % ch:
            continue
        if np.any(op.off % ch) or np.any(op.ld % ch) or np.any(extent % ch):
            continue
        return ch
    return 0


def num_tiles(pl: Plan, bm: int, bn: int) -> int:
    """Output tiles of a launch with bm x bn tiles: row tiles of every expert with rows, times
    the column tiles."""
    rows = pl.rows[pl.rows > 0]
    return int(np.sum(_cdiv(rows, bm))) * int(_cdiv(pl.n_cols, bn))


@dataclass
class Facts:
    """One problem as the selector sees it.

    ``p``: the validated problem; ``pl``: its plan; ``cc``, ``optin``, ``sms``: the device's
    compute capability, opt-in shared memory per block and multiprocessor count.
    """

    p: object
    pl: Plan
    cc: tuple
    optin: int
    sms: int

    @cached_property
    def fmt(self) -> str:
        """``bf16`` / ``fp16`` / ``fp32`` / ``mxfp8`` / ``nvfp4``."""
        p = self.p
        if p.fmt != "hp":
            return p.fmt
        return {"bfloat16": "bf16", "float16": "fp16"}.get(p.hp_dtype, "fp32")

    @property
    def mode(self) -> str:
        return self.p.mode

    @cached_property
    def layout(self) -> str:
        return ("n" if self.pl.a.mn else "k") + ("n" if self.pl.b.mn else "k")

    @cached_property
    def chunk(self) -> int:
        """The largest cp.async chunk both operands allow (0: none)."""
        pl = self.pl
        a_ext = pl.rows if pl.a.mn else pl.length
        b_ext = np.full(len(pl.rows), pl.n_cols, np.int64) if pl.b.mn else pl.length
        return min(chunk_bytes(pl.a, a_ext), chunk_bytes(pl.b, b_ext))

    @cached_property
    def rows_max(self) -> int:
        return int(self.pl.rows.max()) if len(self.pl.rows) else 0

    @cached_property
    def quantized_k(self) -> bool:
        """Both operands quantized and contraction-contiguous."""
        return all(op.kind in (KIND_FP4_K, KIND_FP8_K) for op in (self.pl.a, self.pl.b))

    @cached_property
    def ktiles(self) -> int:
        """k-tiles of the first expert's contraction."""
        return -(-int(self.pl.length[0]) // BK) if len(self.pl.length) else 0

    @cached_property
    def tiles_128x256(self) -> int:
        return num_tiles(self.pl, *WS_TILE)

    # ---- legality ----------------------------------------------------------------------
    @cached_property
    def scales_word_aligned(self) -> bool:
        return T._scales_word_aligned(self.pl.a) and T._scales_word_aligned(self.pl.b)

    @cached_property
    def swap_tma(self) -> bool:
        return T._use_tma(self.pl)

    @cached_property
    def swap_wide_tma(self) -> bool:
        return T._use_tma(self.pl, wide=True)

    @cached_property
    def ws_tma(self) -> bool:
        return T._use_ws_tma(self.pl, ragged=self.layout == "nn" and self.fmt == "mxfp8")

    @cached_property
    def pair_tma(self) -> bool:
        return T._use_pair_tma(self.pl)

    @cached_property
    def reg_epilogue(self) -> bool:
        """The persistent kernels' register epilogue applies: 16-bit output without bias, whole
        8-column groups, a 16-byte aligned output buffer (or one the launcher allocates) and no
        accumulation."""
        p = self.p
        out_ok = p.out is None or T._ptr(p.out) % 16 == 0
        return (p.out_dtype in ("bfloat16", "float16") and p.bias is None and not p.accumulate
                and self.pl.n_cols % 8 == 0 and out_ok)

    @cached_property
    def nvfp4_persistent_ok(self) -> bool:
        """A whole, nonzero number of scale groups per tile (a group of block scales never
        straddles two tiles)."""
        kt = self.ktiles
        return kt > 0 and kt % WS_SCALE_TILES == 0

    @cached_property
    def mxfp8_persistent_ok(self) -> bool:
        """One contraction length of whole k-tiles and whole scale groups, K-major scale rows
        of whole 16-byte chunks (the window scan's unit), and the register epilogue."""
        pl = self.pl
        if not len(pl.length) or np.any(pl.length != pl.length[0]):
            return False
        kt = self.ktiles
        if kt == 0 or kt % WMX_SCALE_TILES or int(pl.length[0]) % BK:
            return False
        blocks = -(-int(pl.length[0]) // F.MXFP8_BLOCK)
        if (not pl.a.mn or not pl.b.mn) and blocks % 16:
            return False
        return self.reg_epilogue

    @cached_property
    def ragged_words_ok(self) -> bool:
        """Row strides and contraction lengths fit the ragged kernel's int32 words."""
        pl = self.pl
        words = (pl.a.ld, pl.b.ld, pl.a.sld, pl.b.sld, pl.length)
        return not any(np.any(np.asarray(w, np.int64) >= 2**31) for w in words)

    # ---- preferences ---------------------------------------------------------------------
    @cached_property
    def swap_wide(self) -> bool:
        """The wide swapped-operand grid gives every SM at least SWAP_WIDE_MIN_CTAS_PER_SM
        CTAs."""
        bt, bw = SWAP_WIDE_TILE
        rows = self.pl.rows[self.pl.rows > 0]
        ctas = int(np.sum(_cdiv(rows, bt))) * int(_cdiv(self.pl.n_cols, bw))
        return ctas >= SWAP_WIDE_MIN_CTAS_PER_SM * self.sms

    @cached_property
    def long_wgrad(self) -> bool:
        """The non-empty experts contract at least MXFP8_WS_WGRAD_MIN_LEN tokens on average."""
        length = self.pl.length[self.pl.length > 0]
        return bool(length.size) and float(length.mean()) >= MXFP8_WS_WGRAD_MIN_LEN


def pick_small_tile(f: Facts, small: int) -> int:
    """128 or ``small`` rows per CTA for an M-grouped GEMM: model each row tile as costing its
    rows of MMA work plus a fixed cost for streaming / expanding its B tile (half a 128-row
    tile)."""
    r = f.pl.rows[f.pl.rows > 0]
    if r.size == 0:
        return 128
    cost_l = float(np.sum(_cdiv(r, 128))) * (128 + 64)
    cost_s = float(np.sum(_cdiv(r, small))) * (small + 64)
    return small if cost_s < cost_l else 128


def swap_tile_fits(f: Facts) -> bool:
    """No expert has more tokens than the swapped-operand tile: each of its CTAs expands 128
    weight rows for up to 32 tokens, so for a few tokens per expert it wastes no MMA work and
    several CTAs share an SM."""
    return bool(len(f.pl.rows)) and f.rows_max <= SWAP_TILE[0]
