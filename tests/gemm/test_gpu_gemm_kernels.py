"""Grouped GEMM on the GPU: named kernel configs of each family (plain wgmma and mma.sync tiles,
warp-specialised, swapped-operand) against float64 and bit for bit against each other; the
helpers are test_gpu_gemm.py's."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import assert_bytes_equal, requires_gpu
from test_gemm import _expected, assert_gemm_close
from test_gpu_gemm import (MODES, NVFP4_PLAIN, NVFP4_WS, SPLITS, K, N,
                           _assert_grouped_equals_members, _choose, _facts, _families,
                           _host_operands, _plain_kernel, _run)

pytestmark = [pytest.mark.gpu, requires_gpu]


FAMILY_TILES = {"wgmma": (128, 64), "mma": (128, 32)}


@pytest.mark.parametrize("family", ["wgmma", "mma"])
@pytest.mark.parametrize("fmt", ["bf16", "fp16", "nvfp4", "nvfp4-row-scaled", "mxfp8-e4m3",
                                 "mxfp8-hybrid"])
@pytest.mark.parametrize("mode", MODES)
def test_gpu_kernel_families(mode, fmt, family):
    """Each tensor-core family's plain cp.async configs (``grouped_gemm_sm90_*_wgmma_cpasync_*``
    on sm_90, ``grouped_gemm_sm80_*_mma_cpasync_*`` everywhere), named, with each row tile the
    table has for the format and layout (wgrad: the first; NVFP4 has no 128-row plain wgmma
    config), against float64, and grouped == per expert on each tile."""
    if family not in _families():
        pytest.skip(f"{family} needs an sm_90 GPU")
    ran = 0
    for bm in FAMILY_TILES[family]:
        def kernel(mode_, a_, b_, splits_, bm=bm):
            return _plain_kernel(family, bm, mode_, a_, b_, splits_)

        tile_ran = 0
        for splits in (SPLITS, [16, 0, 3, 40, 16, 16, 9]):
            a, b = _host_operands(mode, fmt, seed=14, splits=splits)
            name = kernel(mode, a, b, splits)
            if name is None:
                continue
            launch = _choose(mode, a, b, splits, kernel=name)
            assert launch.name == name and launch.mma == family, launch.name
            got = _run(mode, a, b, splits, kernel=name, out_dtype="float32")
            exp, mag = _expected(mode, a, b, splits)
            assert_gemm_close(got, exp, mag, f"{family} {mode} {fmt} {name}")
            tile_ran += 1
        if tile_ran:
            # the tile choice follows the splits; the arithmetic must not
            _assert_grouped_equals_members(mode, fmt, 14, f"{family} {bm} {mode} {fmt}",
                                           kernel=kernel)
            ran += 1
            if mode == "wgrad":
                break
    assert ran, f"no plain {family} config for {mode} {fmt}"


#: The plain wgmma NVFP4 config, bitwise peer of every NVFP4 kernel (no 128-row form).


@pytest.mark.parametrize("fmt", ["nvfp4", "nvfp4-row-scaled"])
@pytest.mark.parametrize("mode", MODES)
def test_gpu_warp_specialised_equals_wgmma_bitwise(mode, fmt):
    """The warp-specialised cp.async NVFP4 kernel (``grouped_gemm_sm90_nvfp4_wgmma_ws_cpasync_
    128x256_kk``, ``_chunk8`` for 8-byte rows: two producer warpgroups copy and expand B, two
    consumer warpgroups decode A into wgmma registers and multiply; named-barrier handshake
    over 3 canonical buffers and 6 raw stages) against the plain wgmma kernel
    (``..._wgmma_cpasync_64x256_kk``), bit for bit, with enough k-tiles (13 in every mode) to
    refill every raw stage and canonical buffer at least once."""
    from lowprec_moe.backends.cupy.gemm.plan import THREADS, WS_THREADS

    if "wgmma" not in _families():
        pytest.skip("the warp-specialised kernel needs an sm_90 GPU")
    splits = [0, 800, 37, 260, 5, 129]  # wgrad: 13 k-tiles for expert 1
    a, b = _host_operands(mode, fmt, seed=21, splits=splits, n=832, k=832)
    chunk8 = "_chunk8" if _facts(mode, a, b, splits).chunk == 8 else ""
    ws_name, plain_name = NVFP4_WS + chunk8, NVFP4_PLAIN + chunk8
    launch = _choose(mode, a, b, splits, kernel=ws_name)
    assert launch.threads == WS_THREADS and launch.role == "ws", launch.name
    ws = _run(mode, a, b, splits, kernel=ws_name, out_dtype="float32")
    exp, mag = _expected(mode, a, b, splits)
    assert_gemm_close(ws, exp, mag, f"ws {mode} {fmt} {ws_name}")
    plain = _choose(mode, a, b, splits, kernel=plain_name)
    assert plain.threads == THREADS and plain.role == "plain", plain.name
    assert_bytes_equal(ws, _run(mode, a, b, splits, kernel=plain_name, out_dtype="float32"),
                       f"ws vs wgmma {mode} {fmt}")


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "mxfp8-e4m3", "mxfp8-hybrid"])
@pytest.mark.parametrize("mode", ["fprop", "dgrad"])
def test_gpu_wgmma_tiles_equal_bitwise(mode, fmt):
    """The two plain wgmma tiles of an M-grouped GEMM -- 128 rows (one m64n256k16 per
    warpgroup and 16-deep step) and 64 rows (m64n128k16) -- give the same bits, a partial
    column tile included: the split-dependent tile choice must not change results. (NVFP4 has
    only the 64-row plain config; its 128-row kernels are compared with it in
    test_gpu_warp_specialised_equals_wgmma_bitwise and the TMA / persistent tests.)"""
    if "wgmma" not in _families():
        pytest.skip("wgmma needs an sm_90 GPU")
    splits = [0, 300, 37, 260, 5, 129]
    a, b = _host_operands(mode, fmt, seed=23, splits=splits, n=352, k=704)
    big_name = _plain_kernel("wgmma", 128, mode, a, b, splits)
    small_name = _plain_kernel("wgmma", 64, mode, a, b, splits)
    assert _choose(mode, a, b, splits, kernel=big_name).bm == 128
    big = _run(mode, a, b, splits, kernel=big_name, out_dtype="float32")
    assert _choose(mode, a, b, splits, kernel=small_name).bm == 64
    small = _run(mode, a, b, splits, kernel=small_name, out_dtype="float32")
    assert_bytes_equal(small, big, f"64-row vs 128-row wgmma tile {mode} {fmt}")


#: At most 32 tokens per expert (the swapped-operand kernels' limit), empty experts, partial
#: token tiles.
SWAP_SPLITS = [0, 32, 17, 5, 0, 30, 16]


@pytest.mark.parametrize("fmt", ["nvfp4", "nvfp4-row-scaled", "mxfp8-e4m3", "mxfp8-e5m2",
                                 "mxfp8-hybrid"])
@pytest.mark.parametrize("mode", ["fprop", "dgrad"])
def test_gpu_swap_equals_wgmma_bitwise(mode, fmt):
    """The swapped-operand kernel (weights on the wgmma M side, 32 tokens x 128 columns per CTA;
    ``grouped_gemm_sm90_{nvfp4,mxfp8}_wgmma_swap_*_32x128_kk``), named, over experts of up to
    32 tokens -- partial column tiles, for MXFP8 a partial k-tile (K = 160) -- against float64,
    and bit for bit against the plain wgmma kernel, with a bf16 output (and for fprop bias and
    probs) through its transposed staging. NVFP4 runs the TMA build (token tiles past an expert
    read the next expert's rows, the last one rows past the array) and must equal the cp.async
    build too."""
    if "wgmma" not in _families():
        pytest.skip("wgmma needs an sm_90 GPU")
    if mode == "dgrad" and fmt.startswith("mxfp8"):
        pytest.skip("MXFP8 dgrad reads W MN-major: no swapped-operand kernel")
    nvfp4 = fmt.startswith("nvfp4")
    # NVFP4 needs 4-byte aligned k-tile scale words: contraction a multiple of 64
    n, k = (192, 256) if nvfp4 else (N, K)
    splits = SWAP_SPLITS
    a, b = _host_operands(mode, fmt, seed=24, splits=splits, n=n, k=k)
    rng = np.random.default_rng(25)
    kw = dict(bias=rng.standard_normal((len(splits), n)).astype(np.float32),
              probs=rng.random(sum(splits)).astype(np.float32)) if mode == "fprop" else {}
    if nvfp4:
        swap_name = "grouped_gemm_sm90_nvfp4_wgmma_swap_tma_32x128_kk"
        plain_name = NVFP4_PLAIN
    else:
        swap_name = "grouped_gemm_sm90_mxfp8_wgmma_swap_cpasync_32x128_kk"
        plain_name = "grouped_gemm_sm90_mxfp8_wgmma_cpasync_128x256_kk"
    assert _choose(mode, a, b, splits, kernel=swap_name).role == "swap"
    swap = _run(mode, a, b, splits, kernel=swap_name, out_dtype="float32")
    exp, mag = _expected(mode, a, b, splits)
    assert_gemm_close(swap, exp, mag, f"swap {mode} {fmt}")
    swap_epi = _run(mode, a, b, splits, kernel=swap_name, out_dtype="bfloat16", **kw)
    if nvfp4:
        cp_name = "grouped_gemm_sm90_nvfp4_wgmma_swap_cpasync_32x128_kk"
        assert not _choose(mode, a, b, splits, kernel=cp_name).tma
        assert_bytes_equal(swap, _run(mode, a, b, splits, kernel=cp_name, out_dtype="float32"),
                           f"TMA vs cp.async swap {mode} {fmt}")
        assert_bytes_equal(swap_epi, _run(mode, a, b, splits, kernel=cp_name,
                                          out_dtype="bfloat16", **kw),
                           f"TMA vs cp.async swap, bf16 epilogue {mode} {fmt}")
    assert _choose(mode, a, b, splits, kernel=plain_name).role == "plain"
    assert_bytes_equal(swap, _run(mode, a, b, splits, kernel=plain_name, out_dtype="float32"),
                       f"swap vs wgmma {mode} {fmt}")
    assert_bytes_equal(swap_epi, _run(mode, a, b, splits, kernel=plain_name,
                                      out_dtype="bfloat16", **kw),
                       f"swap vs wgmma, bf16 epilogue {mode} {fmt}")


@pytest.mark.parametrize("fmt", ["nvfp4", "nvfp4-row-scaled", "mxfp8-e4m3"])
def test_gpu_swap_chosen_for_few_tokens(fmt):
    """At most 32 tokens per expert (empty experts included): fprop takes the swapped-operand
    kernel by default (NVFP4: its 32 x 128 TMA build)."""
    if "wgmma" not in _families():
        pytest.skip("wgmma needs an sm_90 GPU")
    splits = [16] * 9 + [0, 3, 32, 1]
    a, b = _host_operands("fprop", fmt, seed=26, splits=splits, n=224, k=192)
    assert _choose("fprop", a, b, splits).name == (
        "grouped_gemm_sm90_nvfp4_wgmma_swap_tma_32x128_kk" if fmt.startswith("nvfp4")
        else "grouped_gemm_sm90_mxfp8_wgmma_swap_cpasync_32x128_kk")
    got = _run("fprop", a, b, splits, out_dtype="float32")
    exp, mag = _expected("fprop", a, b, splits)
    assert_gemm_close(got, exp, mag, f"few tokens swap {fmt}")
