"""The persistent forms in the GPU GEMM kernel choice (``lowprec_moe.backends.cupy.gemm.persist``, through
``choose_kernel``), checked on the CPU: NVFP4 ``_kk_o`` / ``_kk_z``, MXFP8 ``_kk_o`` / ``_kn_o``
/ ``_nn_o`` and the ragged ``_nn_g``.
"""

from __future__ import annotations

import numpy as np
import pytest

from test_gemm import MODES
from test_gemm_choice import H200_CAPS, _policy_problem


@pytest.mark.parametrize("n256", [True, False], ids=["kk_o", "kk_z"])
@pytest.mark.parametrize("mode", MODES)
def test_choose_kernel_persistent(mode, n256, monkeypatch):
    """The persistent forms of the NVFP4 ``_kk_y`` build (``_kk_o`` of its 384-thread form
    ``_kk_q``; ``_kk_z`` with ``LOWPREC_MOE_GEMM_WS_N256=off``): with more tiles than
    multiprocessors ("auto"; ``_kk_z`` only for contractions of up to ``PERSIST_MAX_KTILES``
    k-tiles), or wherever the one-tile-per-CTA build runs ("on"), provided the contraction is a
    whole, nonzero number of scale groups (4 k-tiles); that build with "off", a ragged group,
    and few tiles (or, ``_kk_z``, a long contraction) in "auto". The grid is capped at one CTA
    per multiprocessor."""
    from lowprec_moe.backends.cupy.gemm import launch as C

    monkeypatch.setattr(C.choice, "_chunk", lambda op, extent: 16)
    if not n256:
        monkeypatch.setenv(C.WS_N256_ENV, "off")
    persistent, per_tile = ("lpm_gg_nvfp4_kk_o", "lpm_gg_nvfp4_kk_q") if n256 else \
        ("lpm_gg_nvfp4_kk_z", "lpm_gg_nvfp4_kk_y")
    threads = C.WS_N256_THREADS if n256 else C.WS_THREADS
    longest = C.PERSIST_N256_MAX_KTILES if n256 else C.PERSIST_MAX_KTILES
    sms = H200_CAPS[2]
    splits = [256] * 3 if mode == "wgrad" else [0, 300, 37, 260, 5, 129]
    for fmt in ("nvfp4", "nvfp4-row-scaled"):
        # many tiles (fprop / dgrad: 160 row tiles of 16 x 6 experts; wgrad: 3 x 16 x 4)
        big = splits * (16 if mode != "wgrad" else 1)
        n, k = (256, 256) if mode != "wgrad" else (2048, 1024)
        p = _policy_problem(mode, fmt, big, n=n, k=k)
        pl = C.plan(p)
        assert C.num_tiles(pl, 128, 256) > sms
        ln = C.choose_kernel(p, pl, caps=H200_CAPS)
        assert ln.kernel == persistent and ln.tma and ln.grid_cap == sms, ln
        assert ln.smem == C._ws_p_smem_bytes() and ln.threads == threads, ln
        monkeypatch.setenv(C.PERSIST_ENV, "off")
        ln = C.choose_kernel(p, pl, caps=H200_CAPS)
        assert ln.kernel == per_tile and ln.grid_cap == 0 and ln.threads == threads, ln
        monkeypatch.setenv(C.PERSIST_ENV, "sometimes")
        with pytest.raises(ValueError, match="LOWPREC_MOE_GEMM_PERSIST"):
            C.choose_kernel(p, pl, caps=H200_CAPS)
        monkeypatch.delenv(C.PERSIST_ENV)
        # few tiles: "auto" keeps one CTA per tile, "on" takes the persistent form
        p = _policy_problem(mode, fmt, splits, n=512, k=1024)
        pl = C.plan(p)
        assert C.num_tiles(pl, 128, 256) <= sms
        assert C.choose_kernel(p, pl, caps=H200_CAPS).kernel == per_tile
        monkeypatch.setenv(C.PERSIST_ENV, "on")
        assert C.choose_kernel(p, pl, caps=H200_CAPS).kernel == persistent
        # (compact 16-byte scale rows make _kk_y contractions whole scale groups, a padded
        # scale stride need not; the persistent forms' own condition, checked on the plan:)
        # 6 or 0 k-tiles are not
        for kt, want in ((16, True), (6, False), (0, False)):
            pl.length[:] = kt * C.BK
            assert C._persist(pl, sms, n256) == want, kt
        monkeypatch.delenv(C.PERSIST_ENV)
        # "auto" with many tiles: up to `longest` k-tiles (_kk_o: any number)
        pl = C.plan(_policy_problem(mode, fmt, big, n=n, k=k))
        for kt in (4, 16, 112) if longest is None else (4, longest, longest + 4):
            pl.length[:] = kt * C.BK
            assert C._persist(pl, sms, n256) == (longest is None or kt <= longest), kt


@pytest.mark.parametrize("mode", ["fprop", "dgrad", "wgrad"])
def test_choose_kernel_mxfp8_persistent(mode, monkeypatch):
    """sm_90, MXFP8 on the warp-specialised kernel with more tiles than multiprocessors: its
    persistent form (``_kk_o`` / ``_kn_o`` / ``_nn_o``, its own shared-memory formula, the grid
    capped at one CTA per SM) for 16-bit output without bias into an aligned buffer, a
    contraction of whole scale groups and one length for every expert; the per-tile kernel
    for fp32 output, bias, accumulation, other lengths, ``LOWPREC_MOE_GEMM_PERSIST=off``;
    ``=on`` takes it for few tiles too."""
    from dataclasses import replace

    from lowprec_moe.backends.cupy.gemm import launch as C

    monkeypatch.setattr(C.choice, "_chunk", lambda op, extent: 16)
    monkeypatch.setenv(C.MXFP8_WS_ENV, "all")
    sms = H200_CAPS[2]
    lay = {"fprop": "kk", "dgrad": "kn", "wgrad": "nn"}[mode]
    # (contraction: PERSIST_MX_MAX_KTILES k-tiles)
    length = C.PERSIST_MX_MAX_KTILES * C.BK
    if mode == "wgrad":  # 24 experts x `length` tokens, 512 x 1024 outputs: 24 x 4 x 4 tiles
        splits, n, k = [length] * 24, 512, 1024
    else:  # 160 row tiles x 2 column tiles
        splits, n, k = ([0, 300, 37, 260, 5, 129] * 16, 512, length) if mode == "fprop" else \
            ([0, 300, 37, 260, 5, 129] * 16, length, 512)
    p = replace(_policy_problem(mode, "mxfp8-hybrid", splits, n=n, k=k), out_dtype="bfloat16")
    pl = C.plan(p)
    assert C.num_tiles(pl, 128, 256) > sms
    ln = C.choose_kernel(p, pl, caps=H200_CAPS)
    assert ln.kernel == f"lpm_gg_mxfp8_{lay}_o" and ln.tma and ln.grid_cap == sms, ln
    assert ln.smem == C._ws_mx_p_smem_bytes() and ln.threads == C.WS_THREADS, ln
    per_tile = f"lpm_gg_mxfp8_{lay}_y"
    for other in (dict(out_dtype="float32"), dict(accumulate=True),
                  dict(bias=np.zeros((len(splits), n), np.float32))):
        if "bias" in other and mode != "fprop":
            continue
        ln = C.choose_kernel(replace(p, **other), pl, caps=H200_CAPS)
        assert ln.kernel == per_tile and ln.grid_cap == 0, (other, ln)
        assert ln.smem == C._ws_mx_smem_bytes(), ln
    assert C.choose_kernel(replace(p, out_dtype="float16"), pl, caps=H200_CAPS).kernel == \
        f"lpm_gg_mxfp8_{lay}_o"
    # an output buffer 16-byte aligned or not (2 bytes off)
    buf = np.zeros(int(np.prod(p.out_shape)) + 16, np.uint16)
    base = (-buf.ctypes.data % 16) // 2
    for off, want in ((base, "o"), (base + 1, "y")):
        out = buf[off:off + int(np.prod(p.out_shape))]
        assert C.choose_kernel(replace(p, out=out), pl, caps=H200_CAPS).kernel == \
            f"lpm_gg_mxfp8_{lay}_{want}", off
    # output columns not in whole 8-column groups
    pl8 = C.plan(p)
    pl8.n_cols = pl8.n_cols - 4
    assert not C._persist_mx(p, pl8, sms)
    monkeypatch.setenv(C.PERSIST_ENV, "off")
    assert C.choose_kernel(p, pl, caps=H200_CAPS).kernel == per_tile
    monkeypatch.delenv(C.PERSIST_ENV)
    # a contraction of 4 k-tiles (not a whole scale group of WMX_SCALE_TILES) or 0; longer
    # than PERSIST_MX_MAX_KTILES (fprop: "on" takes those; dgrad, wgrad: any length); experts
    # of different lengths
    longest = C.PERSIST_MX_MAX_KTILES
    for kt, want in ((8, True), (longest, True), (4, False), (0, False),
                     (longest + 8, mode != "fprop"), (8 * longest, mode != "fprop")):
        pl.length[:] = kt * C.BK
        assert C._persist_mx(p, pl, sms) == want, kt
    monkeypatch.setenv(C.PERSIST_ENV, "on")
    assert C._persist_mx(p, pl, sms)
    monkeypatch.delenv(C.PERSIST_ENV)
    pl.length[:] = 8 * C.BK
    assert C._persist_mx(p, pl, sms)
    pl.length[1] = 16 * C.BK  # (the first expert's length sets KT: 8)
    assert not C._persist_mx(p, pl, sms)
    pl.length[:] = 8 * C.BK
    # few tiles: "auto" keeps one CTA per tile, "on" takes the persistent form
    few = replace(_policy_problem(mode, "mxfp8-hybrid", [length] * 3 if mode == "wgrad"
                                  else [300, 37], n=512, k=512), out_dtype="bfloat16")
    assert C.choose_kernel(few, C.plan(few), caps=H200_CAPS).kernel == per_tile
    monkeypatch.setenv(C.PERSIST_ENV, "on")
    assert C.choose_kernel(few, C.plan(few), caps=H200_CAPS).kernel == f"lpm_gg_mxfp8_{lay}_o"


def test_choose_kernel_mxfp8_ragged(monkeypatch):
    """sm_90, MXFP8 wgrad on the warp-specialised kernel whose experts contract different
    lengths (or one length that is no whole scale group): with ``LOWPREC_MOE_GEMM_PERSIST=on``
    the ragged persistent form ``_nn_g`` (its own shared-memory formula and module, the grid
    capped at one CTA per SM, a balanced tile list) for 16-bit output, also for few tiles; the
    per-tile ``_nn_y`` in "auto" (the ragged form measured slower), with "off", for fp32
    output and for accumulation; one length of whole scale groups stays on ``_nn_o``."""
    from dataclasses import replace

    from lowprec_moe.backends.cupy.gemm import launch as C

    monkeypatch.setattr(C.choice, "_chunk", lambda op, extent: 16)
    sms = H200_CAPS[2]
    # 24 experts of 4 x 4 tiles, uneven (two empty), mean above MXFP8_WS_WGRAD_MIN_LEN
    splits = [0, 96, 160, 1024, 0, 640, 2048, 544] * 3
    p = replace(_policy_problem("wgrad", "mxfp8-hybrid", splits, n=512, k=1024),
                out_dtype="bfloat16")
    pl = C.plan(p)
    assert C.num_tiles(pl, 128, 256) > sms
    assert C.choose_kernel(p, pl, caps=H200_CAPS).kernel == "lpm_gg_mxfp8_nn_y"
    monkeypatch.setenv(C.PERSIST_ENV, "on")
    ln = C.choose_kernel(p, pl, caps=H200_CAPS)
    assert ln.kernel == "lpm_gg_mxfp8_nn_g" and ln.ragged and ln.tma and ln.mx_ranges, ln
    assert ln.grid_cap == sms and ln.smem == C._ws_mx_g_smem_bytes(), ln
    assert ln.module == "grouped_gemm_mxfp8_wsg", ln
    for other in (dict(out_dtype="float32"), dict(accumulate=True)):
        ln = C.choose_kernel(replace(p, **other), pl, caps=H200_CAPS)
        assert ln.kernel == "lpm_gg_mxfp8_nn_y" and not ln.ragged and ln.grid_cap == 0, other
    # one length: a whole number of scale groups -> _nn_o; 12 k-tiles (no whole group) -> _nn_g
    for kt, want in ((8, "o"), (12, "g")):
        q = replace(_policy_problem("wgrad", "mxfp8-hybrid", [kt * C.BK] * 24, n=512, k=1024),
                    out_dtype="bfloat16")
        assert C.choose_kernel(q, C.plan(q), caps=H200_CAPS).kernel == f"lpm_gg_mxfp8_nn_{want}"
    # few tiles
    few = replace(_policy_problem("wgrad", "mxfp8-hybrid", [0, 640, 1024], n=512, k=512),
                  out_dtype="bfloat16")
    assert C.choose_kernel(few, C.plan(few), caps=H200_CAPS).kernel == "lpm_gg_mxfp8_nn_g"
    monkeypatch.setenv(C.PERSIST_ENV, "off")
    assert C.choose_kernel(p, pl, caps=H200_CAPS).kernel == "lpm_gg_mxfp8_nn_y"


def test_choose_kernel_nvfp4_ragged(monkeypatch):
    """sm_90, NVFP4 wgrad of uneven experts (the warp-specialised kernel's cp.async build: no
    tensor map covers experts of different row strides) with 16-bit output: the ragged
    persistent form, in its TMA build ``_kk_h`` (``_kk_h8`` with 8-byte rows; per-expert
    row-pair maps) or, with TMA off or experts no row-pair map covers, its cp.async build
    ``_kk_g`` / ``_kk_g8`` (the per-tile build's shared memory, its own module, the grid capped
    at one CTA per SM, a balanced tile list) in "auto" with more tiles than multiprocessors and
    (the cp.async build) short contractions; the per-tile ``_kk_x`` with few tiles or, TMA off,
    long contractions (the ragged form with "on"), with "off", for fp32 output and for
    accumulation."""
    from dataclasses import replace

    from lowprec_moe.backends.cupy.gemm import launch as C

    chunk = {"ch": 16}
    monkeypatch.setattr(C.choice, "_chunk", lambda op, extent: chunk["ch"])
    sms = H200_CAPS[2]
    splits = [0, 96, 160, 1024, 0, 640, 2048, 544] * 3
    for fmt in ("nvfp4", "nvfp4-row-scaled"):
        p = replace(_policy_problem("wgrad", fmt, splits, n=512, k=1024), out_dtype="bfloat16")
        pl = C.plan(p)
        assert C.num_tiles(pl, 128, 256) > sms and not C._use_ws_tma(pl)
        assert C._use_pair_tma(pl)
        for tma in (True, False):
            if not tma:
                monkeypatch.setenv(C.TMA_ENV, "off")
            for ch in (16, 8):
                chunk["ch"] = ch
                name = "lpm_gg_nvfp4_kk_" + ("h" if tma else "g") + ("8" if ch == 8 else "")
                ln = C.choose_kernel(p, pl, caps=H200_CAPS)
                assert ln.kernel == name and ln.ragged and ln.tma == tma, ln
                assert not ln.mx_ranges and ln.grid_cap == sms, ln
                assert ln.smem == (C._ws_g_tma_smem_bytes() if tma else
                                   C._ws_smem_bytes(C.KIND_FP4_K, C.KIND_FP4_K)), ln
                assert ln.module == "grouped_gemm_nvfp4_wsg" and ln.threads == C.WS_THREADS, ln
            monkeypatch.delenv(C.TMA_ENV, raising=False)
        chunk["ch"] = 16
        monkeypatch.setattr(C.choice, "_use_pair_tma", lambda pl: False)
        assert C.choose_kernel(p, pl, caps=H200_CAPS).kernel == "lpm_gg_nvfp4_kk_g"
        monkeypatch.undo()
        monkeypatch.setattr(C.choice, "_chunk", lambda op, extent: chunk["ch"])
        for other in (dict(out_dtype="float32"), dict(accumulate=True)):
            ln = C.choose_kernel(replace(p, **other), pl, caps=H200_CAPS)
            assert ln.kernel == "lpm_gg_nvfp4_kk_x" and not ln.ragged and ln.grid_cap == 0, other
        monkeypatch.setenv(C.PERSIST_ENV, "off")
        assert C.choose_kernel(p, pl, caps=H200_CAPS).kernel == "lpm_gg_nvfp4_kk_x"
        monkeypatch.delenv(C.PERSIST_ENV)
        few = replace(_policy_problem("wgrad", fmt, [0, 96, 160], n=512, k=512),
                      out_dtype="bfloat16")
        assert C.choose_kernel(few, C.plan(few), caps=H200_CAPS).kernel == "lpm_gg_nvfp4_kk_x"
        monkeypatch.setenv(C.PERSIST_ENV, "on")
        assert C.choose_kernel(few, C.plan(few), caps=H200_CAPS).kernel == "lpm_gg_nvfp4_kk_h"
        monkeypatch.delenv(C.PERSIST_ENV)
        # long contractions (mean above PERSIST_RAGGED_FP4_MAX_KTILES): "auto" takes the TMA
        # build, or keeps _kk_x with TMA off
        long = replace(_policy_problem("wgrad", fmt, [0, 1024, 1536] * 8, n=512, k=1024),
                       out_dtype="bfloat16")
        assert C.choose_kernel(long, C.plan(long), caps=H200_CAPS).kernel == "lpm_gg_nvfp4_kk_h"
        monkeypatch.setenv(C.TMA_ENV, "off")
        assert C.choose_kernel(long, C.plan(long), caps=H200_CAPS).kernel == "lpm_gg_nvfp4_kk_x"
        monkeypatch.delenv(C.TMA_ENV)
        monkeypatch.setenv(C.PERSIST_ENV, "on")
        assert C.choose_kernel(long, C.plan(long), caps=H200_CAPS).kernel == "lpm_gg_nvfp4_kk_h"
        monkeypatch.delenv(C.PERSIST_ENV)


def test_pair_rows_ok():
    """The ragged TMA build's row-pair maps: every expert with rows and a contraction needs a
    16-byte aligned start, an even row count and a stride that is a multiple of 8 bytes; the
    others are not looked at."""
    from lowprec_moe.backends.cupy.gemm import launch as C
    from lowprec_moe.backends.cupy.gemm.tma_rules import _pair_rows_ok

    def op(off, ld):
        return C.Operand(data=None, scale=None, mn=False, kind=C.KIND_FP4_K, ek=0, es_num=1,
                         es_den=2, ld=np.asarray(ld, np.int64), off=np.asarray(off, np.int64),
                         soff=np.zeros(len(ld), np.int64), sld=np.ones(len(ld), np.int64),
                         e5m2=False, amax_vec=False)

    live = np.array([0, 2])
    rows = np.array([64, 7, 128])
    assert _pair_rows_ok(0, op([0, 3, 4096], [56, 1, 24]), rows, live)
    assert _pair_rows_ok(16, op([0, 3, 4096], [56, 1, 24]), rows, live)
    assert not _pair_rows_ok(8, op([0, 3, 4096], [56, 1, 24]), rows, live)  # start
    assert not _pair_rows_ok(0, op([0, 3, 4104], [56, 1, 24]), rows, live)  # start
    assert not _pair_rows_ok(0, op([0, 3, 4096], [56, 1, 28]), rows, live)  # stride
    assert not _pair_rows_ok(0, op([0, 3, 4096], [56, 1, 24]), np.array([64, 7, 127]), live)
    assert not _pair_rows_ok(0, op([0, 3, 4096], [0, 1, 24]), rows, live)  # no stride
