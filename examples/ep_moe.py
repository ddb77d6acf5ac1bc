"""An expert-parallel MoE layer step: router top-k, dispatch as the MXFP8 wire, GroupedMLP on
this rank's experts, combine; then the backward through all three.

    python examples/ep_moe.py [--device cpu|gpu] [--tokens 256] [--wire mxfp8|bf16]
    python -m lowprec_moe.ep.launch --nproc 2 examples/ep_moe.py --device gpu
    python examples/ep_moe.py --threads 2        # the multi-rank algorithm in threads (CPU)

Alone, one process holds every expert (``group=None``). Under the launcher (one process per
GPU, NCCL), rank ``r`` holds experts ``r E/N .. (r+1) E/N - 1`` and routes its own ``--tokens``
tokens; ``--threads N`` runs N ranks as threads of this process over NumPy (or CuPy) arrays.
Rank 0 prints.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import ml_dtypes
import numpy as np

try:
    import lowprec_moe as lpm
except ImportError:  # running from a checkout that is not installed
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import lowprec_moe as lpm

from lowprec_moe import ep


def softmax_topk(logits, k):
    """Top-k experts per token and their softmax weights (renormalised over the k)."""
    idx = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    top = np.take_along_axis(logits, idx, axis=1)
    w = np.exp(top - top.max(axis=1, keepdims=True))
    return idx, (w / w.sum(axis=1, keepdims=True)).astype(np.float32)


def step(xp, group, args) -> None:
    """One forward + backward of the EP layer on this rank (``group`` None: every expert)."""
    rank, size = (0, 1) if group is None else (group.rank, group.size)
    t, k, e, f = args.tokens, args.hidden, args.experts, args.ffn
    if e % size:
        raise SystemExit(f"--experts={e} must be a multiple of the number of ranks {size}")
    el = e // size
    # every rank draws the same router and experts, and its own tokens
    shared = np.random.default_rng(0)
    router = (shared.standard_normal((k, e)) * 0.1).astype(np.float32)
    w1 = (shared.standard_normal((e, 2 * f, k)) * 0.05).astype(ml_dtypes.bfloat16)
    w2 = (shared.standard_normal((e, k, f)) * 0.05).astype(ml_dtypes.bfloat16)
    rng = np.random.default_rng(1 + rank)
    x = rng.standard_normal((t, k)).astype(np.float32)
    dy = rng.standard_normal((t, k)).astype(ml_dtypes.bfloat16)
    recipe = lpm.Recipe.mxfp8()  # with the bf16 wire, the experts quantize what they receive

    idx, weights = softmax_topk(x @ router, args.topk)  # the router stays in the framework
    mine = slice(rank * el, (rank + 1) * el)
    y, ctx = ep.moe_forward(xp.asarray(x.astype(ml_dtypes.bfloat16)), xp.asarray(idx),
                            xp.asarray(weights), xp.asarray(w1[mine]), xp.asarray(w2[mine]),
                            recipe=recipe, group=group, wire=args.wire)
    grads = ep.moe_backward(xp.asarray(dy), ctx)

    if rank == 0:
        print(f"ranks: {size}, experts per rank: {el}, wire: {args.wire}")
        print(f"rank 0 tokens per local expert: {list(ctx.handle.splits)}")
        print(f"y {tuple(y.shape)} {y.dtype}, dx {tuple(grads.dx.shape)} {grads.dx.dtype}, "
              f"d_weights {tuple(grads.dtopk_weights.shape)}, "
              f"dfc1 {tuple(grads.dfc1_weight.shape)}")
        row = k + k // 32 if args.wire == "mxfp8" else 2 * k
        moved = t * args.topk * row
        print(f"bytes dispatched: {moved} ({moved / (t * args.topk * k * 2):.3f} of bf16)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    ap.add_argument("--tokens", type=int, default=256, help="tokens per rank")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--ffn", type=int, default=128)
    ap.add_argument("--experts", type=int, default=8, help="experts of all ranks together")
    ap.add_argument("--topk", type=int, default=2)
    ap.add_argument("--wire", choices=["mxfp8", "bf16"], default="mxfp8")
    ap.add_argument("--threads", type=int, default=1,
                    help="run this many ranks as threads of one process (no launcher)")
    args = ap.parse_args()
    launched = "WORLD_SIZE" in os.environ
    if launched and args.threads != 1:
        ap.error("--threads runs ranks in one process; do not combine it with the launcher")
    if launched and args.device != "gpu":
        ap.error("under the launcher the ranks talk over NCCL: pass --device gpu")
    if args.device == "gpu":
        import cupy as xp
    else:
        xp = np
    if launched:
        with ep.init_process_group() as group:
            step(xp, group, args)
    elif args.threads > 1:
        ep.run_threads(lambda group: step(xp, group, args), args.threads)
    else:
        step(xp, None, args)


if __name__ == "__main__":
    main()
