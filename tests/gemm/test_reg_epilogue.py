"""The register epilogue of the warp-specialised kernels (raw_kernels/gemm/grouped_gemm_epi_regs.cuh),
emulated on the CPU.

Each consumer warp hands its 16 x 256 accumulators (wgmma fragment layout), converted to 16-bit
words, to its staging buffer with ``stmatrix.x4`` and copies whole staging rows to the output
with 16-byte loads. Checked for chunks of 256 and 128 columns (``gemm_ws`` / ``gemm_ws_mx``
and the persistent ``gemm_ws_p``), with and without the paired fragment rows of the MN-major A:

* every accumulator element reaches the output element (tile row, column) that ``frag_row``
  and the fragment layout give it, and every output element of the warp's rows is stored once;
* each ``stmatrix`` matrix (8 rows of 16 bytes) and each warp's 16-byte row loads touch every
  shared-memory bank at most once per 128 bytes (no bank conflicts).
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import assert_source_has

ROWS = 16  # a consumer warp's fragment rows


def _ld(ccols: int) -> int:
    """reg_epi_ld: bytes per staging row of a chunk of ccols 16-bit columns."""
    return ccols * 2 + 16


def _frag_row(lane: int, hf: int, paired: bool) -> int:
    """grouped_gemm_tile.cuh frag_row, relative to the warp's first row."""
    return 2 * (lane >> 2) + hf if paired else (lane >> 2) + 8 * hf


def _stmatrix_addr(lane: int, j: int, ld: int) -> int:
    """The row address lane gives stmatrix call j (bytes from the buffer)."""
    return ((lane & 7) + 8 * ((lane >> 3) & 1)) * ld + 16 * (lane >> 4) + 32 * j


def _emulate(ni_total: int, cni: int, paired: bool):
    """Run the warp's staging and copy-out on element ids: returns out[16][8 ni_total] of the
    (fragment row, column) ids stored, -1 where nothing was stored, and the per-instruction
    shared byte addresses (for the bank checks)."""
    ccols = 8 * cni
    ld = _ld(ccols)
    lpr = ccols // 8
    rpi = 32 // lpr
    out = np.full((ROWS, 8 * ni_total), -1, np.int64)
    st_accesses, ld_accesses = [], []
    for ch in range(ni_total // cni):
        buf = np.full(ROWS * ld // 2, -1, np.int64)  # 16-bit slots
        for j in range(cni // 2):
            # register i of every lane: fragment 2j + i // 2 (chunk-local), half i % 2
            regs = {}
            for lane in range(32):
                for i in range(4):
                    ni = ch * cni + 2 * j + i // 2
                    hf = i % 2
                    row = _frag_row(lane, hf, paired)
                    col = 8 * ni + 2 * (lane & 3)
                    regs[lane, i] = (row * 10000 + col, row * 10000 + col + 1)
            addrs = [_stmatrix_addr(lane, j, ld) for lane in range(32)]
            for i in range(4):
                st_accesses.append([addrs[8 * i + r] for r in range(8)])
                for r in range(8):  # row r of matrix i: lanes 4r..4r+3 hold its 8 values
                    base = addrs[8 * i + r] // 2
                    for qq in range(4):
                        lo, hi = regs[4 * r + qq, i]
                        buf[base + 2 * qq] = lo
                        buf[base + 2 * qq + 1] = hi
        for i in range(ROWS // rpi):
            acc = []
            for lane in range(32):
                s = i * rpi + lane // lpr
                cc = 8 * (lane % lpr)
                tr = 2 * (s & 7) + (s >> 3) if paired else s
                a = s * ld + 2 * cc
                acc.append(a)
                vals = buf[a // 2: a // 2 + 8]
                dst = out[tr, ch * ccols + cc: ch * ccols + cc + 8]
                assert (dst == -1).all(), f"row {tr} columns {ch * ccols + cc}.. stored twice"
                dst[:] = vals
            ld_accesses.append(acc)
    return out, st_accesses, ld_accesses


def _conflict_free(addresses, width):
    """Every 128-byte wavefront's worth of `width`-byte accesses hits distinct banks."""
    banks = []
    for a in addresses:
        banks.extend(((a // 4) + k) % 32 for k in range(width // 4))
    per = 128 // width
    for w in range(0, len(addresses), per):
        group = banks[w * width // 4:(w + per) * width // 4]
        if len(set(group)) != len(group):
            return False
    return True


def test_source_has_the_emulated_maps():
    assert_source_has(
        "grouped_gemm_epi_regs.cuh",
        "return COLS * 2 + 16;",
        "buf + static_cast<unsigned>(((lane & 7) + 8 * ((lane >> 3) & 1)) * LD +",
        "16 * (lane >> 4));",
        "stsm_x4(st + 32 * j, w[0], w[1], w[2], w[3]);",
        "const int s = i * RPI + lane / LPR, cc = 8 * (lane % LPR);",
        "const int tr = PAIRED ? wm0 + 2 * (s & 7) + (s >> 3) : wm0 + s;",
        "lds_v4(buf + static_cast<unsigned>(s * LD + 2 * cc));")
    assert_source_has("grouped_gemm_tile.cuh",
                      "return PAIRED ? m0 + 2 * (lane >> 2) + hf : m0 + (lane >> 2) + 8 * hf;")


@pytest.mark.parametrize("paired", [False, True], ids=["k-major", "paired"])
@pytest.mark.parametrize("cni", [32, 16], ids=["256-columns", "128-columns"])
def test_register_epilogue_map(cni, paired):
    ni_total = 32
    out, st_acc, ld_acc = _emulate(ni_total, cni, paired)
    rows = np.arange(ROWS)[:, None] * 10000
    cols = np.arange(8 * ni_total)[None, :]
    want = rows + cols
    bad = np.argwhere(out != want)
    assert bad.size == 0, (f"first misplaced element at (row, column) {tuple(bad[0])}: "
                           f"holds {out[tuple(bad[0])]}, want {want[tuple(bad[0])]}")
    for i, a in enumerate(st_acc):
        assert _conflict_free(a, 16), f"stmatrix matrix {i} has bank conflicts: {a}"
    for i, a in enumerate(ld_acc):
        assert _conflict_free(a, 16), f"row load {i} has bank conflicts"


def test_buffers_fit():
    """The persistent kernel's staging buffer (16 rows x 68 floats) is the 128-column chunk's."""
    assert ROWS * 68 * 4 == ROWS * _ld(128)
    assert_source_has("grouped_gemm_base.cuh", "constexpr int kEpiWarpLd = 68;")
