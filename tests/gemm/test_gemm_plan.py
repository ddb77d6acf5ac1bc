"""The GPU GEMM launch plan (``lowprec_moe.backends.cupy.gemm.plan``), checked on the CPU.

The descriptor / tile tables the kernels read are emulated with NumPy: operand elements fetched
through the descriptor fields the way the kernels address them must reproduce the reference
product. The host / kernel contract (kernel parameter order, mirrored constants) is read from the
CUDA sources. No GPU is needed.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from lowprec_moe.gemm import grouped_gemm

from test_gemm import (E2M1, HP_DTYPES, MODES, _expected, _quantize,
                       assert_gemm_close)


# ============================================================================================
# The GPU launch plan, emulated on the CPU


def _emulate_fetch(op, g, rr, kk):
    """Exact values of operand elements (rr, kk) of expert g through the descriptor fields, the
    way the kernels address them (byte offsets, leading dimensions, scale layouts)."""
    from conftest import gemm_internals
    C = gemm_internals()

    raw = np.ascontiguousarray(op.data).reshape(-1).view(np.uint8)
    off, ld = int(op.off[g]), int(op.ld[g])
    if op.kind in (C.KIND_HP_K, C.KIND_HP_MN):
        es = op.es_num
        p = off + (kk * ld + rr * es if op.mn else rr * ld + kk * es)
        b = raw[p[..., None] + np.arange(es)]
        return np.ascontiguousarray(b).view(op.data.dtype)[..., 0].astype(np.float64)
    sc = np.ascontiguousarray(op.scale).reshape(-1).view(np.uint8)
    soff, sld = int(op.soff[g]), int(op.sld[g])
    if op.kind == C.KIND_FP4_K:
        byte = raw[off + rr * ld + kk // 2]
        code = np.where(kk % 2 == 1, byte >> 4, byte & 0xF)
        s = sc[soff + rr * sld + kk // 16].view(ml_dtypes.float8_e4m3fn).astype(np.float64)
        return E2M1[code] * s
    t = ml_dtypes.float8_e5m2 if op.e5m2 else ml_dtypes.float8_e4m3fn
    if op.mn:
        q, e = raw[off + kk * ld + rr], sc[soff + (kk // 32) * sld + rr]
    else:
        q, e = raw[off + rr * ld + kk], sc[soff + rr * sld + kk // 32]
    return q.view(t).astype(np.float64) * np.exp2(e.astype(np.float64) - 127)


def _emulate(p, bm, bn):
    """Run the launch plan of a NumPy problem the way the kernels do: tile table x column tiles,
    descriptor fields, zero fill past the valid region, epilogue via the amax / bias bases."""
    from conftest import gemm_internals
    C = gemm_internals()
    from lowprec_moe.backends.numpy import gemm as R

    pl = C.plan(p)
    desc = C.descriptors(pl)
    include = pl.rows > 0
    if pl.zero_if_empty and p.accumulate:
        include &= pl.length > 0
    tiles = C.tile_table(pl.rows, include, bm, pl.length)  # as the launcher orders them
    out = np.full(int(np.prod(p.out_shape)), np.nan, dtype=np.float64)
    written = np.zeros(out.shape, dtype=np.int64)
    n_ct = -(-pl.n_cols // bn)
    for entry in range(tiles.shape[0]):
        g, rt = int(tiles[entry, 0]), int(tiles[entry, 1])
        d = desc[g]
        for ct in range(n_ct):
            r0, c0 = rt * bm, ct * bn
            rv, cv = min(bm, d[C.D_ROWS] - r0), min(bn, pl.n_cols - c0)
            assert rv > 0 and cv > 0
            rr = r0 + np.arange(rv)
            cc = c0 + np.arange(cv)
            ln = int(d[C.D_LEN])
            idx = d[C.D_OUT_OFF] + rr[:, None] * pl.n_cols + cc[None, :]
            written[idx] += 1
            if ln == 0 and pl.zero_if_empty:
                out[idx] = 0.0
                continue
            kk = np.arange(ln)
            A = _emulate_fetch(pl.a, g, rr[:, None], kk[None, :])
            B = _emulate_fetch(pl.b, g, cc[:, None], kk[None, :])
            acc = (A @ B.T).astype(np.float32)
            kw = {}
            if p.scale_mode:
                am = pl.a.amax[d[C.D_AMAX_A] + rr] if pl.a.amax_vec else pl.a.amax[d[C.D_AMAX_A]]
                bmx = pl.b.amax[d[C.D_AMAX_B] + cc] if pl.b.amax_vec else \
                    pl.b.amax[d[C.D_AMAX_B]]
                kw = dict(amax_a=np.asarray(am, np.float32), amax_b=np.asarray(bmx, np.float32))
            bias = p.bias.reshape(-1)[d[C.D_BIAS] + cc] if p.bias is not None else None
            probs = p.probs[d[C.D_PROBS] + rr] if p.probs is not None else None
            out[idx] = R.epilogue(acc, scale_mode=p.scale_mode, bias=bias, probs=probs, **kw)
    return out.reshape(p.out_shape).astype(np.float32), written.reshape(p.out_shape)


@pytest.mark.parametrize("tile", [(128, 256), (64, 256), (32, 256), (32, 128), (64, 64)])
@pytest.mark.parametrize("fmt", ["bf16", "fp32", "mxfp8-hybrid", "nvfp4", "nvfp4-row-scaled"])
@pytest.mark.parametrize("mode", MODES)
def test_gpu_plan_emulated(mode, fmt, tile):
    from lowprec_moe.gemm import _validate

    splits = [0, 37, 300, 5, 0, 48]
    m, n, k = sum(splits), 96, 160
    g_count = len(splits)
    rng = np.random.default_rng(21)
    dtype = HP_DTYPES.get(fmt, np.float32)
    x = (rng.standard_normal((m, k))).astype(dtype)
    w = (rng.standard_normal((g_count, n, k))).astype(dtype)
    dy = (rng.standard_normal((m, n))).astype(dtype)
    if fmt in HP_DTYPES:
        a, b = {"fprop": (x, w), "dgrad": (dy, w), "wgrad": (dy, x)}[mode]
    else:
        xq, wq, dq = _quantize(fmt, x, w, dy, splits)
        a, b = {"fprop": (xq, wq), "dgrad": (dq, wq), "wgrad": (dq, xq)}[mode]
    kw = {}
    if mode == "fprop":
        kw = dict(bias=rng.standard_normal((g_count, n)).astype(np.float32),
                  probs=rng.random(m).astype(np.float32))
    p = _validate(mode, a, b, splits, out_dtype="float32", out=None, accumulate=False,
                  bias=kw.get("bias"), probs=kw.get("probs"))
    emu, written = _emulate(p, *tile)
    assert (written == 1).all(), "every output element is written exactly once"
    ref = grouped_gemm(a, b, splits, mode=mode, out_dtype="float32", **kw)
    exp, mag = _expected(mode, a, b, splits, **kw)
    assert_gemm_close(emu, exp, mag, f"emulated {mode} {fmt}")
    np.testing.assert_allclose(emu, ref, rtol=1e-6, atol=1e-6 * float(np.abs(ref).max()))


# ============================================================================================
# Host / kernel contract (checked against the CUDA sources, no GPU needed)


def _c_param_names(text: str) -> list[str]:
    names = []
    for part in text.split(","):
        part = part.strip().rstrip("\\").strip()
        if part:
            names.append(part.replace("*", " ").split()[-1])
    return names


def test_kernel_parameter_order_matches_sources():
    import re

    from lowprec_moe import kernels
    from conftest import gemm_internals
    C = gemm_internals()

    src = kernels.source_path("grouped_gemm_base.cuh").read_text()
    m = re.search(r"#define LPM_GG_PARAMS\s*\\\n(.*?)\n\n", src, re.S)
    body = m.group(1).replace("\\\n", " ")
    assert tuple(_c_param_names(body)) == C.MMA_PARAMS
    simt = kernels.source_path("grouped_gemm_simt.cu").read_text()
    m = re.search(r"grouped_gemm_simt_64x64\((.*?)\)\s*\{", simt, re.S)
    assert tuple(_c_param_names(m.group(1))) == C.SIMT_PARAMS


def test_simt_element_kinds_match_source():
    """The SIMT kernel is a file, not a generated module: its element kinds are checked here
    (every other launcher constant is checked by the generated modules' static_asserts,
    test_gemm_select.test_constant_checks_cover_the_launcher)."""
    import re

    from lowprec_moe import kernels
    from lowprec_moe.backends.cupy.gemm import plan as C

    simt = kernels.source_path("grouped_gemm_simt.cu").read_text()
    for name in ("EK_F32", "EK_BF16", "EK_F16", "EK_FP4", "EK_E4M3", "EK_E5M2"):
        assert int(re.search(rf"\b{name} = (\d+)", simt).group(1)) == getattr(C, name), name


def test_tile_table_longest_contraction_first():
    """With the experts' contraction lengths (K-grouped wgrad), the tile table lists the same
    entries, longest contraction first and in expert order among equal lengths; without them,
    in expert order. Experts not included (no rows, or excluded) get no entries."""
    from conftest import gemm_internals
    C = gemm_internals()

    rows = np.array([256, 0, 130, 128, 128])
    include = rows > 0
    include[4] = False
    length = np.array([64, 999, 640, 64, 4096])
    plain = C.tile_table(rows, include, 128)
    assert plain.tolist() == [[0, 0], [0, 1], [2, 0], [2, 1], [3, 0]]
    lpt = C.tile_table(rows, include, 128, length)
    assert lpt.dtype == np.int32 and lpt.shape == plain.shape
    assert lpt.tolist() == [[2, 0], [2, 1], [0, 0], [0, 1], [3, 0]]
    assert C.tile_table(rows, include, 128, np.full(5, 7)).tolist() == plain.tolist()
    assert C.tile_table(rows[:0], include[:0], 128, length[:0]).shape == (0, 2)
