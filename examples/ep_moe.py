"""An expert-parallel MoE layer step in one process: router top-k, dispatch as the MXFP8 wire,
GroupedMLP on the experts, combine; then the backward through all three.

    python examples/ep_moe.py [--device cpu|gpu] [--tokens 256] [--wire mxfp8|bf16]

Multi-process expert parallelism (an NCCL group) is not implemented yet: ``group=None`` runs
every expert here.
"""

from __future__ import annotations

import argparse

import ml_dtypes
import numpy as np

import lowprec_moe as lpm
from lowprec_moe import ep


def softmax_topk(logits, k):
    """Top-k experts per token and their softmax weights (renormalised over the k)."""
    idx = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    top = np.take_along_axis(logits, idx, axis=1)
    w = np.exp(top - top.max(axis=1, keepdims=True))
    return idx, (w / w.sum(axis=1, keepdims=True)).astype(np.float32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--ffn", type=int, default=128)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--topk", type=int, default=2)
    ap.add_argument("--wire", choices=["mxfp8", "bf16"], default="mxfp8")
    args = ap.parse_args()
    if args.device == "gpu":
        import cupy as xp
    else:
        xp = np
    rng = np.random.default_rng(0)
    t, k, e, f = args.tokens, args.hidden, args.experts, args.ffn
    x = rng.standard_normal((t, k)).astype(np.float32)
    router = (rng.standard_normal((k, e)) * 0.1).astype(np.float32)
    w1 = (rng.standard_normal((e, 2 * f, k)) * 0.05).astype(ml_dtypes.bfloat16)
    w2 = (rng.standard_normal((e, k, f)) * 0.05).astype(ml_dtypes.bfloat16)
    recipe = lpm.Recipe.mxfp8()

    idx, weights = softmax_topk(x @ router, args.topk)  # the router stays in the framework
    xb, w1, w2 = (xp.asarray(a) for a in (x.astype(ml_dtypes.bfloat16), w1, w2))
    tokens, splits, handle = ep.dispatch(xb, xp.asarray(idx), xp.asarray(weights), e,
                                         wire=args.wire)
    out, ctx = lpm.grouped_mlp_forward(tokens, splits, w1, w2, recipe=recipe)
    y = ep.combine(out, handle)

    dy = xp.asarray(rng.standard_normal(y.shape).astype(ml_dtypes.bfloat16))
    d_out, d_weights = ep.combine_backward(dy, out, handle, wire=args.wire,
                                           fp8_dtype=recipe.dy_fp8_dtype)
    grads = lpm.grouped_mlp_backward(d_out, ctx)
    dx = ep.dispatch_backward(grads.dx, handle)

    print(f"tokens per expert: {list(splits)}  (wire: {args.wire})")
    print(f"y {tuple(y.shape)} {y.dtype}, dx {tuple(dx.shape)} {dx.dtype}, "
          f"d_weights {tuple(d_weights.shape)}, dfc1 {tuple(grads.dfc1_weight.shape)}")
    moved = (tokens.rowwise_data.nbytes + tokens.rowwise_scale.nbytes if args.wire == "mxfp8"
             else tokens.nbytes)
    print(f"bytes dispatched: {moved} ({moved / (t * args.topk * k * 2):.3f} of bf16)")


if __name__ == "__main__":
    main()
