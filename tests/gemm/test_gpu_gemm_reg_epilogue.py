"""The register epilogue of the warp-specialised kernels (raw_kernels/gemm/grouped_gemm_epi_regs.cuh)
on the GPU: 16-bit output without bias from the NVFP4 TMA kernel
(``grouped_gemm_sm90_nvfp4_wgmma_ws_tma_128x256_kk``, per-tensor and row-scaled factors), its
persistent form (``..._ws_tma_persistent_128x256_kk``: 128 columns at a time) and the MXFP8
kernel (``grouped_gemm_sm90_mxfp8_wgmma_ws_tma_128x256_{kk,kn,nn}``: the paired fragment rows of
the MN-major A), each bit for bit against the plain wgmma kernel, whose epilogue stages the fp32
tile (Epilogue::tile), in bf16 and fp16, with ragged experts and a partial column tile; a NaN
row keeps the plain kernel's bits (the element-by-element conversion of the words that hold a
NaN).
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import assert_bytes_equal, requires_gpu, set_gemm_options
from test_gpu_gemm import NVFP4_PLAIN, _run
from test_gpu_gemm_persist import NUM_CTAS, PERSISTENT, _kernel, few_ctas  # noqa: F401 (fixture)
from test_gpu_gemm_tma import WS_TMA, _setup, ws_case_dims
import test_gpu_gemm_mxfp8_ws as mxws

pytestmark = [pytest.mark.gpu, requires_gpu]

OUT16 = ["bfloat16", "float16"]


def _require_wgmma():
    from lowprec_moe.backends.cupy.gemm.select import device_caps

    if device_caps()[0] != (9, 0):
        pytest.skip("the warp-specialised kernels are wgmma (sm_90a) kernels")


def _plain(mode, a, b, splits, **kw):
    """The plain NVFP4 wgmma kernel's result (staged epilogue)."""
    return _run(mode, a, b, splits, kernel=NVFP4_PLAIN, **kw)


@pytest.mark.parametrize("out_dtype", OUT16)
@pytest.mark.parametrize("fmt", ["nvfp4", "nvfp4-row-scaled"])
@pytest.mark.parametrize("mode", ["fprop", "dgrad", "wgrad"])
def test_gpu_reg_epilogue_nvfp4(mode, fmt, out_dtype):
    _require_wgmma()
    if mode == "dgrad" and fmt != "nvfp4":
        pytest.skip("dgrad operands are never row-scaled")
    splits, n, k = ws_case_dims(mode, 8)
    a, b, _, launch = _setup(mode, fmt, splits, n, k, 71, 72)
    assert launch().name == WS_TMA, launch().name
    got = _run(mode, a, b, splits, out_dtype=out_dtype)
    want = _plain(mode, a, b, splits, out_dtype=out_dtype)
    assert_bytes_equal(got, want, f"register epilogue {mode} {fmt} {out_dtype} vs plain wgmma")


@pytest.mark.parametrize("out_dtype", OUT16)
@pytest.mark.parametrize("fmt", ["nvfp4", "nvfp4-row-scaled"])
@pytest.mark.parametrize("mode", ["fprop", "wgrad"])
def test_gpu_reg_epilogue_persistent(mode, fmt, out_dtype, monkeypatch,
                                     few_ctas):  # noqa: F811
    _require_wgmma()
    splits, n, k = ws_case_dims(mode, 4)
    a, b, _, _ = _setup(mode, fmt, splits, n, k, 73, 74)
    set_gemm_options(monkeypatch, kernel=PERSISTENT)
    ln = _kernel(mode, a, b, splits)
    assert ln.config.name == PERSISTENT and ln.grid_cap == NUM_CTAS, ln
    got = _run(mode, a, b, splits, out_dtype=out_dtype)
    set_gemm_options(monkeypatch)
    want = _plain(mode, a, b, splits, out_dtype=out_dtype)
    assert_bytes_equal(got, want, f"persistent register epilogue {mode} {fmt} {out_dtype}")


@pytest.mark.parametrize("out_dtype", OUT16)
@pytest.mark.parametrize("mode", ["fprop", "dgrad", "wgrad"])
def test_gpu_reg_epilogue_mxfp8(mode, out_dtype):
    _require_wgmma()
    if mode == "wgrad":
        splits = [1024, 0, 544]
        a, b = mxws._wgrad_problem("mxfp8-e4m3", splits, 75)
    else:
        splits = mxws.SPLITS
        a, b = mxws._problem("mxfp8-e4m3", 1024, 76, mode=mode)
    ws = mxws._run(a, b, splits, ws=True, mode=mode, out_dtype=out_dtype)
    plain = mxws._run(a, b, splits, ws=False, mode=mode, out_dtype=out_dtype)
    assert_bytes_equal(ws, plain, f"register epilogue mxfp8 {mode} {out_dtype} vs plain")


def test_gpu_reg_epilogue_nan_row():
    """A NaN block scale on row 310: a NaN output row (bf16), the plain kernel's bits."""
    _require_wgmma()
    a, b = mxws._problem("mxfp8-e4m3", 1024, 77)
    a.rowwise_scale[310, 3] = 255
    ws = mxws._run(a, b, mxws.SPLITS, ws=True, out_dtype="bfloat16")
    plain = mxws._run(a, b, mxws.SPLITS, ws=False, out_dtype="bfloat16")
    assert np.isnan(ws[310].astype(np.float32)).all()
    assert_bytes_equal(ws, plain, "register epilogue with a NaN row vs plain")
