"""Grouped GEMM TMA builds on the GPU: the swapped-operand
(``grouped_gemm_sm90_nvfp4_wgmma_swap_tma_*_kk``) and warp-specialised
(``grouped_gemm_sm90_nvfp4_wgmma_ws_tma_128x256_kk``) NVFP4 kernels against float64 and, bit for
bit, against their cp.async builds."""

from __future__ import annotations

import numpy as np
import pytest

from lowprec_moe.gemm import _validate

from conftest import assert_bytes_equal, requires_gpu, set_gemm_options
from test_gemm import _expected, assert_gemm_close
from test_gpu_gemm import MODES, NVFP4_PLAIN, _families, _host_operands, _run, gpu

pytestmark = [pytest.mark.gpu, requires_gpu]

SWAP_TMA = "grouped_gemm_sm90_nvfp4_wgmma_swap_tma_32x128_kk"
SWAP_CPASYNC = "grouped_gemm_sm90_nvfp4_wgmma_swap_cpasync_32x128_kk"
SWAP_WIDE = "grouped_gemm_sm90_nvfp4_wgmma_swap_tma_32x256_kk"
SWAP_WIDE16 = "grouped_gemm_sm90_nvfp4_wgmma_swap_tma_16x256_kk"
WS_TMA = "grouped_gemm_sm90_nvfp4_wgmma_ws_tma_128x256_kk"
WS_CPASYNC = "grouped_gemm_sm90_nvfp4_wgmma_ws_cpasync_128x256_kk"


@pytest.mark.parametrize("contraction", [64, 128, 448, 1600])
@pytest.mark.parametrize("mode", ["fprop", "dgrad"])
def test_gpu_swap_tma_contraction_lengths(mode, contraction, monkeypatch):
    """The TMA build of the NVFP4 swapped-operand kernel over 1, 2, 7 and 25 k-tiles (its six
    raw stages wrap, and their mbarrier phases flip, from 7 on): against float64, and bit for
    bit against the cp.async build."""
    if "wgmma" not in _families():
        pytest.skip("wgmma needs an sm_90 GPU")
    splits = [5, 0, 32, 17, 1, 31]
    n, k = (192, contraction) if mode == "fprop" else (contraction, 192)
    a, b, _, launch = _setup(mode, "nvfp4", splits, n, k, 27, 0)
    assert launch().name == SWAP_TMA, launch().name
    got = _run(mode, a, b, splits, out_dtype="float32")
    exp, mag = _expected(mode, a, b, splits)
    assert_gemm_close(got, exp, mag, f"TMA swap {mode} contraction {contraction}")
    set_gemm_options(monkeypatch, kernel=SWAP_CPASYNC)
    assert launch().name == SWAP_CPASYNC, launch().name
    assert_bytes_equal(got, _run(mode, a, b, splits, out_dtype="float32"),
                       f"TMA vs cp.async swap {mode} contraction {contraction}")


def ws_case_dims(mode, tiles):
    """(splits, n, k) of a warp-specialised-kernel case with `tiles` k-tiles: ragged experts
    (an empty one, tiles ending mid-expert) and a partial second column tile; wgrad: three
    experts of `tiles` k-tiles of tokens."""
    from lowprec_moe.backends.cupy.gemm.plan import BK

    contraction = tiles * BK
    if mode == "wgrad":
        return [contraction] * 3, 320, 512
    n, k = (320, contraction) if mode == "fprop" else (contraction, 320)
    return [0, 300, 37, 260, 5, 129], n, k


def _setup(mode, fmt, splits, n, k, seed, rng_seed):
    """(a, b, kw, launch) of a GEMM case: host operands, fprop's bias and probs (kw; empty for
    the other modes) and a function returning the kernel config the launcher picks for them
    now (under the GEMM options in force)."""
    from lowprec_moe import config
    from lowprec_moe.backends.cupy.gemm import launch as C

    a, b = _host_operands(mode, fmt, seed=seed, splits=splits, n=n, k=k)
    ga, gb = gpu(a), gpu(b)
    rng = np.random.default_rng(rng_seed)
    kw = {}
    if mode == "fprop":
        kw = dict(bias=rng.standard_normal((len(splits), n)).astype(np.float32),
                  probs=rng.random(sum(splits)).astype(np.float32))

    def launch():
        p = _validate(mode, ga, gb, splits, bias=None, probs=None, out_dtype="float32",
                      out=None, accumulate=False)
        return C.choose_kernel(p, C.plan(p), kernel=config.gemm_options().kernel).config

    return a, b, kw, launch


def _check_wide_swap(mode, contraction, fmt, monkeypatch, splits, seed, kernel, fallbacks):
    """A wide swapped-operand build, named (``kernel``), against float64 (fp32 and bf16
    outputs; fprop with bias and probs) and run to run; then bit for bit against each config
    named in ``fallbacks``."""
    if "wgmma" not in _families():
        pytest.skip("wgmma needs an sm_90 GPU")
    if mode == "dgrad" and fmt != "nvfp4":
        pytest.skip("dgrad operands are never row-scaled")
    n, k = (320, contraction) if mode == "fprop" else (contraction, 320)
    a, b, kw, launch = _setup(mode, fmt, splits, n, k, seed, seed + 1)
    what = f"{kernel} {mode} {fmt} contraction {contraction}"
    set_gemm_options(monkeypatch, kernel=kernel)
    assert launch().name == kernel, launch().name
    got = _run(mode, a, b, splits, out_dtype="float32")
    got16 = _run(mode, a, b, splits, out_dtype="bfloat16", **kw)
    exp, mag = _expected(mode, a, b, splits)
    assert_gemm_close(got, exp, mag, what)
    exp16, mag16 = _expected(mode, a, b, splits, **kw)
    assert_gemm_close(got16, exp16, mag16, f"{what}, bf16 epilogue")
    assert_bytes_equal(got, _run(mode, a, b, splits, out_dtype="float32"), f"{what} run to run")
    for other in fallbacks:
        set_gemm_options(monkeypatch, kernel=other)
        assert launch().name == other, launch().name
        assert_bytes_equal(got, _run(mode, a, b, splits, out_dtype="float32"),
                           f"{what} vs {other}")
        assert_bytes_equal(got16, _run(mode, a, b, splits, out_dtype="bfloat16", **kw),
                           f"{what} vs {other}, bf16 epilogue")


@pytest.mark.parametrize("fmt", ["nvfp4", "nvfp4-row-scaled"])
@pytest.mark.parametrize("contraction", [64, 448, 1600])
@pytest.mark.parametrize("mode", ["fprop", "dgrad"])
def test_gpu_swap_wide_equals_narrow(mode, contraction, fmt, monkeypatch):
    """The wide TMA build of the NVFP4 swapped-operand kernel (``..._swap_tma_32x256_kk``: 256
    weight rows per CTA, two 64-row halves per warpgroup) over 1, 7 and 25 k-tiles, with a
    partial second column tile (320 columns), token tiles that straddle experts and empty
    experts: against float64, and bit for bit against the 128-column TMA build and the
    cp.async build."""
    _check_wide_swap(mode, contraction, fmt, monkeypatch, [5, 0, 32, 17, 1, 31, 16, 0, 9], 31,
                     SWAP_WIDE, [SWAP_TMA, SWAP_CPASYNC])


@pytest.mark.parametrize("fmt", ["nvfp4", "nvfp4-row-scaled"])
@pytest.mark.parametrize("contraction", [64, 1600])
@pytest.mark.parametrize("mode", ["fprop", "dgrad"])
def test_gpu_swap_wide16_equals_wide(mode, contraction, fmt, monkeypatch):
    """The 16-token form of the wide swapped-operand build (``..._swap_tma_16x256_kk``, wgmma
    m64n16k16) when no expert has more than 16 tokens: against float64, and bit for bit
    against the 32-token wide build (m64n32k16) and the 128-column build."""
    _check_wide_swap(mode, contraction, fmt, monkeypatch, [5, 0, 16, 16, 1, 9, 16, 0, 12, 16], 33,
                     SWAP_WIDE16, [SWAP_WIDE, SWAP_TMA])


@pytest.mark.parametrize("fmt", ["nvfp4", "nvfp4-row-scaled"])
@pytest.mark.parametrize("tiles", [4, 12, 28])
@pytest.mark.parametrize("mode", MODES)
def test_gpu_ws_tma_equals_cp_async(mode, tiles, fmt, monkeypatch):
    """The TMA build of the warp-specialised NVFP4 kernel (384 threads,
    ``..._ws_tma_128x256_kk``: data tiles and block scales through tensor maps and mbarriers),
    chosen by "auto", over 4, 12 and 28 k-tiles (one scale group; every scale slot once; the six
    raw stages and three scale slots wrapping, their mbarrier phases flipping): against float64
    and bit for bit against the cp.async build (``..._ws_cpasync_128x256_kk``) and the plain
    wgmma kernel (``..._wgmma_cpasync_64x256_kk``), with a partial column tile, bias and probs
    (fprop) and bf16 output."""
    from lowprec_moe.backends.cupy.gemm.plan import THREADS, WS_N256_THREADS
    from lowprec_moe.backends.cupy.gemm.select import device_caps

    if device_caps()[0] != (9, 0):
        pytest.skip("the warp-specialised kernel needs an sm_90 GPU")
    splits, n, k = ws_case_dims(mode, tiles)
    a, b, kw, launch = _setup(mode, fmt, splits, n, k, 29 + tiles, tiles)
    ln = launch()
    assert ln.name == WS_TMA and ln.threads == WS_N256_THREADS, ln.name
    got = _run(mode, a, b, splits, out_dtype="float32", **kw)
    got16 = _run(mode, a, b, splits, out_dtype="bfloat16", **kw)
    exp, mag = _expected(mode, a, b, splits, **kw)
    assert_gemm_close(got, exp, mag, f"TMA ws {mode} {fmt} {tiles} k-tiles")
    assert_bytes_equal(got, _run(mode, a, b, splits, out_dtype="float32", **kw),
                       f"TMA ws run to run {mode} {fmt} {tiles}")
    set_gemm_options(monkeypatch, kernel=WS_CPASYNC)
    assert launch().name == WS_CPASYNC, launch().name
    assert_bytes_equal(got, _run(mode, a, b, splits, out_dtype="float32", **kw),
                       f"TMA vs cp.async ws {mode} {fmt} {tiles}")
    assert_bytes_equal(got16, _run(mode, a, b, splits, out_dtype="bfloat16", **kw),
                       f"TMA vs cp.async ws bf16 {mode} {fmt} {tiles}")
    set_gemm_options(monkeypatch, kernel=NVFP4_PLAIN)
    assert launch().threads == THREADS, launch().name
    assert_bytes_equal(got, _run(mode, a, b, splits, out_dtype="float32", **kw),
                       f"TMA ws vs plain wgmma {mode} {fmt} {tiles}")


@pytest.mark.parametrize("n", [352, 416, 464])
def test_gpu_ws_n256_partial_column_tiles(n, monkeypatch):
    """The 384-thread TMA build (``..._ws_tma_128x256_kk``) with the second column tile ending
    inside the consumers' first block of B rows (n = 352: 96 columns), the producers' second
    (416: 160) and the consumers' second (464: 208), so that each role skips some of its B
    units: against float64 (fprop, bias and probs) and bit for bit against the 512-thread
    cp.async build (``..._ws_cpasync_128x256_kk``)."""
    from lowprec_moe.backends.cupy.gemm.plan import BK
    from lowprec_moe.backends.cupy.gemm.select import device_caps

    if device_caps()[0] != (9, 0):
        pytest.skip("the warp-specialised kernel needs an sm_90 GPU")
    splits, k = [0, 300, 37, 260, 5, 129], 8 * BK
    a, b, kw, launch = _setup("fprop", "nvfp4", splits, n, k, 91 + n, 92)
    assert launch().name == WS_TMA, launch().name
    got = _run("fprop", a, b, splits, out_dtype="float32", **kw)
    exp, mag = _expected("fprop", a, b, splits, **kw)
    assert_gemm_close(got, exp, mag, f"ws TMA fprop n={n}")
    set_gemm_options(monkeypatch, kernel=WS_CPASYNC)
    assert launch().name == WS_CPASYNC, launch().name
    assert_bytes_equal(got, _run("fprop", a, b, splits, out_dtype="float32", **kw),
                       f"ws TMA vs ws cp.async, fprop n={n}")
