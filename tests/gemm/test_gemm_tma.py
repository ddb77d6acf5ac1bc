"""The TMA conditions and tensor maps of the GPU GEMM launcher (``lowprec_moe.backends.cupy.gemm.tma_rules``,
``lowprec_moe.backends.cupy.tensor_map``), checked on the CPU: which operands one tensor map per operand can
cover, the tensor-map argument limits, and the maps each TMA build gets (through a stand-in
encoder).
"""

from __future__ import annotations

import pytest

from test_gemm_select import _policy_problem


def test_tma_eligibility():
    """The TMA build needs one tensor map per operand: a uniform row stride that is a multiple
    of 16 bytes, experts starting at whole rows, int32 row coordinates, one contraction length
    that is a multiple of the k-tile."""
    from lowprec_moe.backends.cupy.gemm import plan as P, tma_rules as T

    class C:  # the names the checks use
        plan, BK = P.plan, P.BK
        _use_tma, _tma_rows_ok = T._use_tma, T._tma_rows_ok
        _tma_scale_rows_ok, _use_ws_tma = T._tma_scale_rows_ok, T._use_ws_tma

    p = _policy_problem("fprop", "nvfp4", [16, 0, 32, 3, 16])
    pl = C.plan(p)
    assert C._use_tma(pl)
    a = pl.a
    a.ld = a.ld.copy()
    a.ld[1] += 16
    assert not C._tma_rows_ok(a, 32) and not C._use_tma(pl)  # strides differ
    a.ld[:] = 136
    assert not C._tma_rows_ok(a, 32)  # not a multiple of 16
    a.ld[:] = 128
    assert C._tma_rows_ok(a, 32)
    assert not C._tma_rows_ok(a, 2**31)  # row coordinates past int32
    a.off = a.off + 64
    assert not C._tma_rows_ok(a, 32)  # expert offsets not whole rows
    pl = C.plan(p)
    pl.length = pl.length.copy()
    pl.length[0] += C.BK
    assert not C._use_tma(pl)  # contraction lengths differ
    pl.length[:] = 3 * C.BK + 16
    assert not C._use_tma(pl)  # a ragged last k-tile


def test_ws_tma_scale_eligibility():
    """The scale maps of the ``_kk_y`` build: one scale row stride (a multiple of 16 bytes),
    experts starting at whole scale rows, int32 row coordinates."""
    from lowprec_moe.backends.cupy.gemm import plan as P, tma_rules as T

    class C:  # the names the checks use
        plan, BK = P.plan, P.BK
        _use_tma, _tma_rows_ok = T._use_tma, T._tma_rows_ok
        _tma_scale_rows_ok, _use_ws_tma = T._tma_scale_rows_ok, T._use_ws_tma

    p = _policy_problem("fprop", "nvfp4", [0, 300, 37, 260, 5, 129], n=512, k=768)
    pl = C.plan(p)
    a = pl.a
    assert C._tma_scale_rows_ok(a, 128)
    assert not C._tma_scale_rows_ok(a, 2**31)  # row coordinates past int32
    a.soff = a.soff + 16
    assert not C._tma_scale_rows_ok(a, 128)  # experts not at whole scale rows
    a.soff = a.soff - 16
    a.sld = a.sld.copy()
    a.sld[1] += 16
    assert not C._tma_scale_rows_ok(a, 128)  # strides differ
    a.sld[:] = 40
    assert not C._tma_scale_rows_ok(a, 128)  # not a multiple of 16
    assert not C._use_ws_tma(pl)


def test_tma_map_limits():
    """The tensor-map argument checks name the violated limit."""
    from lowprec_moe.backends.cupy import tensor_map as tma

    assert tma.check_2d_u8(256, 128, 1000, 128, 32, 128) is None
    assert "aligned" in tma.check_2d_u8(8, 128, 1000, 128, 32, 128)
    assert "stride" in tma.check_2d_u8(256, 120, 1000, 120, 32, 128)
    assert "extents" in tma.check_2d_u8(256, 256, 1000, 128, 32, 128)
    assert "box" in tma.check_2d_u8(256, 128, 1000, 128, 8, 128)
    assert "box" in tma.check_2d_u8(256, 128, 1000, 128, 32, 512)
    with pytest.raises(ValueError, match="no tensor map"):
        tma.map_2d_u8(8, 128, 1000, 128, 32, 128)
    assert tma.check_2d_u8(256, 128, 1000, 128, 64, 128, swizzle=64) is None
    assert "span" in tma.check_2d_u8(256, 128, 1000, 128, 128, 128, swizzle=64)
    assert "swizzle" in tma.check_2d_u8(256, 128, 1000, 128, 64, 128, swizzle=48)


class _FakeArr:
    """A device-array stand-in for the tensor-map builder: a pointer and a byte size."""

    def __init__(self, ptr, nbytes):
        self.data = type("Ptr", (), {"ptr": ptr})()
        self.nbytes = nbytes


#: TMA configs and the rows of their A and B data boxes.
_TMA_KERNELS = [
    ("grouped_gemm_sm90_nvfp4_wgmma_ws_tma_128x256_kk", 128, 256),
    ("grouped_gemm_sm90_nvfp4_wgmma_ws_tma_persistent_128x256_kk", 128, 256),
    ("grouped_gemm_sm90_mxfp8_wgmma_ws_tma_128x256_kk", 128, 256),
    ("grouped_gemm_sm90_mxfp8_wgmma_ws_tma_128x256_kn", 128, 256),
    ("grouped_gemm_sm90_mxfp8_wgmma_ws_tma_128x256_nn", 128, 256),
    ("grouped_gemm_sm90_mxfp8_wgmma_ws_tma_persistent_128x256_nn", 128, 256),
    ("grouped_gemm_sm90_nvfp4_wgmma_swap_tma_32x128_kk", 32, 128),
    ("grouped_gemm_sm90_nvfp4_wgmma_swap_tma_32x256_kk", 32, 256),
    ("grouped_gemm_sm90_nvfp4_wgmma_swap_tma_16x256_kk", 16, 256),
]


@pytest.mark.parametrize("kernel,a_box,b_box", _TMA_KERNELS)
def test_tma_map_geometry(kernel, a_box, b_box, monkeypatch):
    """The tensor maps each TMA build gets (extents, strides, boxes, swizzle), recorded through
    a stand-in encoder: data boxes one k-tile deep (NVFP4 32 bytes, MXFP8 64 with the 64-byte
    swizzle), MN-major MXFP8 B (dgrad, wgrad) as 128-column x 64-line panels with the 128-byte
    swizzle, MN-major A (wgrad) as one such panel, scale boxes of 16 bytes per row (MN-major:
    256 columns of B, 128 of A, x 16 block lines)."""
    from lowprec_moe.backends.cupy.gemm import tma_rules as gemm_tma
    from lowprec_moe.backends.cupy import tensor_map as tma

    calls = []
    monkeypatch.setattr(tma, "map_2d_u8", lambda *a: calls.append(a) or len(calls))
    k, n_cols, m_rows = 2048, 320, 192  # contraction, B rows (output columns), A rows
    from lowprec_moe.backends.cupy.gemm.select import config

    cfg = config(kernel)
    mx = cfg.fmt == "mxfp8"
    inner = k if mx else k // 2  # contraction bytes of a K-major row
    a_mn = cfg.a_mn
    a_ld, a_sld = (m_rows, m_rows) if a_mn else (inner, k // (32 if mx else 16))
    b_mn = cfg.b_mn
    b_ld, b_sld = (n_cols, n_cols) if b_mn else (inner, a_sld)
    arrs = [_FakeArr(4096 * (i + 1), 1 << 20) for i in range(4)]  # a, a_scale, b, b_scale
    maps = gemm_tma._tma_maps(cfg, (a_ld, b_ld, inner, a_sld, b_sld, n_cols, m_rows),
                              arrs[0], arrs[1], arrs[2], arrs[3])
    assert maps == tuple(range(1, len(calls) + 1))
    rows = lambda ld: (1 << 20) // ld  # noqa: E731
    d_box, swz = (64, 64) if mx else (32, 0)
    want = [(4096, m_rows, rows(a_ld), a_ld, 128, 64, 128) if a_mn else
            (4096, inner, rows(a_ld), a_ld, d_box, a_box, swz)]
    want.append((3 * 4096, n_cols, rows(b_ld), b_ld, 128, 64, 128) if b_mn else
                (3 * 4096, inner, rows(b_ld), b_ld, d_box, b_box, swz))
    if cfg.role == "ws":
        want.append((2 * 4096, m_rows, rows(a_sld), a_sld, 128, 16, 0) if a_mn else
                    (2 * 4096, a_sld, rows(a_sld), a_sld, 16, a_box, 0))
        want.append((4 * 4096, n_cols, rows(b_sld), b_sld, 256, 16, 0) if b_mn else
                    (4 * 4096, a_sld, rows(b_sld), b_sld, 16, b_box, 0))
    assert calls == want, (calls, want)
