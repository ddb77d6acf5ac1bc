"""Shared code of the MoE regression examples (``train_moe_numpy.py`` / ``train_moe_cupy.py``).

A fixed random *teacher* grouped linear layer (float32 weights and bias, one ``[N, K]`` matrix per
expert) maps tokens to targets; a *student* ``lowprec_moe.GroupedLinear`` learns it with plain SGD
on the loss ``L = 1/(2M) * sum_i ||y_i - t_i||^2`` (so ``dy = (y - t) / M``). Routing is fixed:
every batch sends the same number of tokens to each expert (``splits``, skewed on purpose, the last
expert gets none). Each step draws a fresh batch from one seeded stream, so every recipe sees the
same data.

Mixed precision as in framework training: the student keeps float32 master weights, casts them
to bfloat16 for the step, runs forward + backward with the recipe (tokens and gradients are
bfloat16 too), and applies the update to the master copy. The bf16 recipe is the baseline: its
curve shows what the quantized recipes should track.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

try:
    import lowprec_moe as lpm
except ImportError:  # running from a checkout that is not installed
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import lowprec_moe as lpm

import ml_dtypes

from lowprec_moe.demo import demo_splits  # skewed routing, the last expert empty

BF16 = ml_dtypes.bfloat16

RECIPES = {
    "bf16": lpm.Recipe.bf16(),
    "mxfp8": lpm.Recipe.mxfp8(),
    "mxfp8-hybrid": lpm.Recipe.mxfp8(fp8_format="hybrid"),
    "nvfp4": lpm.Recipe.nvfp4(),  # TE defaults: 16x16 weight blocks, RHT + stochastic rounding
    "nvfp4-row-scaled": lpm.Recipe.nvfp4(row_scaled_activation=True),
}


class Teacher:
    """Fixed random grouped linear map (float32), evaluated with plain matmuls per expert."""

    def __init__(self, xp, experts: int, k: int, n: int, seed: int):
        rng = np.random.default_rng(seed)
        self.xp = xp
        self.weight = xp.asarray((rng.standard_normal((experts, n, k)) / np.sqrt(k))
                                 .astype(np.float32))
        self.bias = xp.asarray((0.5 * rng.standard_normal((experts, n))).astype(np.float32))

    def __call__(self, x32, splits):
        xp = self.xp
        out = xp.empty((x32.shape[0], self.weight.shape[1]), dtype=xp.float32)
        lo = 0
        for g, s in enumerate(splits):
            if s:
                out[lo:lo + s] = x32[lo:lo + s] @ self.weight[g].T + self.bias[g]
            lo += s
        return out


def _sync(xp) -> None:
    if xp is not np:
        xp.cuda.get_current_stream().synchronize()


def train(xp, recipe, *, experts: int, k: int, n: int, tokens: int, steps: int, lr: float,
          every: int, seed: int = 0) -> dict:
    """Train one student; return the windowed loss curve, the weight error and the time."""
    splits = demo_splits(tokens, experts)
    teacher = Teacher(xp, experts, k, n, seed=seed + 1)
    layer = lpm.GroupedLinear(experts, k, n, bias=True, recipe=recipe, dtype="bfloat16", xp=xp,
                              seed=seed + 2)
    master_w = layer.weight.astype(xp.float32)
    master_b = layer.bias.astype(xp.float32)
    data = xp.random.RandomState(seed + 3)  # same batches for every recipe
    curve = []
    window = xp.zeros((), dtype=xp.float32)
    _sync(xp)
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        x32 = data.standard_normal((tokens, k)).astype(xp.float32)
        x = x32.astype(BF16)
        target = teacher(x.astype(xp.float32), splits)
        layer.weight = master_w.astype(BF16)
        layer.bias = master_b.astype(BF16)
        y, ctx = layer(x, splits)
        err = y.astype(xp.float32) - target
        window += 0.5 * (err * err).sum() / tokens
        dy = (err / tokens).astype(BF16)
        grads = layer.backward(dy, ctx)
        master_w -= lr * grads.dweight.astype(xp.float32)
        master_b -= lr * grads.dbias.astype(xp.float32)
        if step % every == 0 or step == steps:
            span = every if step % every == 0 else step % every
            curve.append((step, float(window) / span))
            window[...] = 0
    _sync(xp)
    seconds = time.perf_counter() - t0
    used = [g for g, s in enumerate(splits) if s]
    dw = (master_w[used] - teacher.weight[used]).ravel()
    rel_w = float(xp.linalg.norm(dw) / xp.linalg.norm(teacher.weight[used].ravel()))
    return {"curve": curve, "weight_rel_err": rel_w, "seconds": seconds, "splits": splits}


def print_report(results: dict, *, file=None) -> None:
    """Loss table (one column per recipe, bf16 first) and a summary per recipe."""
    out = file if file is not None else sys.stdout
    names = list(results)
    steps = [s for s, _ in results[names[0]]["curve"]]
    width = max(12, *(len(nm) for nm in names))
    print("mean loss over the last steps (0.5 * ||y - t||^2 per token)", file=out)
    print(f"{'step':>6s}  " + "  ".join(f"{nm:>{width}s}" for nm in names), file=out)
    for i, step in enumerate(steps):
        print(f"{step:6d}  " + "  ".join(f"{results[nm]['curve'][i][1]:>{width}.4e}"
                                         for nm in names), file=out)
    base = results.get("bf16")
    print(file=out)
    print(f"{'recipe':18s} {'final loss':>11s} {'x bf16':>8s} {'|W-W*|/|W*|':>12s} "
          f"{'time s':>8s}", file=out)
    for nm in names:
        r = results[nm]
        final = r["curve"][-1][1]
        ratio = f"{final / base['curve'][-1][1]:8.2f}" if base and base["curve"][-1][1] else \
            f"{'-':>8s}"
        print(f"{nm:18s} {final:11.4e} {ratio} {r['weight_rel_err']:12.4e} "
              f"{r['seconds']:8.2f}", file=out)
    print("\nThe quantized recipes level off at the noise of their forward pass (y comes from "
          "quantized x and W);\n|W-W*|/|W*| is the distance of the learned master weights to "
          "the teacher's.", file=out)


def main(xp, argv=None, *, defaults: dict, device: str) -> dict:
    ap = argparse.ArgumentParser(description=f"Tiny MoE regression trained with every "
                                             f"lowprec_moe recipe ({device}).")
    ap.add_argument("--experts", type=int, default=defaults["experts"])
    ap.add_argument("--k", type=int, default=defaults["k"], help="in features")
    ap.add_argument("--n", type=int, default=defaults["n"], help="out features")
    ap.add_argument("--tokens", type=int, default=defaults["tokens"], help="tokens per step")
    ap.add_argument("--steps", type=int, default=defaults["steps"])
    ap.add_argument("--lr", type=float, default=defaults["lr"])
    ap.add_argument("--every", type=int, default=defaults["every"], help="print every N steps")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--recipes", default=",".join(RECIPES),
                    help=f"comma-separated subset of {', '.join(RECIPES)}")
    args = ap.parse_args(argv)
    names = [s.strip() for s in args.recipes.split(",") if s.strip()]
    unknown = [s for s in names if s not in RECIPES]
    if unknown:
        ap.error(f"unknown recipe(s) {unknown}; choose from {list(RECIPES)}")
    if "bf16" in names:  # the baseline column comes first
        names.remove("bf16")
        names.insert(0, "bf16")
    splits = demo_splits(args.tokens, args.experts)
    print(f"MoE regression on {device}: {args.experts} experts, {args.k} -> {args.n}, "
          f"{args.tokens} tokens/step routed as {splits}, {args.steps} SGD steps, lr {args.lr}")
    results = {}
    for nm in names:
        results[nm] = train(xp, RECIPES[nm], experts=args.experts, k=args.k, n=args.n,
                            tokens=args.tokens, steps=args.steps, lr=args.lr, every=args.every,
                            seed=args.seed)
        print(f"  trained {nm:18s} {results[nm]['seconds']:7.2f} s", flush=True)
    print()
    print_report(results)
    return results
