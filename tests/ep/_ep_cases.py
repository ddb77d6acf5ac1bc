"""The multi-rank expert-parallel checks, shared by the thread-group tests (NumPy, one process)
and the multi-GPU worker (CuPy, NCCL, one process per GPU under the launcher).

A *problem* is a whole model's data on the host, the same on every rank (fixed seeds): every
rank's tokens, routing and dy, and all experts' weights. :func:`reference` runs the whole model
in one process (``group=None``, every expert); :func:`run_rank` runs one rank's share with a
group; :func:`mismatches` compares the two byte for byte.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

import lowprec_moe as lpm
from lowprec_moe import ep

K, F, E, TOPK = 64, 32, 8, 3
CASES = ("uniform", "skewed", "receives_nothing", "no_tokens")
#: (recipe name, wire, dy_wire)
WIRES = {
    "mxfp8": ("mxfp8", "mxfp8", "mxfp8"),
    "mxfp8-hybrid": ("mxfp8-hybrid", "mxfp8", "mxfp8"),
    "mxfp8-bf16-wire": ("mxfp8", "bf16", "bf16"),
    "bf16": ("bf16", "bf16", "bf16"),
    # stochastic rounding: the ranks' experts round as the global experts of one process
    "nvfp4-sr": ("nvfp4", "bf16", "bf16"),
}


def recipe_of(name: str):
    return {"mxfp8": lpm.Recipe.mxfp8(), "mxfp8-hybrid": lpm.Recipe.mxfp8(fp8_format="hybrid"),
            "bf16": lpm.Recipe.bf16(), "nvfp4": lpm.Recipe.nvfp4()}[name]


def problem(world: int, case: str, seed: int = 0) -> dict:
    """Host data of a whole model split over ``world`` ranks.

    Cases: ``uniform`` (top-3 of all experts), ``skewed`` (slot 0 always expert 0, slots 1
    and 2 one of two each: half the experts get nothing), ``receives_nothing`` (only the
    experts of the first half of the ranks: the others receive no row), ``no_tokens`` (rank 1
    has no tokens: it sends nothing).
    """
    if case not in CASES:
        raise ValueError(f"case={case!r} must be one of {CASES}")
    if E % world or world < 2:
        raise ValueError(f"world={world} must be >= 2 and divide E={E}")
    rng = np.random.default_rng(1000 * world + CASES.index(case) + seed)
    tokens = [int(t) for t in rng.integers(17, 41, world)]
    if case == "no_tokens":
        tokens[1] = 0
    t = sum(tokens)
    el = E // world
    if case == "uniform" or case == "no_tokens":
        idx = np.stack([rng.permutation(E)[:TOPK] for _ in range(t)]) if t else \
            np.zeros((0, TOPK), np.int64)
    elif case == "skewed":
        idx = np.stack([np.zeros(t, np.int64), rng.choice([1, 2], t), rng.choice([3, E - 1], t)],
                       axis=1)
    else:
        first = max(el, TOPK, (world // 2) * el)
        idx = np.stack([rng.permutation(first)[:TOPK] for _ in range(t)])
    w = rng.random((t, TOPK)).astype(np.float32) + np.float32(0.05)
    w /= w.sum(axis=1, keepdims=True)
    return dict(
        world=world, case=case, tokens=tokens,
        offsets=np.concatenate([[0], np.cumsum(tokens)]).astype(np.int64),
        x=rng.standard_normal((t, K)).astype(ml_dtypes.bfloat16),
        idx=idx.astype(np.int64),
        w=w,
        w1=(rng.standard_normal((E, 2 * F, K)) * 0.1).astype(ml_dtypes.bfloat16),
        w2=(rng.standard_normal((E, K, F)) * 0.1).astype(ml_dtypes.bfloat16),
        dy=rng.standard_normal((t, K)).astype(ml_dtypes.bfloat16),
    )


def _step(xp, x, idx, w, w1, w2, dy, recipe_name: str, wire: str, dy_wire: str, group):
    recipe = recipe_of(recipe_name)
    y, ctx = ep.moe_forward(xp.asarray(x), xp.asarray(idx), xp.asarray(w), xp.asarray(w1),
                            xp.asarray(w2), recipe=recipe, group=group, wire=wire,
                            dy_wire=dy_wire)
    g = ep.moe_backward(xp.asarray(dy), ctx)
    return dict(y=y, dx=g.dx, dw=g.dtopk_weights, dfc1=g.dfc1_weight, dfc2=g.dfc2_weight,
                splits=ctx.handle.splits)


def reference(xp, p: dict, wires: str) -> dict:
    """The whole model in one process: every rank's tokens, every expert."""
    return _step(xp, p["x"], p["idx"], p["w"], p["w1"], p["w2"], p["dy"], *WIRES[wires], None)


def run_rank(group, xp, p: dict, wires: str) -> dict:
    """This rank's share: its tokens, its experts, exchanged through ``group``."""
    r, el = group.rank, E // group.size
    lo, hi = int(p["offsets"][r]), int(p["offsets"][r + 1])
    e0, e1 = r * el, (r + 1) * el
    return _step(xp, p["x"][lo:hi], p["idx"][lo:hi], p["w"][lo:hi], p["w1"][e0:e1],
                 p["w2"][e0:e1], p["dy"][lo:hi], *WIRES[wires], group)


def _host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def _same_bytes(a, b) -> str | None:
    a, b = _host(a), _host(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"shape/dtype {a.shape} {a.dtype} != {b.shape} {b.dtype}"
    av = np.ascontiguousarray(a).view(np.uint8).reshape(-1)
    bv = np.ascontiguousarray(b).view(np.uint8).reshape(-1)
    bad = np.flatnonzero(av != bv)
    if bad.size:
        i = int(bad[0]) // max(a.dtype.itemsize, 1)
        where = tuple(int(v) for v in np.unravel_index(i, a.shape))
        return f"{bad.size} bytes differ, first in element {where}"
    return None


def mismatches(rank: int, world: int, local: dict, ref: dict, p: dict) -> list:
    """Byte comparisons of one rank's results with its share of the whole model's."""
    lo, hi = int(p["offsets"][rank]), int(p["offsets"][rank + 1])
    el = E // world
    e0, e1 = rank * el, (rank + 1) * el
    want = dict(y=ref["y"][lo:hi], dx=ref["dx"][lo:hi], dw=ref["dw"][lo:hi],
                dfc1=ref["dfc1"][e0:e1], dfc2=ref["dfc2"][e0:e1])
    out = []
    if tuple(local["splits"]) != tuple(ref["splits"][e0:e1]):
        out.append(f"splits {local['splits']} != {ref['splits'][e0:e1]}")
    for name, w in want.items():
        msg = _same_bytes(local[name], w)
        if msg:
            out.append(f"{name}: {msg}")
    return [f"rank {rank}/{world} {p['case']}: {m}" for m in out]


def collective_mismatches(group, xp) -> list:
    """all_to_all and all_to_all_v on rank-stamped data, zero counts included."""
    r, w = group.rank, group.size
    bad = []
    send = xp.arange(w * 3, dtype=xp.int64).reshape(w, 3) + 100 * r
    got = _host(group.all_to_all(send))
    want = np.stack([np.arange(3) + 3 * r + 100 * s for s in range(w)])
    if not np.array_equal(got, want):
        bad.append(f"rank {r}: all_to_all gave {got.tolist()}, expected {want.tolist()}")
    # rank s sends (s + d) % 3 rows to rank d: some pairs send nothing
    counts = [(r + d) % 3 for d in range(w)]
    recv = [(s + r) % 3 for s in range(w)]
    rows = np.concatenate([np.full((c, 5), 10 * r + d, np.uint8) for d, c in enumerate(counts)])
    wide = np.repeat(rows[:, :1].astype(np.float32), 7, axis=1) * np.float32(0.5)
    out_rows, out_wide = group.all_to_all_v([xp.asarray(rows), xp.asarray(wide)], counts, recv)
    want_rows = np.concatenate([np.full((c, 5), 10 * s + r, np.uint8) for s, c in
                                enumerate(recv)])
    want_wide = np.repeat(want_rows[:, :1].astype(np.float32), 7, axis=1) * np.float32(0.5)
    if not (np.array_equal(_host(out_rows), want_rows)
            and np.array_equal(_host(out_wide), want_wide)):
        bad.append(f"rank {r}: all_to_all_v delivered the wrong rows")
    return bad
