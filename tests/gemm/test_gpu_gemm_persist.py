"""The persistent form of the warp-specialised NVFP4 TMA kernel
(``grouped_gemm_sm90_nvfp4_wgmma_ws_tma_persistent_128x256_kk``; raw_kernels/
grouped_gemm_ws_persist.cuh) on the GPU: each CTA runs many tiles as one flattened pipeline,
and the epilogue works straight from the accumulators.

The grid is capped at 3 CTAs here (the launcher sees 3 multiprocessors), so every CTA runs 6-7
tiles and the raw stages, canonical buffers, scale slots and mbarrier phases wrap across tile
boundaries at different k-tiles. Checks, in every mode, NVFP4 and row-scaled NVFP4, over 4, 12
and 20 k-tiles: against float64 (fp32 output, with bias and probs in fprop), bit for bit against
the one-CTA-per-tile build (``grouped_gemm_sm90_nvfp4_wgmma_ws_tma_128x256_kk``: fp32 and bf16
outputs, accumulation into fp32), and run to run.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest

from lowprec_moe.gemm import _validate

from conftest import assert_bytes_equal, requires_gpu, set_gemm_options
from test_gemm import _expected, assert_gemm_close
from test_gpu_gemm import MODES, _host_operands, _run, gpu
from test_gpu_gemm_tma import ws_case_dims

pytestmark = [pytest.mark.gpu, requires_gpu]

NUM_CTAS = 3


@pytest.fixture
def few_ctas(monkeypatch):
    """The launcher sees NUM_CTAS multiprocessors (and starts from an empty launch cache)."""
    from lowprec_moe.backends.cupy.gemm import launch as C
    from lowprec_moe.backends.cupy.gemm import select

    cc, optin, _ = select.device_caps()
    if cc != (9, 0):
        pytest.skip("the warp-specialised kernel needs an sm_90 GPU")
    monkeypatch.setattr(select, "device_caps", lambda: (cc, optin, NUM_CTAS))
    monkeypatch.setattr(C, "_prepared", OrderedDict())


PERSISTENT = "grouped_gemm_sm90_nvfp4_wgmma_ws_tma_persistent_128x256_kk"
PER_TILE = "grouped_gemm_sm90_nvfp4_wgmma_ws_tma_128x256_kk"


def _case(mode, fmt, tiles, seed):
    """(a, b, splits, kw): ws_case_dims' problem; fprop with bias and probs."""
    splits, n, k = ws_case_dims(mode, tiles)
    a, b = _host_operands(mode, fmt, seed=seed, splits=splits, n=n, k=k)
    rng = np.random.default_rng(seed)
    kw = {}
    if mode == "fprop":
        kw = dict(bias=rng.standard_normal((len(splits), n)).astype(np.float32),
                  probs=rng.random(sum(splits)).astype(np.float32))
    return a, b, splits, kw


def _kernel(mode, a, b, splits, kernel=None):
    """The launcher's :class:`~lowprec_moe.backends.cupy.gemm.select.Choice` for a problem:
    config ``kernel``, or by default the GEMM options in force."""
    from lowprec_moe import config
    from lowprec_moe.backends.cupy.gemm import launch as C

    p = _validate(mode, gpu(a), gpu(b), splits, bias=None, probs=None, out_dtype="float32",
                  out=None, accumulate=False)
    return C.choose_kernel(p, C.plan(p), kernel=kernel or config.gemm_options().kernel)


@pytest.mark.parametrize("fmt", ["nvfp4", "nvfp4-row-scaled"])
@pytest.mark.parametrize("tiles", [4, 12, 20])
@pytest.mark.parametrize("mode", MODES)
def test_gpu_persistent_equals_per_tile(mode, tiles, fmt, monkeypatch, few_ctas):
    a, b, splits, kw = _case(mode, fmt, tiles, 61 + tiles)
    what = f"persistent {mode} {fmt} {tiles} k-tiles"
    set_gemm_options(monkeypatch, kernel=PERSISTENT)
    ln = _kernel(mode, a, b, splits)
    assert ln.config.name == PERSISTENT and ln.grid_cap == NUM_CTAS, ln
    got = _run(mode, a, b, splits, out_dtype="float32", **kw)
    got16 = _run(mode, a, b, splits, out_dtype="bfloat16", **kw)
    exp, mag = _expected(mode, a, b, splits, **kw)
    assert_gemm_close(got, exp, mag, what)
    assert_bytes_equal(got, _run(mode, a, b, splits, out_dtype="float32", **kw),
                       f"{what}, run to run")
    # accumulation into an fp32 buffer
    base = np.random.default_rng(tiles).standard_normal(got.shape).astype(np.float32)
    acc = _run(mode, a, b, splits, out=gpu(base.copy()), accumulate=True, **kw)
    set_gemm_options(monkeypatch, kernel=PER_TILE)
    assert _kernel(mode, a, b, splits).config.name == PER_TILE
    assert_bytes_equal(got, _run(mode, a, b, splits, out_dtype="float32", **kw),
                       f"{what} vs per-tile")
    assert_bytes_equal(got16, _run(mode, a, b, splits, out_dtype="bfloat16", **kw),
                       f"{what} vs per-tile, bf16 output")
    assert_bytes_equal(acc, _run(mode, a, b, splits, out=gpu(base.copy()), accumulate=True,
                                 **kw), f"{what} vs per-tile, accumulating")


def test_gpu_persistent_many_tiles_default(monkeypatch):
    """With the real multiprocessor count and more tiles than multiprocessors, "auto" takes
    the persistent form; its results equal the per-tile build's bit for bit (bf16 output)."""
    from lowprec_moe.backends.cupy.gemm.select import device_caps

    if device_caps()[0] != (9, 0):
        pytest.skip("the warp-specialised kernel needs an sm_90 GPU")
    splits = [512, 0, 1000, 384, 130, 700] * 6  # ~165 row tiles x 2 column tiles
    a, b = _host_operands("fprop", "nvfp4", seed=71, splits=splits, n=512, k=256)
    assert _kernel("fprop", a, b, splits).config.name == PERSISTENT
    got = _run("fprop", a, b, splits, out_dtype="bfloat16")
    set_gemm_options(monkeypatch, kernel=PER_TILE)
    assert _kernel("fprop", a, b, splits).config.name == PER_TILE
    assert_bytes_equal(got, _run("fprop", a, b, splits, out_dtype="bfloat16"),
                       "persistent (auto) vs per-tile")
