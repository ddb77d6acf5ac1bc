"""Expert-parallel dispatch + combine and the EP layer step: MXFP8 wire vs bf16, over NCCL.

Usage (one process per GPU, started by the launcher; rank 0 prints)::

    python -m lowprec_moe.ep.launch --nproc 2 benchmarks/bench_ep.py
    python -m lowprec_moe.ep.launch --nproc 2 benchmarks/bench_ep.py --tokens 4096 --no-layer
    python -m lowprec_moe.ep.launch --nproc 2 benchmarks/bench_ep.py --quick     # small shapes
    python benchmarks/bench_ep.py --quick --threads 2     # CPU smoke test (NumPy, threads)

Shapes (DeepSeek-V3-like): tokens per rank 4096 and 16384, hidden 7168, top-8 of 256 experts
(uniform random routing, distinct experts per token), expert FFN 2048 (SwiGLU: fc1 7168 -> 4096,
fc2 2048 -> 7168); each rank holds 256 / N experts.

Rows measured:

* ``dispatch`` -- :func:`lowprec_moe.ep.dispatch` as a user calls it: sort by expert, quantize
  the tokens (MXFP8 wire: one kernel, then a gather of the copies' rows) or gather the bf16
  rows, the counts all-to-all and its host read, the all-to-all-v, the sort by local expert.
* ``combine`` -- :func:`lowprec_moe.ep.combine` of bf16 expert outputs (the same for both wires):
  the all-to-all-v back and the weighted sum in slot order.
* ``dispatch+combine`` -- the two in a row.
* ``layer step`` -- :func:`lowprec_moe.ep.moe_forward` + :func:`lowprec_moe.ep.moe_backward`
  with the MXFP8 recipe on the local experts: tokens and output gradients travel as the MXFP8
  wire, or as bf16 (then the experts quantize what they receive).

Bytes: what this rank sends to the other ranks (its own share stays on the GPU): per dispatched
row ``K + K/32`` bytes (MXFP8) or ``2 K`` (bf16); combine sends ``2 N`` per row.

Timing: random data, warm-up, then samples between CUDA events (``perf_counter`` on the CPU),
each sample preceded by a barrier so that all ranks start together; per rank the median, and
the table shows the slowest rank's median (a collective finishes with its slowest member).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

try:
    import lowprec_moe as lpm
except ImportError:  # running from a checkout that is not installed
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import lowprec_moe as lpm

import ml_dtypes  # noqa: E402

from lowprec_moe import ep  # noqa: E402

BF16 = ml_dtypes.bfloat16
QUICK = dict(tokens="256,512", hidden=1024, experts=16, topk=4, ffn=256)


class Rank:
    """One rank's array module, group, random data and timers."""

    def __init__(self, group, xp, gpu: bool):
        self.group, self.xp, self.gpu = group, xp, gpu

    def randn(self, shape, seed: int, scale: float = 1.0):
        if self.gpu:
            a = self.xp.random.RandomState(seed).standard_normal(shape, dtype=self.xp.float32)
        else:
            a = np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)
        if scale != 1.0:
            a *= np.float32(scale)  # in place: the fc1 weights of 128 experts are 15 GB here
        return a.astype(BF16)

    def routing(self, t: int, e: int, k: int, seed: int):
        """Top-k distinct experts per token, uniform at random, and normalised weights."""
        xp = self.xp
        if self.gpu:
            rs = xp.random.RandomState(seed)
            scores, w = rs.random_sample((t, e)), rs.random_sample((t, k))
        else:
            rng = np.random.default_rng(seed)
            scores, w = rng.random((t, e)), rng.random((t, k))
        idx = xp.argsort(scores, axis=1)[:, :k].astype(xp.int64)
        w = (w + 0.1).astype(xp.float32)
        return xp.ascontiguousarray(idx), w / w.sum(axis=1, keepdims=True)

    def sync(self) -> None:
        if self.gpu:
            self.xp.cuda.get_current_stream().synchronize()

    def barrier(self) -> None:
        self.group.all_to_all(self.xp.zeros((self.group.size, 1), dtype=self.xp.int64))
        self.sync()

    def gather(self, values) -> np.ndarray:
        """Every rank's ``values`` (floats), ``[size, n]`` on the host of every rank."""
        xp, size = self.xp, self.group.size
        row = xp.asarray(np.asarray(values, np.float64))
        got = self.group.all_to_all(xp.ascontiguousarray(xp.broadcast_to(row, (size, row.size))))
        return got.get() if self.gpu else np.asarray(got)

    def time_ms(self, fn, warmup: int, reps: int) -> float:
        for _ in range(max(1, warmup)):
            fn()
        self.sync()
        times = []
        for _ in range(max(1, reps)):
            self.barrier()
            if self.gpu:
                start, end = self.xp.cuda.Event(), self.xp.cuda.Event()
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(self.xp.cuda.get_elapsed_time(start, end))
            else:
                t0 = time.perf_counter()
                fn()
                times.append(1e3 * (time.perf_counter() - t0))
        return statistics.median(times)

    def free(self) -> None:
        if self.gpu:
            self.xp.get_default_memory_pool().free_all_blocks()


def bench_exchange(rk: Rank, args, t: int, wire: str) -> dict:
    """Dispatch, combine and the pair for ``t`` tokens on this rank; times and bytes."""
    g = rk.group
    h, e = args.hidden, args.experts
    x = rk.randn((t, h), seed=11 + g.rank)
    idx, w = rk.routing(t, e, args.topk, seed=101 + g.rank)
    _, _, handle = ep.dispatch(x, idx, w, e, group=g, wire=wire)
    out = rk.randn((handle.num_rows, h), seed=211 + g.rank)
    route = handle.route
    row = h + h // 32 if wire == "mxfp8" else 2 * h
    sent_rows = sum(c for d, c in enumerate(route.send_counts) if d != g.rank)
    back_rows = sum(c for s, c in enumerate(route.recv_counts) if s != g.rank)

    def both():
        _, _, hd = ep.dispatch(x, idx, w, e, group=g, wire=wire)
        ep.combine(out, hd)

    return dict(
        dispatch_ms=rk.time_ms(lambda: ep.dispatch(x, idx, w, e, group=g, wire=wire),
                               args.warmup, args.reps),
        combine_ms=rk.time_ms(lambda: ep.combine(out, handle), args.warmup, args.reps),
        total_ms=rk.time_ms(both, args.warmup, args.reps),
        dispatch_mb=sent_rows * row / 1e6,
        combine_mb=back_rows * 2 * h / 1e6,
    )


def bench_layer(rk: Rank, args, t: int, wire: str) -> dict:
    """moe_forward + moe_backward (MXFP8 recipe) with tokens / gradients sent as ``wire``."""
    g = rk.group
    h, f, el = args.hidden, args.ffn, args.experts // g.size
    x = rk.randn((t, h), seed=11 + g.rank)
    dy = rk.randn((t, h), seed=31 + g.rank)
    idx, w = rk.routing(t, args.experts, args.topk, seed=101 + g.rank)
    w1 = rk.randn((el, 2 * f, h), seed=41 + g.rank, scale=0.02)
    w2 = rk.randn((el, h, f), seed=51 + g.rank, scale=0.02)
    recipe = lpm.Recipe.mxfp8()

    def step():
        _, ctx = ep.moe_forward(x, idx, w, w1, w2, recipe=recipe, group=g, wire=wire)
        ep.moe_backward(dy, ctx)

    return dict(step_ms=rk.time_ms(step, args.warmup, args.reps))


def run(group, xp, args) -> dict:
    gpu = xp is not np
    rk = Rank(group, xp, gpu)
    size = group.size
    if args.experts % size:
        raise SystemExit(f"--experts={args.experts} must be a multiple of the ranks ({size})")
    rows, layer = [], []
    for t in args.token_list:
        for wire in ("mxfp8", "bf16"):
            mine = bench_exchange(rk, args, t, wire)
            rk.free()  # the case's arrays went with its frame
            keys = list(mine)
            every = rk.gather([mine[k] for k in keys])
            rows.append(dict(tokens=t, wire=wire, **{k: float(every[:, i].max())
                                                    for i, k in enumerate(keys)}))
    if not args.no_layer:
        for t in args.token_list:
            for wire in ("mxfp8", "bf16"):
                mine = bench_layer(rk, args, t, wire)
                rk.free()
                every = rk.gather([mine["step_ms"]])
                layer.append(dict(tokens=t, wire=wire, step_ms=float(every[:, 0].max())))
    if group.rank == 0:
        report(rows, layer, args, size, device_name(xp, gpu))
    return dict(exchange=rows, layer=layer)


def device_name(xp, gpu: bool) -> str:
    if not gpu:
        return "cpu (NumPy reference, threads)"
    props = xp.cuda.runtime.getDeviceProperties(xp.cuda.Device().id)
    name = props["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def report(rows, layer, args, size: int, device: str) -> None:
    print(f"EP over {size} ranks ({device}); hidden {args.hidden}, top-{args.topk} of "
          f"{args.experts} experts ({args.experts // size} per rank); slowest rank's median")
    print()
    head = ("tokens/rank", "wire", "dispatch ms", "combine ms", "dispatch+combine ms",
            "dispatch MB", "combine MB", "dispatch GB/s")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        gbs = r["dispatch_mb"] / 1e3 / (r["dispatch_ms"] / 1e3) if r["dispatch_ms"] else 0.0
        print(f"| {r['tokens']} | {r['wire']} | {r['dispatch_ms']:.3f} | {r['combine_ms']:.3f} "
              f"| {r['total_ms']:.3f} | {r['dispatch_mb']:.1f} | {r['combine_mb']:.1f} "
              f"| {gbs:.1f} |")
    print()
    for t in args.token_list:
        m = next(r for r in rows if r["tokens"] == t and r["wire"] == "mxfp8")
        b = next(r for r in rows if r["tokens"] == t and r["wire"] == "bf16")
        print(f"mxfp8 / bf16 at {t} tokens/rank: dispatch bytes "
              f"{_ratio(m['dispatch_mb'], b['dispatch_mb'])}, dispatch time "
              f"{_ratio(m['dispatch_ms'], b['dispatch_ms'])}, dispatch+combine time "
              f"{_ratio(m['total_ms'], b['total_ms'])}")
    if layer:
        print()
        print(f"EP layer step (moe_forward + moe_backward, MXFP8 recipe, ffn {args.ffn}, "
              "SwiGLU)")
        print()
        print("| tokens/rank | dispatch wire | layer step ms | vs bf16 dispatch |")
        print("|---|---|---|---|")
        for t in args.token_list:
            b = next(r for r in layer if r["tokens"] == t and r["wire"] == "bf16")
            for r in (x for x in layer if x["tokens"] == t):
                print(f"| {t} | {r['wire']} | {r['step_ms']:.3f} | "
                      f"{_ratio(b['step_ms'], r['step_ms'])} |")
    sys.stdout.flush()


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.3f}" if b else "n/a"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description="Expert-parallel dispatch + combine and EP layer step, MXFP8 wire vs bf16. "
                    "Run under python -m lowprec_moe.ep.launch --nproc N; rank 0 prints.")
    ap.add_argument("--tokens", default=None, help="tokens per rank, comma-separated "
                    "(default 4096,16384; quick 256,512)")
    ap.add_argument("--hidden", type=int, default=None, help="hidden size (default 7168)")
    ap.add_argument("--experts", type=int, default=None, help="experts in all (default 256)")
    ap.add_argument("--topk", type=int, default=None, help="experts per token (default 8)")
    ap.add_argument("--ffn", type=int, default=None, help="expert FFN size (default 2048)")
    ap.add_argument("--quick", action="store_true",
                    help="small shapes (tokens 256,512, hidden 1024, 16 experts, top-4, ffn "
                         "256), 1 warm-up, 3 samples")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up calls (default 3)")
    ap.add_argument("--reps", type=int, default=None, help="timed samples (default 10)")
    ap.add_argument("--no-layer", action="store_true", help="skip the layer-step rows")
    ap.add_argument("--threads", type=int, default=2,
                    help="without the launcher: ranks as threads on the CPU (NumPy), a smoke "
                         "test with --quick (default 2)")
    ap.add_argument("--json", default=None, help="rank 0 writes the numbers here")
    args = ap.parse_args(argv)
    full = dict(tokens="4096,16384", hidden=7168, experts=256, topk=8, ffn=2048)
    for k, v in (QUICK if args.quick else full).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    args.reps = args.reps if args.reps is not None else (3 if args.quick else 10)
    try:
        args.token_list = [int(s) for s in str(args.tokens).split(",") if s.strip()]
    except ValueError:
        ap.error(f"--tokens={args.tokens!r} must be comma-separated integers")
    if not args.token_list or min(args.token_list) < 1:
        ap.error(f"--tokens={args.tokens!r} must name positive token counts")
    if args.hidden % 32:
        ap.error(f"--hidden={args.hidden} must be a multiple of 32 (MXFP8 blocks)")
    if not 1 <= args.topk <= args.experts:
        ap.error(f"--topk={args.topk} must be in [1, --experts={args.experts}]")
    launched = "WORLD_SIZE" in os.environ
    if not launched and not args.quick:
        ap.error("without the launcher this runs the NumPy reference in threads, a smoke test: "
                 "pass --quick, or start it with python -m lowprec_moe.ep.launch --nproc N")
    if not launched and args.threads < 1:
        ap.error(f"--threads={args.threads} must be >= 1")
    return args, launched


def main(argv=None) -> None:
    args, launched = parse_args(argv)
    if launched:
        import cupy

        with ep.init_process_group() as group:
            result = run(group, cupy, args)
            rank = group.rank
    else:
        result = ep.run_threads(lambda g: run(g, np, args), args.threads)[0]
        rank = 0
    if args.json and rank == 0:
        Path(args.json).write_text(json.dumps(dict(args={k: v for k, v in vars(args).items()},
                                                   **result), indent=1, default=str))


if __name__ == "__main__":
    main()
