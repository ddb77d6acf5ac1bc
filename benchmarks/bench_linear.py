"""GroupedLinear forward + backward step on the GPU, per recipe, vs a torch bf16 step.

Usage::

    python benchmarks/bench_linear.py                 # every NUMERICS §10 shape
    python benchmarks/bench_linear.py --quick         # reduced run (< 2 min, kernels cached)
    python benchmarks/bench_linear.py --cases qwen-fc1,memory-bound --recipes bf16,nvfp4
    python benchmarks/bench_linear.py --json results.json

One *step* is what a training iteration runs for the layer, all quantization included:
``grouped_linear_forward`` (quantize x and W, fprop) then ``grouped_linear_backward``
(quantize dy, dgrad, wgrad), inputs bfloat16, no bias. Ours runs on CuPy; the peer, when torch is
importable, is ``y = torch._grouped_mm(x, W^T, offs)`` with ``y.backward(dy)`` (bf16, cuBLAS;
falls back to three explicit ``_grouped_mm`` calls). A second torch row times torch's FP8
rowwise step (``torch._scaled_grouped_mm`` for fprop, dgrad and wgrad, every operand quantized
to E4M3 with one scale per row in torch ops); the summary's "torch fp8" column is torch bf16 ms
/ torch fp8 ms. torch is imported here only; it is never a
dependency of the library.

Timing: random data (never zeros), warm-up steps (the first one compiles the kernels), then timed
steps between CUDA events (``cupy.cuda.Event`` for ours, ``torch.cuda.Event`` for torch); the
median is reported, as ms, TFLOP/s (``6 M N K`` per step), effective GB/s (bf16 bytes of x, W, y,
dy, dx, dW moved once) and ``vs torch`` = torch ms / our ms (> 1: faster than the torch bf16
step, NUMERICS target). ``err y`` is the relative error (Frobenius) of the recipe's y against our
bf16 recipe on the same data, a sanity check of the kernels. Every case runs in its own
try / except: an error is printed and the run goes on.

Launch modes (``--launch``, default all three): ``host`` -- splits as host ints, as most callers
pass them today; ``device`` -- splits as a device array (the router's counts stay on the GPU;
the rows say ``@device``); ``graph`` -- the device-splits step captured into a CUDA graph once
and replayed (``@graph``). Every recipe takes device splits (the GEMMs then run their plain
cp.async kernels).

``--device cpu`` runs the same harness on the NumPy reference (tiny shapes only: a smoke test).
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


from _harness import (Backend, add_common_args, finish_args, recipes,  # noqa: E402
                      select, time_step, time_torch_step, torch_module, torch_row)

RECIPES = recipes(lpm)


@dataclass
class Case:
    name: str
    splits: list
    k: int
    n: int
    note: str = ""

    @property
    def experts(self) -> int:
        return len(self.splits)

    @property
    def m(self) -> int:
        return int(sum(self.splits))


def skewed_splits(experts: int, tokens: int, empty: int, align: int = 128, seed: int = 0):
    """Zipf-like token counts (multiples of ``align``, so torch accepts them too) with ``empty``
    experts spread over the index range; sums to ``tokens``."""
    rng = np.random.default_rng(seed)
    live = experts - empty
    w = 1.0 / np.arange(1, live + 1) ** 1.2
    rng.shuffle(w)
    units = tokens // align
    s = np.maximum(1, np.floor(units * w / w.sum())).astype(np.int64)
    s[int(np.argmax(s))] += units - int(s.sum())
    out = np.zeros(experts, dtype=np.int64)
    empty_idx = set(np.linspace(0, experts - 1, empty).round().astype(int).tolist())
    live_idx = [i for i in range(experts) if i not in empty_idx]
    out[live_idx] = s * align
    return [int(v) for v in out]


def spec_cases(scale: float = 1.0) -> list[Case]:
    """NUMERICS §10 shapes; ``scale`` < 1 shrinks the tokens per expert (not below 16)."""
    def per(e, t):
        t = max(16, int(round(t * scale / 16)) * 16)
        return [t] * e

    skew_tokens = max(2048, int(32768 * scale) // 128 * 128)
    return [
        Case("deepseek-fc1", per(8, 8192), 7168, 2048, "DeepSeek-V3-like E=8, M=65536"),
        Case("deepseek-fc2", per(8, 8192), 2048, 7168, "DeepSeek-V3-like E=8, M=65536"),
        Case("qwen-fc1", per(16, 2560), 4096, 2048, "Qwen3.5-like E=16 x 2560"),
        Case("qwen-fc2", per(16, 2560), 1024, 4096, "Qwen3.5-like E=16 x 2560"),
        Case("fine-grained", per(128, 512), 2048, 1536, "E=128 x 512"),
        Case("memory-bound", [16] * 128, 2048, 1536, "E=128 x 16 tokens"),
        Case("skewed", skewed_splits(16, skew_tokens, empty=4), 4096, 2048,
             "E=16, zipf-like split, 4 empty experts"),
    ]


def smoke_cases() -> list[Case]:
    """Tiny shapes for ``--device cpu`` (the NumPy reference)."""
    return [Case("tiny", [64, 0, 96, 32], 128, 64, "CPU smoke test"),
            Case("tiny-skewed", skewed_splits(6, 512, empty=2, align=16), 64, 96, "CPU smoke")]


# ============================================================================================
# timing


def bench_ours(be: Backend, case: Case, recipe_names, args,
               torch_ms: float | None = None) -> list[dict]:
    m, k, n, g = case.m, case.k, case.n, case.experts
    x = be.randn((m, k), 1)
    w = be.randn((g, n, k), 2, 1.0 / math.sqrt(k))
    dy = be.randn((m, n), 3, 1.0 / math.sqrt(m))
    splits = list(case.splits)
    rows = []
    refs: dict = {}
    try:
        for rname in recipe_names:
            recipe = RECIPES[rname]

            def step(splits_arg, recipe=recipe):
                y, ctx = lpm.grouped_linear_forward(x, splits_arg, w, recipe=recipe, seed=1)
                grads = lpm.grouped_linear_backward(dy, ctx)
                return y, grads

            rows += time_step(be, args, case.name, rname, step, splits, args.launch, refs,
                              rname == "bf16", lambda row: report(row, case, torch_ms))
    finally:
        del x, w, dy
        refs.clear()
        be.free()
    return rows


# ============================================================================================
# torch peer


def _torch_inputs(torch, case: Case, tensors: dict):
    """bf16 x ``[M, K]``, W ``[G, N, K]``, dy ``[M, N]`` and int32 offsets on the current CUDA
    device (also kept in ``tensors``, which the caller clears)."""
    import cupy

    dev = torch.device("cuda", cupy.cuda.Device().id)
    m, k, n, g = case.m, case.k, case.n, case.experts
    gen = torch.Generator(device=dev)
    gen.manual_seed(0)
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16, generator=gen)
    w = torch.randn(g, n, k, device=dev, dtype=torch.bfloat16, generator=gen) / math.sqrt(k)
    dy = torch.randn(m, n, device=dev, dtype=torch.bfloat16, generator=gen) / math.sqrt(m)
    offs = torch.tensor(np.cumsum(case.splits), dtype=torch.int32, device=dev)
    tensors.update(x=x, w=w, dy=dy, offs=offs)
    return x, w, dy, offs


def bench_torch(torch, be: Backend, case: Case, args) -> dict:
    row = {"case": case.name, "impl": "torch", "recipe": "bf16 _grouped_mm", "ms": None,
           "reps": 0, "err_y": None, "error": None}
    tensors: dict = {}
    with torch_row(torch, row, args, tensors):
        x, w, dy, offs = _torch_inputs(torch, case, tensors)
        x.requires_grad_(True)
        w.requires_grad_(True)

        def autograd_step():
            x.grad = None
            w.grad = None
            y = torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)
            y.backward(dy)

        xd, wd = x.detach(), w.detach()
        dyt = dy.t().contiguous()

        def manual_step():
            torch._grouped_mm(xd, wd.transpose(-2, -1), offs=offs)  # y  [M, N]
            torch._grouped_mm(dy, wd, offs=offs)  # dx [M, K]
            torch._grouped_mm(dyt, xd, offs=offs)  # dW [G, N, K]

        row["ms"], row["reps"], how = time_torch_step(torch, autograd_step, manual_step, args)
        row["recipe"] = f"bf16 _grouped_mm ({how})"
    report(row, case)
    return row


def bench_torch_fp8(torch, be: Backend, case: Case, args) -> dict:
    """torch's FP8 rowwise grouped step (``torch._scaled_grouped_mm``, sm_90): every operand
    quantized to E4M3 with one scale per row of its contraction, in torch ops, then fprop,
    dgrad (W^T quantized along N) and wgrad (dy^T and x^T quantized along the tokens, one scale
    per row over all tokens, repeated per expert). A speed peer only: nothing is compared."""
    row = {"case": case.name, "impl": "torch", "recipe": "fp8 rowwise _scaled_grouped_mm",
           "ms": None, "reps": 0, "err_y": None, "error": None}
    g = case.experts
    tensors: dict = {}
    with torch_row(torch, row, args, tensors):
        f8 = torch.float8_e4m3fn
        fmax = torch.finfo(f8).max
        x, w, dy, offs = _torch_inputs(torch, case, tensors)

        def rowwise(t):
            """(E4M3 data, fp32 inverse scales) with one scale per row (last dim)."""
            amax = t.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12)
            q = (t.float() * (fmax / amax)).to(f8)
            return q, (amax / fmax).squeeze(-1)

        def step():
            mm = torch._scaled_grouped_mm
            xq, sx = rowwise(x)
            wq, sw = rowwise(w)                                   # [G, N, K] along K
            mm(xq, wq.transpose(-2, -1), sx, sw, offs=offs, out_dtype=torch.bfloat16)
            dyq, sdy = rowwise(dy)
            wtq, swt = rowwise(w.transpose(-2, -1).contiguous())  # [G, K, N] along N
            mm(dyq, wtq.transpose(-2, -1), sdy, swt, offs=offs, out_dtype=torch.bfloat16)
            dytq, sdyt = rowwise(dy.t().contiguous())             # [N, M] along the tokens
            xtq, sxt = rowwise(x.t().contiguous())                # [K, M]
            mm(dytq, xtq.t(), sdyt.repeat(g), sxt.repeat(g), offs=offs,
               out_dtype=torch.bfloat16)

        row["ms"], row["reps"], _ = time_torch_step(torch, step, step, args)
    report(row, case)
    return row


# ============================================================================================
# report


def _metrics(row: dict, case: Case) -> dict:
    ms = row.get("ms")
    if not ms:
        return {}
    m, k, n, g = case.m, case.k, case.n, case.experts
    flops = 6.0 * m * n * k
    nbytes = 2.0 * (2 * m * k + 2 * g * n * k + 2 * m * n)
    return {"tflops": flops / (ms * 1e-3) / 1e12, "gbs": nbytes / (ms * 1e-3) / 1e9}


HEADER = (f"{'case':14s} {'impl':6s} {'recipe':30s} {'ms':>9s} {'TFLOP/s':>8s} {'GB/s':>8s} "
          f"{'vs torch':>9s} {'err y':>9s}")


def report(row: dict, case: Case, torch_ms: float | None = None) -> None:
    """Print one result line (and add TFLOP/s, GB/s and the torch ratio to ``row``)."""
    if row.get("error"):
        print(f"{case.name:14s} {row['impl']:6s} {row['recipe']:30s}  ERROR {row['error']}",
              flush=True)
        return
    row.update(_metrics(row, case))
    row["vs_torch"] = torch_ms / row["ms"] if torch_ms and row["impl"] == "ours" else None
    ratio = f"{row['vs_torch']:8.2f}x" if row["vs_torch"] else f"{'':9s}"
    err = f"{row['err_y']:9.2e}" if row.get("err_y") is not None else f"{'':9s}"
    print(f"{case.name:14s} {row['impl']:6s} {row['recipe']:30s} {row['ms']:9.3f} "
          f"{row['tflops']:8.4g} {row['gbs']:8.4g} {ratio} {err}", flush=True)


def summary(results: list[dict], cases: list[Case], recipe_names) -> None:
    """One line per case: torch ms, then per recipe ``vs torch`` (or our ms without torch)."""
    have_torch = any(r["impl"] == "torch" and r.get("ms") for r in results)
    what = "torch ms / our ms (> 1: faster than the torch bf16 step)" if have_torch \
        else "our step ms"
    print(f"\nsummary: {what}")
    width = max(9, *(len(r) for r in recipe_names))
    print(f"{'case':14s} {'torch ms':>9s} {'torch fp8':>9s} "
          + " ".join(f"{r:>{width}s}" for r in recipe_names))
    for c in cases:
        tr = next((r for r in results if r["case"] == c.name and r["impl"] == "torch"), None)
        tms = f"{tr['ms']:9.3f}" if tr and tr.get("ms") else f"{'-':>9s}"
        t8 = next((r for r in results if r["case"] == c.name and r["impl"] == "torch"
                   and r["recipe"].startswith("fp8")), None)
        tms += (f" {tr['ms'] / t8['ms']:>8.2f}x" if tr and tr.get("ms") and t8 and t8.get("ms")
                else f" {'-':>9s}")
        cells = []
        for rn in recipe_names:
            r = next((r for r in results if r["case"] == c.name and r["impl"] == "ours"
                      and r["recipe"] == rn), None)
            if r is None or not r.get("ms"):
                cells.append(f"{'error' if r is not None else '-':>{width}s}")
            elif r.get("vs_torch"):
                cells.append(f"{r['vs_torch']:>{width - 1}.2f}x")
            else:
                cells.append(f"{r['ms']:>{width}.3f}")
        print(f"{c.name:14s} {tms} " + " ".join(cells))


# ============================================================================================
# main


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(ap, RECIPES)
    return ap, finish_args(ap.parse_args(argv))


def main(argv=None) -> int:
    ap, args = parse_args(argv)
    if args.device == "gpu" and not lpm.backend.cupy_available():
        ap.error("needs CuPy and a CUDA GPU (use --device cpu for a smoke test of the harness)")
    cases = smoke_cases() if args.device == "cpu" else spec_cases(0.25 if args.quick else 1.0)
    recipe_names, cases = select(ap, args, RECIPES, cases)
    modes = args.launch if args.device == "gpu" else ["host"]
    labels = [r + ("" if m == "host" else f"@{m}") for r in recipe_names for m in modes]

    be = Backend(args.device)
    torch = torch_module(args)
    peer = (f"torch {torch.__version__} _grouped_mm" if torch is not None
            else "no torch peer (not importable, no CUDA, or --no-torch)")
    print(f"lowprec_moe {lpm.__version__} GroupedLinear fwd+bwd step on {be.name}; {peer}")
    print(f"warm-up {args.warmup}, up to {args.reps} timed steps (budget {args.budget:g} s), "
          f"median{'; quick run' if args.quick else ''}")
    for c in cases:
        live = sum(1 for s in c.splits if s)
        print(f"  {c.name:14s} E={c.experts:<4d} M={c.m:<6d} K={c.k:<5d} N={c.n:<5d} "
              f"({live} experts with tokens; {c.note})")
    print()
    print(HEADER)
    t_start = time.perf_counter()
    results: list[dict] = []
    for case in cases:
        try:
            torch_ms = None
            if torch is not None:  # first, so that our lines can show the ratio
                results.append(bench_torch(torch, be, case, args))
                torch_ms = results[-1]["ms"]
                results.append(bench_torch_fp8(torch, be, case, args))
            results += bench_ours(be, case, recipe_names, args, torch_ms)
        except Exception as exc:  # e.g. out of memory while making the inputs
            print(f"{case.name:14s} ERROR {type(exc).__name__}: {exc}", flush=True)
            if args.verbose:
                traceback.print_exc()
            be.free()
    summary(results, cases, labels)
    print(f"\ntotal {time.perf_counter() - t_start:.1f} s")
    if args.json:
        payload = {"device": be.name, "torch": getattr(torch, "__version__", None),
                   "args": {k: v for k, v in vars(args).items()},
                   "cases": [{"name": c.name, "splits": c.splits, "k": c.k, "n": c.n}
                             for c in cases],
                   "results": results}
        Path(args.json).write_text(json.dumps(payload, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
