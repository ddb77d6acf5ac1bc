"""The device-splits tables of the grouped GEMM (lowprec_moe.backends.cupy.gemm.device_splits),
checked on the CPU with NumPy as the array module against the host plan: the descriptor table is
affine in the experts' first rows and row counts with the coefficients found, the tile table
lists the host tiles and then entries without a valid row, and the clamp leaves valid splits
alone and keeps invalid ones inside [0, M)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from lowprec_moe.backends.cupy.gemm import device_splits as DS
from lowprec_moe.backends.cupy.gemm.plan import descriptors, plan, tile_table
from lowprec_moe.gemm import _validate

from conftest import random_splits

_K, _N = 64, 48


def _problem(mode, splits, rng, m, g, dtype=ml_dtypes.bfloat16, bias=False):
    x = rng.standard_normal((m, _K)).astype(dtype)
    dy = rng.standard_normal((m, _N)).astype(dtype)
    w = rng.standard_normal((g, _N, _K)).astype(dtype)
    kw = dict(bias=None, probs=None, out_dtype=None, out=None, accumulate=False)
    if bias and mode == "fprop":
        kw.update(bias=np.ones((g, _N), np.float32), probs=np.ones(m, np.float32))
    a, b = {"fprop": (x, w), "dgrad": (dy, w), "wgrad": (dy, x)}[mode]
    return _validate(mode, a, b, splits, **kw)


@pytest.mark.parametrize("mode", ["fprop", "dgrad", "wgrad"])
@pytest.mark.parametrize("g,m", [(1, 37), (2, 64), (5, 100), (8, 0), (3, 2), (16, 700)])
def test_descriptors_are_affine_in_rows(mode, g, m):
    rng = np.random.default_rng(g * 1000 + m)
    fixed = rng.integers(0, 2**31)

    base = _problem(mode, [m] + [0] * (g - 1), np.random.default_rng(fixed), m, g, bias=True)

    def desc_of(s):  # a valid split: its own problem; fewer rows (one expert): the stand-in
        if sum(s) == m:
            return descriptors(plan(_problem(mode, list(s), np.random.default_rng(fixed), m, g,
                                             bias=True)))
        return descriptors(plan(DS.nominal_problem(base, s)))

    static, coef = DS.affine_descriptors(desc_of, g, m)
    assert not coef[2:].any()
    for _ in range(25):
        s = random_splits(rng, m, g, empty=False)
        row0, rows = DS.clamped_rows(np, s, m)
        np.testing.assert_array_equal(rows, s)
        got = DS.device_descriptors(np, static, coef, row0, rows)
        np.testing.assert_array_equal(got, desc_of(s))
    if g == 1 and m:  # one expert holding fewer rows than M: its row count is read
        for c in (0, 1, m // 3):
            row0, rows = DS.clamped_rows(np, np.array([c]), m)
            got = DS.device_descriptors(np, static, coef, row0, rows)
            np.testing.assert_array_equal(got, desc_of([c]))


_QUANTIZED = [("mxfp8", {}), ("mxfp8", {"fp8_dtype": "e5m2"}), ("nvfp4", {}),
              ("nvfp4", {"row_scaled": True}), ("nvfp4", {"rht": True})]


@pytest.mark.parametrize("fmt,opts", _QUANTIZED)
@pytest.mark.parametrize("mode", ["fprop", "dgrad", "wgrad"])
@pytest.mark.parametrize("g,m", [(1, 37), (3, 100), (8, 300), (4, 2)])
def test_quantized_descriptors_are_affine_in_rows_and_blocks(fmt, opts, mode, g, m):
    """Quantized operands: the columnwise copies (wgrad) sit in per-expert blocks of rows, so
    their words follow the block counts; the same coefficients hold for every split."""
    import lowprec_moe as lpm

    if mode == "dgrad" and opts.get("rht"):
        pytest.skip("dgrad reads the weight's untransformed columnwise copy")
    rng = np.random.default_rng(g * 1000 + m)
    n = 96
    x = rng.standard_normal((m, _K)).astype(ml_dtypes.bfloat16)
    dy = rng.standard_normal((m, n)).astype(ml_dtypes.bfloat16)
    w = rng.standard_normal((g * n, _K)).astype(ml_dtypes.bfloat16)
    wq = lpm.GroupedTensor.quantize(w, [n] * g, fmt, columnwise=True,
                                    row_scaled=opts.get("row_scaled", False),
                                    **{k: v for k, v in opts.items() if k == "fp8_dtype"})
    kw = dict(bias=None, probs=None, out_dtype=None, out=None, accumulate=False)
    block = 32 if fmt == "mxfp8" else 16

    def problem(s):
        def q(a):
            return lpm.GroupedTensor.quantize(a, list(s), fmt, columnwise=True, **opts)

        a, b = {"fprop": (lambda: (q(x), wq)), "dgrad": (lambda: (q(dy), wq)),
                "wgrad": (lambda: (q(dy), q(x)))}[mode]()
        return _validate(mode, a, b, list(s), **kw)

    base = problem([m] + [0] * (g - 1))

    def desc_of(s):  # a valid split: its own problem; fewer rows (one expert): the stand-in
        return descriptors(plan(problem(s) if sum(s) == m else DS.nominal_problem(base, s)))

    static, coef = DS.affine_descriptors(desc_of, g, m, block)
    if g == 1:
        for c in (1, m // 3):
            row0, rows = DS.clamped_rows(np, np.array([c]), m)
            blk0, blks = DS.block_counts(np, rows, block)
            got = DS.device_descriptors(np, static, coef, row0, rows, blk0, blks)
            np.testing.assert_array_equal(got, desc_of([c]))
    for _ in range(12):
        s = random_splits(rng, m, g, empty=g > 2)
        row0, rows = DS.clamped_rows(np, s, m)
        blk0, blks = DS.block_counts(np, rows, block)
        got = DS.device_descriptors(np, static, coef, row0, rows, blk0, blks)
        np.testing.assert_array_equal(got, desc_of(s))


def test_a_table_that_is_not_affine_is_refused():
    def desc_of(s):  # a word quadratic in the rows
        d = np.zeros((len(s), 16), np.int64)
        d[:, 3] = np.asarray(s) ** 2
        return d

    with pytest.raises(NotImplementedError, match="not affine"):
        DS.affine_descriptors(desc_of, 4, 100, 16)


@pytest.mark.parametrize("bm", [32, 64, 128])
@pytest.mark.parametrize("g,m", [(1, 37), (4, 512), (7, 300), (16, 16), (9, 0)])
def test_tile_table_lists_the_host_tiles_then_empty_entries(bm, g, m):
    rng = np.random.default_rng(bm + g + m)
    for _ in range(25):
        s = random_splits(rng, m, g, empty=False)
        _, rows = DS.clamped_rows(np, s, m)
        got = DS.device_tile_table(np, rows, m, bm)
        host = tile_table(s, s > 0, bm)
        assert got.dtype == np.int32
        assert got.shape == (DS.max_row_tiles(m, g, bm), 2)
        np.testing.assert_array_equal(got[:len(host)], host)
        pad = got[len(host):].astype(np.int64)
        assert np.all(pad[:, 1] * bm >= m) and np.all(pad[:, 0] == 0)


@pytest.mark.parametrize("g,m", [(1, 37), (4, 512), (7, 300), (3, 0), (16, 1)])
def test_probe_splits_are_the_edge_cases_once_then_random_splits(g, m):
    """Every probe splits M among G experts; the edge cases (all rows in one expert, an even
    split, a one-row expert) are planned once, then six solving and four checking splits."""
    from lowprec_moe.backends.cupy.gemm.device_splits import probe_splits

    probes = probe_splits(g, m)
    n_edges = 4 if g == 1 else (5 if m >= 1 else 3)
    assert len(probes) == n_edges + 6 + 4
    for s in probes:
        assert s.dtype == np.int64 and s.shape == (g,) and (s >= 0).all()
        assert s.sum() == m or g == 1
    assert [int(v) for v in probes[0]] == [m] + [0] * (g - 1)


def test_max_row_tiles_is_the_worst_split():
    rng = np.random.default_rng(3)
    for g, m, bm in [(8, 1000, 128), (3, 5, 64), (16, 4096, 128), (1, 77, 32)]:
        worst = 0
        for _ in range(200):
            s = random_splits(rng, m, g, empty=False)
            worst = max(worst, int(np.sum(-(-s // bm))))
        ones = [1] * min(g, m) + [0] * (g - min(g, m))
        ones[0] += m - sum(ones)
        assert worst <= DS.max_row_tiles(m, g, bm)
        assert int(np.sum(-(-np.asarray(ones) // bm))) <= DS.max_row_tiles(m, g, bm)


def test_clamp_keeps_rows_inside_m():
    """Negative counts act as 0; counts past M are cut at M; valid splits are unchanged."""
    row0, rows = DS.clamped_rows(np, np.array([5, -3, 10, 7], np.int64), 12)
    np.testing.assert_array_equal(row0, [0, 5, 5, 12])
    np.testing.assert_array_equal(rows, [5, 0, 7, 0])
    row0, rows = DS.clamped_rows(np, np.array([3, 4, 5], np.int32), 12)
    np.testing.assert_array_equal(row0, [0, 3, 7])
    np.testing.assert_array_equal(rows, [3, 4, 5])
    assert row0.dtype == np.int64 and rows.dtype == np.int64


def test_expert_of_rows_and_colsum_tiles_match_the_host():
    from lowprec_moe.backends.cupy.reduce import _tiles, device_tiles
    from lowprec_moe.backends.cupy.splits import expert_of_rows

    rng = np.random.default_rng(9)
    for g, m in [(1, 5), (4, 1000), (9, 300), (3, 0), (16, 129)]:
        for _ in range(20):
            s = random_splits(rng, m, g, empty=False)
            _, rows = DS.clamped_rows(np, s, m)
            np.testing.assert_array_equal(expert_of_rows(np, rows, m),
                                          np.repeat(np.arange(g), s))
            for tile_rows in (32, 64, 128):  # the quantizers' orders and the default
                tiles, tile_off = _tiles(s, tile_rows)
                d_tiles, d_off = device_tiles(np, s, m, tile_rows)
                np.testing.assert_array_equal(d_off, tile_off)
                np.testing.assert_array_equal(d_tiles[:len(tiles)], tiles)
                assert not d_tiles[len(tiles):].any()
                assert (np.diff(tiles.reshape(-1, 2), axis=1) <= tile_rows).all()


def test_layer_refuses_device_splits_with_host_tokens(monkeypatch):
    """Device splits need device tokens; checked before any array is touched."""
    import lowprec_moe.layers.linear as L

    class DeviceSplits:  # stands for a cupy array: only is_cupy_array looks at it
        pass

    monkeypatch.setattr(L, "is_cupy_array", lambda a: isinstance(a, DeviceSplits))
    x = np.zeros((4, 32), np.float32)
    with pytest.raises(TypeError, match="numpy"):
        L.check_layer_splits(DeviceSplits(), 4, x)


def test_one_offsets_launch_takes_one_to_four_tile_tables():
    """The launcher refuses a table count the kernel cannot write, before touching the GPU."""
    from lowprec_moe.backends.cupy import splits_kernels as SK

    for tables in ((), (16, 32, 64, 128, 256)):
        with pytest.raises(ValueError, match="one to 4 tile tables"):
            SK.offsets(None, 10, *tables)


def test_member_tables_match_the_activation_host_tables():
    from lowprec_moe.backends.cupy.mxfp8 import tile_offsets
    from lowprec_moe.backends.cupy.splits import max_row_tiles, member_tables

    rng = np.random.default_rng(13)
    for g, m in [(1, 5), (4, 1000), (9, 300), (3, 0), (16, 129)]:
        for _ in range(20):
            s = random_splits(rng, m, g, empty=False)
            rows, tiles = tile_offsets(s)
            row_off, tile_off = member_tables(np, s, m, 32)
            np.testing.assert_array_equal(row_off, rows)
            np.testing.assert_array_equal(tile_off, tiles)
            assert tiles[-1] <= max_row_tiles(m, g, 32)


def test_nvfp4_member_table_is_memoized_read_only_and_right():
    from lowprec_moe.backends.cupy.nvfp4_layout import member_table

    rng = np.random.default_rng(14)
    for g, m in [(1, 5), (4, 1000), (9, 300), (3, 0)]:
        s = random_splits(rng, m, g, empty=True)
        got = member_table(s)
        assert member_table(np.asarray(s))[0] is got[0]
        mp = -(-np.asarray(s, np.int64) // 16) * 16
        for rows in (mp, np.asarray(s, np.int64)):  # the tiles of the padded and the real rows
            want = (np.concatenate([[0], np.cumsum(s)]), np.concatenate([[0], np.cumsum(mp)]),
                    np.concatenate([[0], np.cumsum(-(-rows // 64))]))
            for a, b in zip(got, want):
                np.testing.assert_array_equal(a, b)
                assert a.dtype == np.int64 and not a.flags.writeable


_H100 = ((9, 0), 232448, 132)


def _device_problem(fmt, mode, k, g=4, m=512, n=256):
    import lowprec_moe as lpm

    rng = np.random.default_rng(5)
    x = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
    dy = rng.standard_normal((m, n)).astype(ml_dtypes.bfloat16)
    w = rng.standard_normal((g * n, k)).astype(ml_dtypes.bfloat16)
    even = [m // g] * g
    wq = lpm.GroupedTensor.quantize(w, [n] * g, fmt, columnwise=True)
    xq = lpm.GroupedTensor.quantize(x, even, fmt, columnwise=True)
    dyq = lpm.GroupedTensor.quantize(dy, even, fmt, columnwise=True)
    a, b = {"fprop": (xq, wq), "dgrad": (dyq, wq), "wgrad": (dyq, xq)}[mode]
    kw = dict(bias=None, probs=None, out_dtype=None, out=None, accumulate=False)
    return _validate(mode, a, b, even, **kw)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
@pytest.mark.parametrize("mode", ["fprop", "dgrad", "wgrad"])
@pytest.mark.parametrize("k", [64, 96, 256])
def test_device_split_kernel_computes_every_split(fmt, mode, k):
    """The config chosen for device splits is legal for every probe split (copy width, tensor
    maps, shapes), needs no host-built schedule, and builds the same tensor maps for each."""
    from lowprec_moe.backends.cupy.gemm.select import choose_kernel, illegal
    from lowprec_moe.backends.cupy.gemm.rules import Facts
    from lowprec_moe.backends.cupy.gemm.tma_rules import tma_geometry, tma_map_specs

    if fmt == "mxfp8" and k % 32:
        pytest.skip("MXFP8 needs K in whole blocks")
    p = _device_problem(fmt, mode, k)
    probes = DS.probe_plans(p)
    c = choose_kernel(p, plan(p), _H100, probes=probes).config
    assert not c.persistent and c.loader != "rowpair_tma", c.name
    cap = min(Facts(q, ql, *_H100).chunk for q, ql in probes + [(p, plan(p))])
    assert c.chunk <= cap, c.name
    for q, ql in probes:
        f = Facts(q, ql, *_H100)
        f.__dict__["chunk"] = cap
        assert illegal(c, f) is None, (c.name, q.splits)
        if c.tma:
            assert tma_map_specs(c, tma_geometry(ql)) == tma_map_specs(c, tma_geometry(plan(p)))


def test_nvfp4_transposed_columnwise_rows_take_8_byte_copies():
    """NVFP4 wgrad reads transposed columnwise copies whose rows are Mp / 2 bytes: 8 for an
    expert of up to 16 tokens, so a device-split wgrad copies 8 bytes at a time."""
    from lowprec_moe.backends.cupy.gemm.select import choose_kernel

    p = _device_problem("nvfp4", "wgrad", 64)
    assert choose_kernel(p, plan(p), _H100).config.chunk == 16  # the even split alone
    c = choose_kernel(p, plan(p), _H100, probes=DS.probe_plans(p)).config
    assert c.chunk == 8, c.name


def test_device_split_nvfp4_fprop_keeps_the_fast_kernel():
    """NVFP4 fprop's tensor maps cover whole buffers: the warp-specialised TMA kernel runs
    with device splits as with host ones."""
    from lowprec_moe.backends.cupy.gemm.select import choose_kernel

    p = _device_problem("nvfp4", "fprop", 256, g=8, m=8192, n=1024)
    host = choose_kernel(p, plan(p), _H100).config
    dev = choose_kernel(p, plan(p), _H100, probes=DS.probe_plans(p)).config
    assert dev.role == "ws" and dev.tma and not dev.persistent, (host.name, dev.name)
