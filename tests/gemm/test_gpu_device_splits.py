"""Grouped GEMMs with device splits on the GPU: the same bits as host splits (fprop with bias
and probs, dgrad, wgrad; bf16 and fp16; empty experts), invalid device splits clamped inside
the tensors, a call that reads nothing back (it captures into a CUDA graph, and the graph
replayed with other splits of the same experts gives the eager host-splits result), the same for
MXFP8 and NVFP4 operands quantized with the device splits, and the cases that are not
implemented say so."""

from __future__ import annotations

import numpy as np
import pytest

import lowprec_moe as lpm
from lowprec_moe import gemm as G

from conftest import assert_bytes_equal, capture_graph, random_splits, requires_gpu

pytestmark = [pytest.mark.gpu, requires_gpu]

_CASES = [(4, 512, 256, 384), (16, 1000, 128, 256), (1, 100, 64, 64), (8, 24, 256, 128)]


def _data(cp, rng, m, g, k, n, dtype):
    def rnd(*shape):
        return cp.asarray(rng.standard_normal(shape).astype(np.float32)).astype(dtype)

    return rnd(m, k), rnd(g, n, k), rnd(m, n)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("g,m,k,n", _CASES)
def test_device_splits_give_host_bits(dtype, g, m, k, n):
    import cupy as cp

    rng = np.random.default_rng(g * m + k)
    dt = cp.float16 if dtype == "float16" else __import__("ml_dtypes").bfloat16
    x, w, dy = _data(cp, rng, m, g, k, n, dt)
    bias = cp.asarray(rng.standard_normal((g, n)).astype(np.float32))
    probs = cp.asarray(rng.uniform(0.1, 1, m).astype(np.float32))
    for _ in range(3):
        s = random_splits(rng, m, g)
        ds = cp.asarray(s.astype(np.int32))
        host = list(int(v) for v in s)
        assert_bytes_equal(G.grouped_gemm_fprop(x, w, ds, bias=bias, probs=probs),
                           G.grouped_gemm_fprop(x, w, host, bias=bias, probs=probs), "fprop")
        assert_bytes_equal(G.grouped_gemm_dgrad(dy, w, ds), G.grouped_gemm_dgrad(dy, w, host),
                           "dgrad")
        out = cp.full((g, n, k), np.nan, dtype=cp.float32)
        got = G.grouped_gemm_wgrad(dy, x, ds, out_dtype="float32", out=out)
        assert_bytes_equal(got, G.grouped_gemm_wgrad(dy, x, host, out_dtype="float32"),
                           "wgrad")


def test_invalid_device_splits_are_clamped():
    import cupy as cp
    import ml_dtypes

    rng = np.random.default_rng(7)
    g, m, k, n = 4, 300, 128, 256
    x, w, dy = _data(cp, rng, m, g, k, n, ml_dtypes.bfloat16)
    for bad, clamped in (([200, -5, 150, 400], [200, 0, 100, 0]), ([10, 20, 30, 40],
                                                                   [10, 20, 30, 40])):
        ds = cp.asarray(np.array(bad, np.int64))
        y = G.grouped_gemm_fprop(x, w, ds)
        if sum(clamped) == m:
            assert_bytes_equal(y, G.grouped_gemm_fprop(x, w, clamped), "clamped fprop")
        else:  # the rows past the clamped splits are left as allocated: compare the rest
            y_ref = G.grouped_gemm_fprop(x[:sum(clamped)], w, clamped)
            assert_bytes_equal(y[:sum(clamped)], y_ref, "clamped fprop")
        G.grouped_gemm_wgrad(dy, x, ds)
        cp.cuda.get_current_stream().synchronize()


def test_a_call_captures_into_a_graph_and_replays_with_new_splits():
    import cupy as cp
    import ml_dtypes

    rng = np.random.default_rng(11)
    g, m, k, n = 8, 1024, 256, 512
    x, w, dy = _data(cp, rng, m, g, k, n, ml_dtypes.bfloat16)
    ds = cp.asarray(random_splits(rng, m, g))
    (y, dw), replay = capture_graph(lambda: (G.grouped_gemm_fprop(x, w, ds),
                                             G.grouped_gemm_wgrad(dy, x, ds)))
    for _ in range(3):
        s = random_splits(rng, m, g)
        ds[...] = cp.asarray(s)
        replay()
        host = [int(v) for v in s]
        assert_bytes_equal(y, G.grouped_gemm_fprop(x, w, host), "replayed fprop")
        assert_bytes_equal(dw, G.grouped_gemm_wgrad(dy, x, host), "replayed wgrad")


_QUANTIZED = [("mxfp8", {}), ("mxfp8", {"fp8_dtype": "e5m2"}), ("nvfp4", {}),
              ("nvfp4", {"row_scaled": True})]


@pytest.mark.parametrize("fmt,opts", _QUANTIZED)
@pytest.mark.parametrize("g,m,k,n", [(6, 700, 256, 192), (1, 77, 128, 64), (16, 300, 128, 128)])
def test_quantized_device_splits_give_host_bits(fmt, opts, g, m, k, n):
    """Quantized operands with device splits (quantized with them, so their columnwise copies
    sit in the worst-case buffers): the plain kernels, fed descriptors affine in the experts'
    rows and blocks, give the bits of the host-splits call (whichever kernel that picks)."""
    import cupy as cp
    import ml_dtypes

    rng = np.random.default_rng(g * m + k + len(opts))
    x, w, dy = _data(cp, rng, m, g, k, n, ml_dtypes.bfloat16)
    wq = lpm.GroupedTensor.quantize(w.reshape(g * n, k), [n] * g, fmt, columnwise=True,
                                    **opts)
    dy_opts = {k_: v for k_, v in opts.items() if k_ != "row_scaled"}
    for _ in range(2):
        s = random_splits(rng, m, g)
        ds, host = cp.asarray(s), [int(v) for v in s]

        def q(a, h, o):
            return lpm.GroupedTensor.quantize(a, h, fmt, columnwise=True, **o)

        xd, xh = q(x, ds, opts), q(x, host, opts)
        dyd, dyh = q(dy, ds, dy_opts), q(dy, host, dy_opts)
        assert_bytes_equal(G.grouped_gemm_fprop(xd, wq), G.grouped_gemm_fprop(xh, wq),
                           f"{fmt} fprop")
        assert_bytes_equal(G.grouped_gemm_dgrad(dyd, wq), G.grouped_gemm_dgrad(dyh, wq),
                           f"{fmt} dgrad")
        out = cp.full((g, n, k), np.nan, dtype=cp.float32)
        got = G.grouped_gemm_wgrad(dyd, xd, ds, out_dtype="float32", out=out)
        assert_bytes_equal(got, G.grouped_gemm_wgrad(dyh, xh, out_dtype="float32"),
                           f"{fmt} wgrad")


@pytest.mark.parametrize("fmt", [None, "mxfp8", "nvfp4"])
def test_one_expert_with_fewer_rows_than_m(fmt):
    """One expert whose device count is below M owns only those rows: the output rows past
    them are not written, and the rest equal a host call on those rows alone."""
    import cupy as cp
    import ml_dtypes

    rng = np.random.default_rng(31)
    m, k, n, c = 100, 128, 64, 40
    x, w, dy = _data(cp, rng, m, 1, k, n, ml_dtypes.bfloat16)
    ds = cp.asarray([c])
    if fmt is None:
        xa, xh, dya, dyh, wa = x, x[:c], dy, dy[:c], w
    else:
        wa = lpm.GroupedTensor.quantize(w.reshape(n, k), [n], fmt, columnwise=True)
        xa = lpm.GroupedTensor.quantize(x, ds, fmt, columnwise=True)
        dya = lpm.GroupedTensor.quantize(dy, ds, fmt, columnwise=True)
        xh = lpm.GroupedTensor.quantize(x[:c], [c], fmt, columnwise=True)
        dyh = lpm.GroupedTensor.quantize(dy[:c], [c], fmt, columnwise=True)
    y = cp.full((m, n), np.nan, dtype=cp.float32)
    G.grouped_gemm_fprop(xa, wa, ds, out=y)
    assert bool(cp.isnan(y[c:]).all())
    assert_bytes_equal(y[:c], G.grouped_gemm_fprop(xh, wa, [c], out_dtype="float32"), "fprop")
    dw = G.grouped_gemm_wgrad(dya, xa, ds, out_dtype="float32")
    assert_bytes_equal(dw, G.grouped_gemm_wgrad(dyh, xh, [c], out_dtype="float32"), "wgrad")


def test_quantized_call_captures_into_a_graph():
    import cupy as cp
    import ml_dtypes

    rng = np.random.default_rng(29)
    g, m, k, n = 8, 1024, 256, 256
    x, w, dy = _data(cp, rng, m, g, k, n, ml_dtypes.bfloat16)
    wq = lpm.GroupedTensor.quantize(w.reshape(g * n, k), [n] * g, "mxfp8", columnwise=True)
    ds = cp.asarray(random_splits(rng, m, g))

    def step():
        xq = lpm.GroupedTensor.quantize(x, ds, "mxfp8", columnwise=True)
        dyq = lpm.GroupedTensor.quantize(dy, ds, "mxfp8", columnwise=True)
        return (G.grouped_gemm_fprop(xq, wq), G.grouped_gemm_dgrad(dyq, wq),
                G.grouped_gemm_wgrad(dyq, xq, out_dtype="float32"))

    got, replay = capture_graph(step)
    for _ in range(2):
        s = random_splits(rng, m, g)
        ds[...] = cp.asarray(s)
        replay()
        host = [int(v) for v in s]
        xq = lpm.GroupedTensor.quantize(x, host, "mxfp8", columnwise=True)
        dyq = lpm.GroupedTensor.quantize(dy, host, "mxfp8", columnwise=True)
        want = (G.grouped_gemm_fprop(xq, wq), G.grouped_gemm_dgrad(dyq, wq),
                G.grouped_gemm_wgrad(dyq, xq, out_dtype="float32"))
        for a, b, name in zip(got, want, ("fprop", "dgrad", "wgrad")):
            assert_bytes_equal(a, b, f"replayed {name}")


def test_unsupported_device_split_cases_say_so():
    import cupy as cp
    import ml_dtypes

    rng = np.random.default_rng(5)
    g, m, k, n = 4, 128, 64, 64
    x, w, dy = _data(cp, rng, m, g, k, n, ml_dtypes.bfloat16)
    ds = cp.asarray(np.array([32] * 4))
    xq = lpm.GroupedTensor.quantize(x, [32] * 4, "mxfp8")
    wq = lpm.GroupedTensor.quantize(w.reshape(g * n, k), [n] * g, "mxfp8")
    with pytest.raises(ValueError, match="host splits but splits is a device array"):
        G.grouped_gemm_fprop(xq, wq, ds)
    xd = lpm.GroupedTensor.quantize(x, ds, "mxfp8")
    with pytest.raises(ValueError, match="device splits but splits are host values"):
        G.grouped_gemm_fprop(xd, wq, [32] * 4)
    with pytest.raises(ValueError, match="quantized with 4 experts"):
        G.grouped_gemm_fprop(xd, wq, cp.asarray([32] * 3))
    with pytest.raises(NotImplementedError, match="accumulate"):
        G.grouped_gemm_wgrad(dy, x, ds, out=cp.zeros((g, n, k), cp.float32),
                               accumulate=True)
    with pytest.raises(TypeError, match="integer"):
        G.grouped_gemm_fprop(x, w, ds.astype(cp.float32))
    with pytest.raises(ValueError, match="1-D"):
        G.grouped_gemm_fprop(x, w, ds.reshape(2, 2))
    with pytest.raises(TypeError, match="numpy"):
        G.grouped_gemm_fprop(x.get(), w.get(), ds)


@pytest.mark.parametrize("g", [1, 7, 256, 300, 3000])
@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_split_table_kernels_equal_their_twins(g, dtype):
    """raw_kernels/layouts/splits.cu against the array-operation twins, on valid splits and on
    splits with negative counts, counts past M and sums past M (the clamp), with more experts
    than the CTA's threads."""
    import cupy as cp

    from lowprec_moe.backends.cupy import splits_kernels as SK
    from lowprec_moe.backends.cupy.gemm import device_splits as DS
    from lowprec_moe.backends.cupy.splits import member_tables

    rng = np.random.default_rng(g)
    m, bm = 5000, 128
    static = rng.integers(-2**40, 2**40, (g, 16)).astype(np.int64)
    coef = rng.integers(-4, 5, (4, 16)).astype(np.int64)
    block = 32
    for case in range(4):
        s = random_splits(rng, m, g)
        if case == 1:
            s = rng.integers(-50, 60, g)
        elif case == 2:
            s[rng.integers(0, g)] = 2**31 - 1 if dtype == "int32" else 2**62
        elif case == 3:
            s = np.zeros(g, np.int64)
        s = s.astype(dtype)
        ds = cp.asarray(s)
        row_off, tile_off = SK.offsets(ds, m, bm)
        want_rows, want_tiles = member_tables(np, s, m, bm)
        assert_bytes_equal(row_off, want_rows, f"row offsets, case {case}")
        assert_bytes_equal(tile_off, want_tiles, f"tile offsets, case {case}")
        # every table of one launch (the NVFP4 member table's four), with units
        specs = ((16, 16), 64, (16, 8 * 96), (16, 96))
        tabs = SK.offsets(ds, m, *specs)
        assert tabs.shape == (5, g + 1) and tabs.flags.c_contiguous
        assert_bytes_equal(tabs[0], want_rows, f"row offsets of four tables, case {case}")
        for j, (rows, unit) in enumerate(sp if isinstance(sp, tuple) else (sp, 1)
                                         for sp in specs):
            assert_bytes_equal(tabs[j + 1], member_tables(np, s, m, rows)[1] * unit,
                               f"tile table {j} ({rows} rows x {unit}), case {case}")
        entries = DS.max_row_tiles(m, g, bm)
        desc, tiles = SK.gemm_tables(row_off, tile_off, m, cp.asarray(static), cp.asarray(coef),
                                     bm, entries)
        row0, rows = DS.clamped_rows(np, s, m)
        assert_bytes_equal(desc, DS.device_descriptors(np, static, coef, row0, rows),
                           f"descriptors, case {case}")
        blk_off = SK.offsets(ds, m, bm, block)[2]
        desc_b, _ = SK.gemm_tables(row_off, tile_off, m, cp.asarray(static), cp.asarray(coef),
                                   bm, None, blk_off=blk_off)
        blk0, blks = DS.block_counts(np, rows, block)
        assert_bytes_equal(desc_b, DS.device_descriptors(np, static, coef, row0, rows, blk0,
                                                         blks), f"block descriptors, case {case}")
        assert_bytes_equal(tiles, DS.device_tile_table(np, rows, m, bm), f"tiles, case {case}")
