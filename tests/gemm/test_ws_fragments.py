"""The MN-major A fragments of the warp-specialised MXFP8 wgrad build (``_nn_y``,
raw_kernels/gemm/grouped_gemm_ws_mx.cuh), emulated on the CPU: the raw panel as TMA stores it (64
contraction lines of 128 bytes, 128-byte swizzle), the consumers' ``ldmatrix.x4.trans``
addresses, the PTX fragment layout of ``ldmatrix .trans`` on 16-bit elements, the two byte
selectors per step, and ``frag_row``'s map from fragment rows to tile rows.

Checked for every lane of every consumer warp: the four bytes each decode receives are the
thread's wgmma A fragment (contraction 2q, 2q + 1, 2q + 8, 2q + 9 of step s, q = lane % 4) of
the tile row frag_row gives, for fragment rows lane / 4 and lane / 4 + 8.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from lowprec_moe import kernels

LINES, ROW_BYTES = 64, 128


def _swizzled(panel: np.ndarray) -> np.ndarray:
    """Shared-memory bytes of a [64 lines][128 rows] panel under the 128-byte swizzle: chunk c
    of line l at chunk c ^ (l % 8)."""
    out = np.empty(LINES * ROW_BYTES, np.uint8)
    for line in range(LINES):
        for c in range(8):
            dst = line * ROW_BYTES + ((c ^ (line & 7)) << 4)
            out[dst:dst + 16] = panel[line, 16 * c:16 * c + 16]
    return out


def _ldmatrix_x4_trans(smem: np.ndarray, addrs: list) -> list:
    """PTX ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16: lanes 8j..8j+7 give the rows of
    matrix j (8 b16 elements each); lane t receives, per matrix, the 32-bit word of elements
    (row 2 (t%4), column t/4) and (row 2 (t%4) + 1, column t/4), the first in the low half."""
    mats = [[smem[addrs[8 * j + i]:addrs[8 * j + i] + 16].view(np.uint16) for i in range(8)]
            for j in range(4)]
    regs = []
    for t in range(32):
        words = []
        for j in range(4):
            lo = int(mats[j][2 * (t % 4)][t // 4])
            hi = int(mats[j][2 * (t % 4) + 1][t // 4])
            words.append(lo | (hi << 16))
        regs.append(words)
    return regs


def _byte_perm(x: int, y: int, sel: int) -> int:
    """CUDA __byte_perm (selector nibbles 0-7, no sign replication)."""
    src = [(x >> (8 * i)) & 0xFF for i in range(4)] + [(y >> (8 * i)) & 0xFF for i in range(4)]
    return sum(src[(sel >> (4 * i)) & 7] << (8 * i) for i in range(4))


def _frag_row(m0: int, lane: int, hf: int, paired: bool) -> int:
    """grouped_gemm_tile.cuh frag_row."""
    return m0 + 2 * (lane >> 2) + hf if paired else m0 + (lane >> 2) + 8 * hf


def test_frag_row_matches_source():
    """The emulated frag_row is the header's formula."""
    src = kernels.source_path("grouped_gemm_tile.cuh").read_text()
    body = re.search(r"int frag_row\(int m0, int lane, int hf\) \{\s*return (.*?);", src, re.S)
    assert body is not None
    assert " ".join(body.group(1).split()) == (
        "PAIRED ? m0 + 2 * (lane >> 2) + hf : m0 + (lane >> 2) + 8 * hf")


@pytest.mark.parametrize("warp", range(8))
def test_mn_major_a_fragments(warp):
    rng = np.random.default_rng(warp)
    panel = rng.integers(0, 256, (LINES, ROW_BYTES), dtype=np.uint8)  # [k line][tile row]
    smem = _swizzled(panel)
    wm0 = 64 * (warp >> 2) + 16 * (warp & 3)
    base = [lane * 128 + (((wm0 >> 4) ^ (lane & 7)) << 4) for lane in range(32)]
    for p in range(2):  # steps 2p and 2p + 1
        regs = _ldmatrix_x4_trans(smem, [a + 32 * 128 * p for a in base])
        for lane in range(32):
            q = lane & 3
            for s in (2 * p, 2 * p + 1):
                x, y = regs[lane][2 * (s & 1)], regs[lane][2 * (s & 1) + 1]
                ks = [16 * s + 2 * q, 16 * s + 2 * q + 1, 16 * s + 2 * q + 8, 16 * s + 2 * q + 9]
                for hf, sel in ((0, 0x6420), (1, 0x7531)):
                    row = _frag_row(wm0, lane, hf, paired=True)
                    got = _byte_perm(x, y, sel)
                    want = sum(int(panel[k, row]) << (8 * i) for i, k in enumerate(ks))
                    assert got == want, (warp, lane, s, hf, hex(got), hex(want))
