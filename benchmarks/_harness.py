"""Shared pieces of the layer benchmarks (bench_linear.py, bench_mlp.py).

``Backend`` wraps one device: the array module, seeded random data, a timer (CUDA events on the
GPU, ``perf_counter`` on the CPU; warm-up, then the median) and memory clean-up.
``torch_module`` returns torch when the optional torch peer can run, else None;
``time_torch_step`` picks and times the peer's step. ``add_common_args`` / ``finish_args`` /
``select`` are the command-line options and case / recipe selection both benchmarks share.
"""

from __future__ import annotations

import contextlib
import gc
import statistics
import sys
import time
import traceback

import ml_dtypes
import numpy as np

BF16 = ml_dtypes.bfloat16


class Backend:
    """Array module, random data and timers of one device."""

    def __init__(self, device: str):
        self.gpu = device == "gpu"
        if self.gpu:
            import cupy

            self.xp = cupy
            props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
            name = props["name"]
            self.name = name.decode() if isinstance(name, bytes) else str(name)
        else:
            self.xp = np
            self.name = "cpu (NumPy reference)"

    def randn(self, shape, seed: int, scale: float = 1.0, dtype=BF16):
        xp = self.xp
        if self.gpu:
            a = xp.random.RandomState(seed).standard_normal(shape, dtype=xp.float32)
        else:
            a = np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)
        if scale != 1.0:
            a *= np.float32(scale)
        return a.astype(dtype)

    def uniform(self, n: int, seed: int):
        xp = self.xp
        if self.gpu:
            return xp.random.RandomState(seed).uniform(0.1, 1.0, n).astype(xp.float32)
        return np.random.default_rng(seed).uniform(0.1, 1.0, n).astype(np.float32)

    def sync(self) -> None:
        if self.gpu:
            self.xp.cuda.get_current_stream().synchronize()

    def time_ms(self, fn, *, warmup: int, reps: int, budget_s: float) -> tuple[float, int]:
        """Median ms of ``fn()`` over at most ``reps`` timed calls (fewer when a call is so slow
        that ``reps`` of them would exceed ``budget_s``). Returns (median ms, calls timed)."""
        if self.gpu:
            cp = self.xp

            def events():
                return cp.cuda.Event(), cp.cuda.Event()

            events.elapsed = cp.cuda.get_elapsed_time
        else:
            events = _HostEvents()
        return _median_ms(fn, self.sync, events, warmup=warmup, reps=reps, budget_s=budget_s)

    def free(self) -> None:
        gc.collect()
        if self.gpu:
            self.xp.get_default_memory_pool().free_all_blocks()
            self.xp.get_default_pinned_memory_pool().free_all_blocks()


class _HostEvents:
    """``perf_counter`` stand-ins for CUDA events (CPU runs)."""

    class _Event:
        t = 0.0

        def record(self):
            self.t = time.perf_counter()

        def synchronize(self):
            pass

    def __call__(self):
        return self._Event(), self._Event()

    @staticmethod
    def elapsed(start, end) -> float:
        return 1e3 * (end.t - start.t)


def recipes(lpm) -> dict:
    """The recipes the layer benchmarks compare, by name."""
    return {
        "bf16": lpm.Recipe.bf16(),
        "mxfp8": lpm.Recipe.mxfp8(),
        "mxfp8-hybrid": lpm.Recipe.mxfp8(fp8_format="hybrid"),
        "nvfp4": lpm.Recipe.nvfp4(),  # RHT + stochastic rounding, 16x16 weight blocks
        "nvfp4-row-scaled": lpm.Recipe.nvfp4(row_scaled_activation=True),
    }


def rel_err(xp, a, b) -> float:
    d = xp.linalg.norm((a.astype(xp.float32) - b.astype(xp.float32)).ravel())
    r = xp.linalg.norm(b.astype(xp.float32).ravel())
    return float(d / r) if float(r) else float(d)


def torch_module(args):
    if args.no_torch or args.device != "gpu":
        return None
    try:
        import torch  # noqa: PLC0415 - optional peer, never a library dependency
    except Exception:
        return None
    if not torch.cuda.is_available() or not hasattr(torch, "_grouped_mm"):
        return None
    return torch


def _median_ms(fn, sync, events, *, warmup: int, reps: int, budget_s: float):
    """Warm-up, then the median of up to ``reps`` timed calls (``events()`` -> start, end with
    record / synchronize; ``elapsed(start, end)`` in ms via ``events.elapsed``)."""
    t_last = 0.0
    for _ in range(max(1, warmup)):
        t0 = time.perf_counter()
        fn()
        sync()
        t_last = time.perf_counter() - t0
    reps = max(1, min(reps, int(budget_s / max(t_last, 1e-6))))
    times = []
    for _ in range(reps):
        start, end = events()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(events.elapsed(start, end))
    return statistics.median(times), reps


def time_torch_step(torch, autograd_step, manual_step, args) -> tuple[float, int, str]:
    """Time the torch peer's step: ``autograd_step`` if torch's autograd runs it, else
    ``manual_step`` (explicit ``_grouped_mm`` calls). Returns (median ms, calls timed, how)."""
    fn, how = autograd_step, "autograd"
    try:
        autograd_step()
        torch.cuda.synchronize()
    except Exception as exc:
        if args.verbose:
            print(f"  torch autograd step failed ({type(exc).__name__}: {exc}); using "
                  "explicit _grouped_mm calls", file=sys.stderr)
        fn, how = manual_step, "explicit"
        manual_step()
        torch.cuda.synchronize()

    def events():
        return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    events.elapsed = lambda start, end: start.elapsed_time(end)
    ms, reps = _median_ms(fn, torch.cuda.synchronize, events, warmup=args.warmup,
                          reps=args.reps, budget_s=args.budget)
    return ms, reps, how


def release_torch(torch) -> None:
    gc.collect()
    try:
        torch.cuda.empty_cache()
    except Exception:
        pass


@contextlib.contextmanager
def torch_row(torch, row: dict, args, held: dict):
    """Run a torch peer's timing in a with-block: an exception is recorded in ``row["error"]``
    (traceback with ``--verbose``) and the run goes on; the tensors in ``held`` and torch's
    cached memory are released either way."""
    try:
        yield
    except Exception as exc:
        row["error"] = f"{type(exc).__name__}: {exc}"
        if args.verbose:
            traceback.print_exc()
    finally:
        held.clear()
        release_torch(torch)


# ============================================================================================
# command line


def add_common_args(ap, recipes) -> None:
    """The options both layer benchmarks take."""
    ap.add_argument("--quick", action="store_true",
                    help="reduced run: tokens per expert / 4, 1 warm-up, 3 timed steps")
    ap.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    ap.add_argument("--recipes", default=",".join(recipes),
                    help=f"comma-separated subset of {', '.join(recipes)}")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up steps (default 3, quick 1)")
    ap.add_argument("--reps", type=int, default=None, help="timed steps (default 10, quick 3)")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds of timed steps per case and implementation (default 10, "
                         "quick 2); slow steps are timed fewer times")
    ap.add_argument("--no-torch", action="store_true", help="skip the torch peer")
    ap.add_argument("--device", choices=("gpu", "cpu"), default="gpu",
                    help="cpu: NumPy reference on tiny shapes (smoke test of the harness)")
    ap.add_argument("--launch", default="host,device,graph",
                    help="comma-separated launch modes of our step: host (host splits), device "
                         "(splits as a device array), graph (the device-splits step captured "
                         "into a CUDA graph once and replayed); GPU only beyond host")
    ap.add_argument("--json", default=None, help="also write the results to this JSON file")
    ap.add_argument("--verbose", action="store_true", help="print tracebacks of errors")


LAUNCH_MODES = ("host", "device", "graph")


def step_variants(be, modes, step, splits):
    """``(label suffix, fn)`` per launch mode of ``step(splits)``: ``""`` with host splits,
    ``"@device"`` with the splits as a device array, ``"@graph"`` the device-splits step
    captured into a CUDA graph (after two eager calls; its own memory pool) and replayed on the
    current stream. A mode the step cannot take raises when its fn is built or first called."""
    out = []
    for mode in modes:
        if mode == "host":
            out.append(("", lambda: step(splits)))
            continue
        if not be.gpu:
            continue
        cp = be.xp
        ds = cp.asarray(np.asarray(splits, dtype=np.int64))
        if mode == "device":
            out.append(("@device", lambda ds=ds: step(ds)))
            continue

        def build(ds=ds):
            pool = cp.cuda.MemoryPool()
            stream = cp.cuda.Stream(non_blocking=True)
            cp.cuda.Device().synchronize()  # the inputs, made on the default stream, are ready
            with cp.cuda.using_allocator(pool.malloc), stream:
                step(ds)
                step(ds)
                stream.synchronize()
                stream.begin_capture()
                try:
                    kept = step(ds)
                finally:
                    graph = stream.end_capture()
            return lambda: graph.launch(cp.cuda.get_current_stream()), (pool, kept)

        out.append(("@graph", build))
    return out


def time_step(be, args, case_name: str, label: str, step, splits, modes, refs: dict,
              is_ref: bool, report) -> list[dict]:
    """Rows of ``step`` (a layer step taking its splits) timed in each launch mode of
    ``modes`` (:func:`step_variants`). The host-mode row also carries ``err_y``, the relative
    error of y against ``refs["y"]``, which the reference recipe's row (``is_ref``) sets. A mode
    that fails is reported as an error row and the run goes on; ``report(row)`` prints each."""
    import traceback

    rows = []
    for suffix, fn in step_variants(be, modes, step, splits):
        row = {"case": case_name, "impl": "ours", "recipe": label + suffix, "ms": None,
               "reps": 0, "err_y": None, "error": None}
        keep = None
        try:
            if suffix == "@graph":
                fn, keep = fn()
            row["ms"], row["reps"] = be.time_ms(fn, warmup=args.warmup, reps=args.reps,
                                                budget_s=args.budget)
            if suffix == "":
                y, _ = step(splits)
                if is_ref:
                    refs["y"] = y
                    row["err_y"] = 0.0
                elif refs.get("y") is not None:
                    row["err_y"] = rel_err(be.xp, y, refs["y"])
                del y
        except Exception as exc:  # keep going: report and move on
            row["error"] = f"{type(exc).__name__}: {exc}"
            if args.verbose:
                traceback.print_exc()
            be.free()
        del keep
        rows.append(row)
        report(row)
    return rows


def finish_args(args):
    """Fill the quick / full defaults of warm-up, reps and budget."""
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    args.reps = args.reps if args.reps is not None else (3 if args.quick else 10)
    args.budget = args.budget if args.budget is not None else (2.0 if args.quick else 10.0)
    args.launch = [s.strip() for s in args.launch.split(",") if s.strip()]
    bad = [m for m in args.launch if m not in LAUNCH_MODES]
    if bad:
        raise SystemExit(f"--launch: unknown mode(s) {bad}; choose from {LAUNCH_MODES}")
    return args


def select(ap, args, recipes, cases):
    """(recipe names, cases) chosen by ``--recipes`` / ``--cases``; bf16 first (the err-y
    baseline). Unknown names are an argparse error."""
    recipe_names = [s.strip() for s in args.recipes.split(",") if s.strip()]
    bad = [r for r in recipe_names if r not in recipes]
    if bad:
        ap.error(f"unknown recipe(s) {bad}; choose from {list(recipes)}")
    if "bf16" in recipe_names:
        recipe_names.remove("bf16")
        recipe_names.insert(0, "bf16")
    if args.cases:
        want = [s.strip() for s in args.cases.split(",") if s.strip()]
        names = [c.name for c in cases]
        bad = [c for c in want if c not in names]
        if bad:
            ap.error(f"unknown case(s) {bad}; choose from {names}")
        cases = [c for c in cases if c.name in want]
    return recipe_names, cases
