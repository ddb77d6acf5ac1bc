"""GroupedMLP (fc1 -> SwiGLU x probs -> fc2) forward + backward step, per recipe, vs torch bf16.

Usage::

    python benchmarks/bench_mlp.py                  # Qwen-like and DeepSeek-like expert blocks
    python benchmarks/bench_mlp.py --quick          # tokens per expert / 4, fewer repetitions
    python benchmarks/bench_mlp.py --cases qwen --recipes bf16,mxfp8 --unfused
    python benchmarks/bench_mlp.py --json results.json

One *step* is what a training iteration runs for the expert block, all quantization included:
``grouped_mlp_forward`` (quantize x and both weights, fc1 fprop, SwiGLU x probs fused with the
quantization of fc2's input, fc2 fprop) then ``grouped_mlp_backward`` (quantize dy, fc2 dgrad /
wgrad, SwiGLU backward fused with the quantization of dh, fc1 dgrad / wgrad), inputs bfloat16, no
biases, routing probs on. ``--unfused`` adds rows with ``fused=False`` (activation kernel writing
bf16, then the separate quantizer) to show what the fusion saves.

The peer, when torch is importable, is the same block in bf16 built from ``torch._grouped_mm``
(cuBLAS): ``h = x @ W1^T``, ``z = silu(gate) * lin * probs``, ``y = z @ W2^T`` with
``y.backward(dy)`` through autograd (falls back to explicit ``_grouped_mm`` calls and elementwise
backward if autograd does not support the op). torch is imported here only; it is never a
dependency of the library.

The activation kernels are also timed alone (``act`` rows): forward and backward, fused MXFP8 vs
plain bf16 output + separate MXFP8 quantize, and NVFP4 (RHT, stochastic rounding in the
backward, as the nvfp4 recipe) with the amax taken by the activation kernel vs the quantizer's own
amax pass, with the effective bandwidth of the bytes each variant has to move at least. Each
sample times ``--act-inner`` back-to-back calls (host overhead overlapped). ``--act-only`` runs
just these rows (a microbenchmark of the activation step, fused vs unfused, at full size unless
``--quick``).

Launch modes of the step (``--launch``, default all three): ``host`` splits, ``device`` splits
(``@device`` rows) and the device-splits step captured into a CUDA graph and replayed
(``@graph``), as in ``bench_linear.py``.

Timing: random data (never zeros), warm-up (the first call compiles the kernels), CUDA events,
medians. Reported: ms, TFLOP/s (``6 M (K 2F + F K)`` per step), ``vs torch`` = torch ms / our ms
(> 1: faster than the torch bf16 step) and ``err y`` = relative error (Frobenius) of y against
our bf16 recipe. Each case and recipe runs in its own try / except: errors are printed and the
run goes on.

``--device cpu`` runs the harness on the NumPy reference with tiny shapes (a smoke test).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import numpy as np

try:
    import lowprec_moe as lpm
except ImportError:  # running from a checkout that is not installed
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import lowprec_moe as lpm

from lowprec_moe.layers.activations import activation_backward, activation_forward, make_activation

from _harness import (Backend, add_common_args, finish_args, recipes,  # noqa: E402
                      select, time_step, time_torch_step, torch_module, torch_row)

RECIPES = recipes(lpm)


@dataclass
class Case:
    name: str
    splits: list
    k: int  # hidden size (fc1 in, fc2 out)
    f: int  # ffn hidden size (fc1 out = 2F)
    note: str = ""

    @property
    def experts(self) -> int:
        return len(self.splits)

    @property
    def m(self) -> int:
        return int(sum(self.splits))

    @property
    def flops(self) -> float:
        return 6.0 * self.m * (self.k * 2 * self.f + self.f * self.k)


def spec_cases(scale: float = 1.0) -> list[Case]:
    def per(e, t):
        return [max(128, int(round(t * scale / 128)) * 128)] * e

    return [
        Case("qwen", per(16, 2560), 4096, 1024, "Qwen-like E=16 x 2560, 4096 -> 2x1024 -> 4096"),
        Case("deepseek", per(8, 8192), 7168, 2048,
             "DeepSeek-like E=8, M=65536, 7168 -> 2x2048 -> 7168"),
    ]


def smoke_cases() -> list[Case]:
    return [Case("tiny", [64, 0, 96, 32], 128, 64, "CPU smoke test")]


# ============================================================================================
# timing


# ============================================================================================
# ours


def bench_ours(be: Backend, case: Case, recipe_names, args, torch_ms=None) -> list[dict]:
    m, k, f, g = case.m, case.k, case.f, case.experts
    d = dict(x=be.randn((m, k), 1), w1=be.randn((g, 2 * f, k), 2, 1.0 / math.sqrt(k)),
             w2=be.randn((g, k, f), 3, 1.0 / math.sqrt(f)),
             dy=be.randn((m, k), 4, 1.0 / math.sqrt(m)), probs=be.uniform(m, 5))
    splits = list(case.splits)
    rows = []
    variants = [(r, True) for r in recipe_names]
    if args.unfused:
        variants += [(r, False) for r in recipe_names if r != "bf16"]
    try:
        for rname, fused in variants:
            recipe = RECIPES[rname]

            def step(splits_arg, recipe=recipe, fused=fused):
                y, ctx = lpm.grouped_mlp_forward(d["x"], splits_arg, d["w1"], d["w2"],
                                                 probs=d["probs"], activation="swiglu",
                                                 recipe=recipe, seed=1, fused=fused)
                grads = lpm.grouped_mlp_backward(d["dy"], ctx)
                return y, grads

            modes = args.launch if fused else [m for m in args.launch if m == "host"]
            label = rname if fused else f"{rname} (unfused)"
            rows += time_step(be, args, case.name, label, step, splits, modes, d,
                              rname == "bf16" and fused, lambda row: report(row, case, torch_ms))
    finally:
        d.clear()
        be.free()
    return rows


def bench_activation(be: Backend, case: Case, args) -> list[dict]:
    """The activation kernels alone: fused MXFP8 output vs bf16 output + separate quantize."""
    m, f = case.m, case.f
    splits = list(case.splits)
    act = make_activation("swiglu")
    rows = []
    d: dict = {}
    try:
        d.update(h=be.randn((m, 2 * f), 6, 2.0), dz=be.randn((m, f), 7), p=be.uniform(m, 8))
        q = dict(format="mxfp8", rowwise=True, columnwise=True)
        qf = dict(format="nvfp4", rowwise=True, columnwise=True, rht=True)
        qb = dict(qf, stochastic_rounding=True, seed=1)
        inner = max(1, args.act_inner)

        def fwd(**kw):
            def run():
                for _ in range(inner):
                    activation_forward(d["h"], act, d["p"], splits=splits, **kw)
            return run

        def bwd(**kw):
            def run():
                for _ in range(inner):
                    activation_backward(d["dz"], d["h"], act, d["p"], splits=splits, **kw)
            return run

        # minimal bytes: read h (+ dz, probs), write the outputs (fp8 row + col copies + scales;
        # nvfp4: 4.5 bits per element and direction)
        mx_out = lambda w: 2 * m * w + 2 * m * w // 32  # noqa: E731
        nv_out = lambda w: m * w + 2 * m * w // 16  # noqa: E731
        fwd_in, bwd_in = 2 * m * 2 * f + 4 * m, 2 * m * 3 * f + 4 * m
        variants = [
            ("fwd fused mxfp8", fwd_in + mx_out(f), fwd(quantize=q)),
            ("fwd bf16 + quantize", fwd_in + mx_out(f), fwd(quantize=q, fused=False)),
            ("fwd nvfp4 fused amax", fwd_in + nv_out(f), fwd(quantize=qf)),
            ("fwd nvfp4 unfused", fwd_in + nv_out(f), fwd(quantize=qf, fused=False)),
            ("fwd bf16 only", fwd_in + 2 * m * f, fwd()),
            ("bwd fused mxfp8", bwd_in + mx_out(2 * f), bwd(quantize=q)),
            ("bwd bf16 + quantize", bwd_in + mx_out(2 * f), bwd(quantize=q, fused=False)),
            ("bwd nvfp4 fused amax", bwd_in + nv_out(2 * f), bwd(quantize=qb)),
            ("bwd nvfp4 unfused", bwd_in + nv_out(2 * f), bwd(quantize=qb, fused=False)),
            ("bwd bf16 only", bwd_in + 2 * m * 2 * f, bwd()),
        ]
        for label, nbytes, fn in variants:
            row = {"case": case.name, "impl": "act", "recipe": label, "ms": None, "reps": 0,
                   "err_y": None, "error": None, "bytes": nbytes}
            try:
                ms, row["reps"] = be.time_ms(fn, warmup=args.warmup, reps=args.reps,
                                             budget_s=args.budget / 4)
                row["ms"] = ms / inner
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {exc}"
                if args.verbose:
                    traceback.print_exc()
            rows.append(row)
            report(row, case)
    finally:
        d.clear()
        be.free()
    return rows


# ============================================================================================
# torch peer


def bench_torch(torch, be: Backend, case: Case, args) -> dict:
    row = {"case": case.name, "impl": "torch", "recipe": "bf16 _grouped_mm", "ms": None,
           "reps": 0, "err_y": None, "error": None}
    import cupy

    dev = torch.device("cuda", cupy.cuda.Device().id)
    m, k, f, g = case.m, case.k, case.f, case.experts
    gen = torch.Generator(device=dev)
    gen.manual_seed(0)
    keep = {}
    with torch_row(torch, row, args, keep):
        bf = torch.bfloat16
        x = torch.randn(m, k, device=dev, dtype=bf, generator=gen)
        w1 = torch.randn(g, 2 * f, k, device=dev, dtype=bf, generator=gen) / math.sqrt(k)
        w2 = torch.randn(g, k, f, device=dev, dtype=bf, generator=gen) / math.sqrt(f)
        dy = torch.randn(m, k, device=dev, dtype=bf, generator=gen) / math.sqrt(m)
        probs = torch.rand(m, device=dev, dtype=torch.float32, generator=gen) * 0.9 + 0.1
        offs = torch.tensor(np.cumsum(case.splits), dtype=torch.int32, device=dev)
        for t in (x, w1, w2, probs):
            t.requires_grad_(True)
        keep.update(x=x, w1=w1, w2=w2, dy=dy, probs=probs, offs=offs)
        gmm = torch._grouped_mm
        silu = torch.nn.functional.silu

        def autograd_step():
            for t in (x, w1, w2, probs):
                t.grad = None
            h = gmm(x, w1.transpose(-2, -1), offs=offs)
            gate, lin = h.chunk(2, dim=-1)
            z = (silu(gate) * lin * probs[:, None]).to(bf)
            y = gmm(z, w2.transpose(-2, -1), offs=offs)
            y.backward(dy)

        xd, w1d, w2d, pd = x.detach(), w1.detach(), w2.detach(), probs.detach()
        dyt = dy.t().contiguous()

        def manual_step():
            h = gmm(xd, w1d.transpose(-2, -1), offs=offs)
            gate, lin = h.float().chunk(2, dim=-1)
            sig = torch.sigmoid(gate)
            a = gate * sig * lin
            z = (a * pd[:, None]).to(bf)
            gmm(z, w2d.transpose(-2, -1), offs=offs)  # y
            dz = gmm(dy, w2d, offs=offs).float()  # fc2 dgrad
            gmm(dyt, z, offs=offs)  # fc2 wgrad
            (a * dz).sum(-1)  # dprobs
            da = dz * pd[:, None]
            dh = torch.cat([da * lin * sig * (1 + gate * (1 - sig)), da * gate * sig],
                           dim=-1).to(bf)
            gmm(dh, w1d, offs=offs)  # fc1 dgrad
            gmm(dh.t().contiguous(), xd, offs=offs)  # fc1 wgrad

        row["ms"], row["reps"], how = time_torch_step(torch, autograd_step, manual_step, args)
        row["recipe"] = f"bf16 _grouped_mm ({how})"
    report(row, case)
    return row


# ============================================================================================
# report


HEADER = (f"{'case':10s} {'impl':6s} {'recipe':30s} {'ms':>9s} {'TFLOP/s':>8s} {'GB/s':>8s} "
          f"{'vs torch':>9s} {'err y':>9s}")


def report(row: dict, case: Case, torch_ms: float | None = None) -> None:
    if row.get("error"):
        print(f"{case.name:10s} {row['impl']:6s} {row['recipe']:30s}  ERROR {row['error']}",
              flush=True)
        return
    ms = row["ms"]
    tflops = case.flops / (ms * 1e-3) / 1e12 if row["impl"] != "act" else None
    gbs = row["bytes"] / (ms * 1e-3) / 1e9 if row.get("bytes") else None
    row.update(tflops=tflops, gbs=gbs)
    row["vs_torch"] = torch_ms / ms if torch_ms and row["impl"] == "ours" else None
    t = f"{tflops:8.4g}" if tflops else f"{'':8s}"
    b = f"{gbs:8.4g}" if gbs else f"{'':8s}"
    ratio = f"{row['vs_torch']:8.2f}x" if row["vs_torch"] else f"{'':9s}"
    err = f"{row['err_y']:9.2e}" if row.get("err_y") is not None else f"{'':9s}"
    print(f"{case.name:10s} {row['impl']:6s} {row['recipe']:30s} {ms:9.3f} {t} {b} {ratio} {err}",
          flush=True)


def summary(results: list[dict], cases: list[Case]) -> None:
    have_torch = any(r["impl"] == "torch" and r.get("ms") for r in results)
    what = "torch ms / our ms (> 1: faster than the torch bf16 step)" if have_torch \
        else "our step ms"
    print(f"\nsummary: {what}")
    for c in cases:
        tr = next((r for r in results if r["case"] == c.name and r["impl"] == "torch"), None)
        parts = [f"torch {tr['ms']:.3f} ms" if tr and tr.get("ms") else "torch -"]
        for r in results:
            if r["case"] != c.name or r["impl"] != "ours":
                continue
            if not r.get("ms"):
                parts.append(f"{r['recipe']}: error")
            elif r.get("vs_torch"):
                parts.append(f"{r['recipe']}: {r['vs_torch']:.2f}x")
            else:
                parts.append(f"{r['recipe']}: {r['ms']:.3f} ms")
        print(f"  {c.name:10s} " + "; ".join(parts))


# ============================================================================================
# main


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(ap, RECIPES)
    ap.add_argument("--unfused", action="store_true",
                    help="also time the quantized recipes with fused=False")
    ap.add_argument("--no-act", action="store_true", help="skip the activation-kernel rows")
    ap.add_argument("--act-only", action="store_true",
                    help="only the activation-kernel rows (fused vs unfused microbenchmark)")
    ap.add_argument("--act-inner", type=int, default=5,
                    help="back-to-back activation calls per timed sample (default 5)")
    return ap, finish_args(ap.parse_args(argv))


def main(argv=None) -> int:
    ap, args = parse_args(argv)
    if args.device == "gpu" and not lpm.backend.cupy_available():
        ap.error("needs CuPy and a CUDA GPU (use --device cpu for a smoke test of the harness)")
    cases = smoke_cases() if args.device == "cpu" else spec_cases(0.25 if args.quick else 1.0)
    recipe_names, cases = select(ap, args, RECIPES, cases)

    be = Backend(args.device)
    torch = torch_module(args)
    peer = (f"torch {torch.__version__} _grouped_mm" if torch is not None
            else "no torch peer (not importable, no CUDA, or --no-torch)")
    print(f"lowprec_moe {lpm.__version__} GroupedMLP fwd+bwd step (SwiGLU, probs) on {be.name}; "
          f"{peer}")
    print(f"warm-up {args.warmup}, up to {args.reps} timed steps (budget {args.budget:g} s), "
          f"median{'; quick run' if args.quick else ''}")
    for c in cases:
        print(f"  {c.name:10s} E={c.experts:<3d} M={c.m:<6d} K={c.k:<5d} F={c.f:<5d} ({c.note})")
    print()
    print(HEADER)
    t_start = time.perf_counter()
    results: list[dict] = []
    for case in cases:
        try:
            torch_ms = None
            if torch is not None and not args.act_only:
                results.append(bench_torch(torch, be, case, args))
                torch_ms = results[-1]["ms"]
            if not args.act_only:
                results += bench_ours(be, case, recipe_names, args, torch_ms)
            if not args.no_act or args.act_only:
                results += bench_activation(be, case, args)
        except Exception as exc:  # e.g. out of memory while making the inputs
            print(f"{case.name:10s} ERROR {type(exc).__name__}: {exc}", flush=True)
            if args.verbose:
                traceback.print_exc()
            be.free()
    summary(results, cases)
    print(f"\ntotal {time.perf_counter() - t_start:.1f} s")
    if args.json:
        payload = {"device": be.name, "torch": getattr(torch, "__version__", None),
                   "args": dict(vars(args)),
                   "cases": [{"name": c.name, "splits": c.splits, "k": c.k, "f": c.f}
                             for c in cases],
                   "results": results}
        Path(args.json).write_text(json.dumps(payload, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
