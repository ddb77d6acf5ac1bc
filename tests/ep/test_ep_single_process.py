"""Expert-parallel dispatch / combine in one process (lowprec_moe.ep, group=None) on both
backends: the order of the dispatched rows, the MXFP8 wire's bytes, combine and the backward
against plain loops, and the EP MoE layer against the plain GroupedMLP on the same routing."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import lowprec_moe as lpm
from lowprec_moe import ep

from conftest import assert_bytes_equal, to_host

T, K, N, E, TOPK = 48, 64, 32, 6, 2


def _routing(xp, seed=0, skew=False):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, K)).astype(ml_dtypes.bfloat16)
    if skew:  # experts 4 and 5 get nothing, expert 0 most tokens
        idx = np.stack([np.zeros(T, np.int64), rng.integers(1, 4, T)], axis=1)
    else:
        idx = np.stack([rng.permutation(E)[:TOPK] for _ in range(T)])
    w = rng.random((T, TOPK)).astype(np.float32)
    w /= w.sum(axis=1, keepdims=True)
    return xp.asarray(x), xp.asarray(idx), xp.asarray(w)


def _order(idx):
    """The dispatched pairs (token, slot), expert-major, then token, then slot."""
    pairs = [(int(e), t, j) for t, row in enumerate(idx) for j, e in enumerate(row)]
    return sorted(pairs)


@pytest.mark.parametrize("skew", [False, True])
def test_dispatch_order_and_splits(xp, skew):
    x, idx, w = _routing(xp, 1, skew)
    tokens, splits, h = ep.dispatch(x, idx, w, E, wire="bf16")
    want = _order(to_host(idx))
    assert splits == tuple(int((to_host(idx) == e).sum()) for e in range(E))
    assert [int(t) for t in to_host(h.token)] == [t for _, t, _ in want]
    pos = to_host(h.position)
    for row, (_, t, j) in enumerate(want):
        assert pos[t, j] == row
    assert_bytes_equal(tokens, to_host(x)[[t for _, t, _ in want]], "bf16 rows")


def test_mxfp8_wire_is_the_quantized_rows(xp):
    """Each token is quantized once and its bytes copied: the wire equals quantizing the
    dispatched rows, byte for byte (rowwise MXFP8 scales belong to one row)."""
    x, idx, w = _routing(xp, 2)
    wire, splits, h = ep.dispatch(x, idx, w, E)
    rows = x[h.token]
    ref = lpm.GroupedTensor.quantize(rows, splits, "mxfp8")
    assert_bytes_equal(wire.rowwise_data, ref.rowwise_data, "wire data")
    assert_bytes_equal(wire.rowwise_scale, ref.rowwise_scale, "wire scales")
    assert wire.splits == splits


def test_combine_and_backward_match_loops(xp):
    x, idx, w = _routing(xp, 3)
    _, splits, h = ep.dispatch(x, idx, w, E, wire="bf16")
    rng = np.random.default_rng(4)
    eo = rng.standard_normal((T * TOPK, N)).astype(np.float32)
    dy = rng.standard_normal((T, N)).astype(np.float32)
    y = ep.combine(xp.asarray(eo), h)
    pos, wh = to_host(h.position), to_host(w)
    want = np.zeros((T, N), np.float32)
    for j in range(TOPK):
        want += wh[:, j, None] * eo[pos[:, j]]
    assert_bytes_equal(y, want, "combine")
    d_eo, d_w = ep.combine_backward(xp.asarray(dy), xp.asarray(eo), h)
    for t in range(T):
        for j in range(TOPK):
            assert_bytes_equal(d_eo[int(pos[t, j])], wh[t, j] * dy[t], f"d_expert_out {t},{j}")
    np.testing.assert_allclose(to_host(d_w), np.einsum("tn,tjn->tj", dy, eo[pos]), rtol=1e-5,
                               atol=1e-5)
    dx = ep.dispatch_backward(xp.asarray(eo[:, :K // 2]), h)
    assert_bytes_equal(dx, eo[pos[:, 0], :K // 2] + eo[pos[:, 1], :K // 2], "dispatch_backward")


@pytest.mark.parametrize("skew", [False, True])
def test_ep_mlp_equals_plain_grouped_mlp(xp, skew):
    """The EP MoE layer (dispatch as the MXFP8 wire, GroupedMLP on the local experts, combine)
    equals the plain GroupedMLP on the same routing fed the dispatched bf16 rows, bitwise --
    forward, dx and the weight gradients -- with experts that get no tokens when skewed."""
    x, idx, w = _routing(xp, 5, skew)
    rng = np.random.default_rng(6)
    f = 64
    w1 = xp.asarray((rng.standard_normal((E, 2 * f, K)) * 0.1).astype(ml_dtypes.bfloat16))
    w2 = xp.asarray((rng.standard_normal((E, N, f)) * 0.1).astype(ml_dtypes.bfloat16))
    recipe = lpm.Recipe.mxfp8()
    wire, splits, h = ep.dispatch(x, idx, w, E)
    out, ctx = lpm.grouped_mlp_forward(wire, splits, w1, w2, recipe=recipe)
    rows, _, _ = ep.dispatch(x, idx, w, E, wire="bf16")
    ref, ctx_ref = lpm.grouped_mlp_forward(rows, splits, w1, w2, recipe=recipe)
    assert_bytes_equal(out, ref, "expert outputs")
    y = ep.combine(out, h)
    assert y.shape == (T, N)
    dy = xp.asarray(rng.standard_normal((T, N)).astype(ml_dtypes.bfloat16))
    d_out, _ = ep.combine_backward(dy, out, h)
    g = lpm.grouped_mlp_backward(d_out, ctx)
    g_ref = lpm.grouped_mlp_backward(d_out, ctx_ref)
    assert_bytes_equal(g.dfc1_weight, g_ref.dfc1_weight, "dfc1_weight")
    assert_bytes_equal(g.dfc2_weight, g_ref.dfc2_weight, "dfc2_weight")
    assert_bytes_equal(g.dx, g_ref.dx, "dx")
    dx = ep.dispatch_backward(g.dx, h)
    assert dx.shape == (T, K) and dx.dtype == g.dx.dtype
    # dy may travel as the MXFP8 wire too: equal to quantizing the bf16 gradient rows
    d_wire, _ = ep.combine_backward(dy, out, h, wire="mxfp8", fp8_dtype=recipe.dy_fp8_dtype)
    _, ctx_w = lpm.grouped_mlp_forward(wire, splits, w1, w2, recipe=recipe)
    _, ctx_b = lpm.grouped_mlp_forward(wire, splits, w1, w2, recipe=recipe)
    d_bf16, _ = ep.combine_backward(dy, out, h, wire="bf16")
    gw = lpm.grouped_mlp_backward(d_wire, ctx_w)
    gb = lpm.grouped_mlp_backward(d_bf16, ctx_b)
    assert_bytes_equal(gw.dx, gb.dx, "dx from the dy wire")
    assert_bytes_equal(gw.dfc2_weight, gb.dfc2_weight, "dfc2_weight from the dy wire")


def test_refusals():
    x, idx, w = _routing(np, 7)
    with pytest.raises(TypeError, match="group="):
        ep.dispatch(x, idx, w, E, group=object())
    with pytest.raises(ValueError, match="wire="):
        ep.dispatch(x, idx, w, E, wire="fp4")
    with pytest.raises(ValueError, match="outside"):
        ep.dispatch(x, idx + E, w, E)
    with pytest.raises(ValueError, match="topk_weights.shape"):
        ep.dispatch(x, idx, w[:, :1], E)
    with pytest.raises(TypeError, match="integer"):
        ep.dispatch(x, idx.astype(np.float32), w, E)
    _, _, h = ep.dispatch(x, idx, w, E)
    with pytest.raises(ValueError, match="dispatched rows"):
        ep.combine(np.zeros((T, N), np.float32), h)


def test_example_runs_on_the_cpu():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, str(root / "examples" / "ep_moe.py"), "--tokens", "64"],
                         capture_output=True, text=True, cwd=root, timeout=300)
    assert out.returncode == 0, out.stderr
    ratio = float(out.stdout.split("(")[-1].split(" of bf16")[0])
    assert ratio <= 0.53, out.stdout
