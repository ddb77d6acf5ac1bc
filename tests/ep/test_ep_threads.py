"""The multi-rank expert-parallel algorithm on the CPU: every rank of a ThreadGroup (one thread
per rank, NumPy arrays, the same dispatch / combine code the NCCL group runs) against one
process running the whole model, byte for byte -- outputs, token and routing-weight gradients,
the local experts' weight gradients -- for world sizes 2 and 4, with skewed routing (experts
that get no tokens), ranks that receive nothing and a rank without tokens."""

from __future__ import annotations

import numpy as np
import pytest

import _ep_cases as C
from lowprec_moe import ep

from conftest import assert_bytes_equal


@pytest.mark.parametrize("wires", list(C.WIRES))
@pytest.mark.parametrize("case", C.CASES)
@pytest.mark.parametrize("world", [2, 4])
def test_every_rank_equals_the_whole_model(world, case, wires):
    p = C.problem(world, case)
    ref = C.reference(np, p, wires)
    results = ep.run_threads(lambda g: C.run_rank(g, np, p, wires), world)
    bad = [m for r in range(world) for m in C.mismatches(r, world, results[r], ref, p)]
    assert not bad, "\n".join(bad)
    if case == "receives_nothing":
        assert sum(results[-1]["splits"]) == 0
    if case == "no_tokens":
        assert results[1]["y"].shape == (0, C.K) and results[1]["dx"].shape == (0, C.K)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_collectives(world):
    bad = ep.run_threads(lambda g: C.collective_mismatches(g, np), world)
    assert not any(bad), bad


@pytest.mark.parametrize("world", [2, 4])
def test_float32_sums_keep_slot_order(world):
    """float32 expert rows and top-4, where a change of summation order shows in the last
    bits: combine, combine_backward and dispatch_backward on every rank equal one process."""
    e, k, h = 8, 4, 64
    rng = np.random.default_rng(world)
    tokens = [int(t) for t in rng.integers(5, 30, world)]
    off = np.concatenate([[0], np.cumsum(tokens)])
    t = int(off[-1])
    x = rng.standard_normal((t, h)).astype(np.float32)
    idx = np.stack([rng.permutation(e)[:k] for _ in range(t)])
    w = rng.random((t, k)).astype(np.float32)
    dy = rng.standard_normal((t, h)).astype(np.float32)
    gain = (rng.random(e) + 0.5).astype(np.float32) * np.float32(np.pi)

    def experts(rows, splits, first):
        ids = first + np.repeat(np.arange(len(splits)), splits)
        shift = np.float32(1 / 3) * ids[:, None].astype(np.float32)
        return rows.astype(np.float32) * gain[ids, None] + shift

    def run(group, lo, hi, first):
        rows, splits, hd = ep.dispatch(x[lo:hi], idx[lo:hi], w[lo:hi], e, group=group,
                                       wire="bf16")
        out = experts(rows, splits, first)
        y = ep.combine(out, hd, out_dtype="float32")
        d_out, d_w = ep.combine_backward(dy[lo:hi], out, hd)
        dx = ep.dispatch_backward(out, hd)
        return dict(y=y, d_out=d_out, d_w=d_w, dx=dx, splits=splits)

    ref = run(None, 0, t, 0)
    el = e // world

    def rank(g):
        return run(g, int(off[g.rank]), int(off[g.rank + 1]), g.rank * el)

    res = ep.run_threads(rank, world)
    rows_off = np.concatenate([[0], np.cumsum(ref["splits"])])
    for r, got in enumerate(res):
        lo, hi = int(off[r]), int(off[r + 1])
        assert got["y"].dtype == np.float32
        assert_bytes_equal(got["y"], ref["y"][lo:hi], f"rank {r} y")
        assert_bytes_equal(got["d_w"], ref["d_w"][lo:hi], f"rank {r} d_weights")
        assert_bytes_equal(got["dx"], ref["dx"][lo:hi], f"rank {r} dx")
        a, b = int(rows_off[r * el]), int(rows_off[(r + 1) * el])
        assert_bytes_equal(got["d_out"], ref["d_out"][a:b], f"rank {r} d_expert_out")


def _small(rank_tokens=6, k_hidden=32, e=4):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rank_tokens, k_hidden)).astype(np.float32)
    idx = np.stack([rng.permutation(e)[:2] for _ in range(rank_tokens)])
    return x, idx, np.full((rank_tokens, 2), 0.5, np.float32)


def test_ranks_must_dispatch_alike():
    """A rank that dispatches another K (or wire) is caught at the counts exchange, on every
    rank, instead of corrupting the exchange."""
    x, idx, w = _small()

    def fn(g):
        xs = x if g.rank == 0 else np.concatenate([x, x], axis=1)
        return ep.dispatch(xs, idx, w, 4, group=g)

    with pytest.raises(ValueError, match="every rank must dispatch alike"):
        ep.run_threads(fn, 2)

    def fn_wire(g):
        return ep.dispatch(x, idx, w, 4, group=g, wire="bf16" if g.rank else "mxfp8")

    with pytest.raises(ValueError, match="wire="):
        ep.run_threads(fn_wire, 2)

    errors = []

    def fn_range(g):
        try:
            ep.dispatch(x, idx + 4 * g.rank, w, 4, group=g)
        except ValueError as exc:
            errors.append((g.rank, str(exc)))

    ep.run_threads(fn_range, 2)
    assert sorted(errors) == [(0, "rank 1's topk_idx holds experts outside [0, 4); no rank "
                                  "dispatched"),
                              (1, "topk_idx holds experts outside [0, 4)")]


def test_group_refusals():
    x, idx, w = _small()

    def fn(g):
        with pytest.raises(ValueError, match="multiple of the group's size"):
            ep.dispatch(x, idx, w, 3, group=g)
        tokens, splits, h = ep.dispatch(x, idx, w, 4, group=g, wire="bf16")
        out = np.ones((h.num_rows, 8), np.float32)
        with pytest.raises(ValueError, match="call\\s+combine"):
            ep.combine_backward(np.ones((6, 8), np.float32), out, h)
        with pytest.raises(ValueError, match=r"\[R="):
            ep.combine(np.ones((h.num_rows + 1, 8), np.float32), h)
        with pytest.raises(TypeError, match="handle"):
            ep.combine(out, object())
        y = ep.combine(out, h)
        assert y.shape == (6, 8)
        return True

    assert ep.run_threads(fn, 2) == [True, True]


def test_moe_layer_refusals():
    x, idx, w = _small()
    w1 = np.zeros((4, 16, 32), np.float32)
    w2 = np.zeros((4, 32, 8), np.float32)
    import lowprec_moe as lpm

    with pytest.raises(ValueError, match="wire='mxfp8' needs Recipe.mxfp8"):
        ep.moe_forward(x, idx, w, w1, w2, recipe=lpm.Recipe.bf16())
    with pytest.raises(ValueError, match="dy_wire='mxfp8'"):
        ep.moe_forward(x, idx, w, w1, w2, recipe=lpm.Recipe.bf16(), wire="bf16",
                       dy_wire="mxfp8")
    with pytest.raises(TypeError, match="recipe"):
        ep.moe_forward(x, idx, w, w1, w2, recipe="mxfp8")
    with pytest.raises(TypeError, match="ctx"):
        ep.moe_backward(x, None)


def test_run_threads_reports_the_failing_rank_and_does_not_hang():
    class Boom(Exception):
        pass

    def fn(g):
        if g.rank == 1:
            raise Boom("rank 1 fails before the collective")
        return g.all_to_all(np.zeros((g.size, 1), np.int64))

    with pytest.raises(Boom, match="rank 1 fails"):
        ep.run_threads(fn, 3, timeout=30)


def test_thread_group_checks_counts():
    def fn(g):
        with pytest.raises(ValueError, match="sum\\(send_counts\\)"):
            g.all_to_all_v([np.zeros((3, 2))], [1, 1], [1, 1])
        with pytest.raises(ValueError, match="2 entries"):
            g.all_to_all_v([np.zeros((3, 2))], [3], [3])
        return True

    assert ep.run_threads(fn, 2) == [True, True]
    with pytest.raises(ValueError, match="size="):
        ep.ThreadGroup.create(0)


def test_example_runs_ranks_in_threads():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, str(root / "examples" / "ep_moe.py"), "--threads", "2",
                          "--tokens", "48", "--hidden", "64", "--ffn", "32"],
                         capture_output=True, text=True, cwd=root, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "ranks: 2, experts per rank: 4" in out.stdout
    assert out.stdout.count("bytes dispatched") == 1  # rank 0 prints
