"""End-to-end throughput of ``lowprec-moe quantize`` on a synthetic bf16 checkpoint.

Writes a safetensors file of about ``--size-mb`` MB (bf16 matrices plus one expert stack), then
runs the CLI as a user would (a fresh ``python -m lowprec_moe.cli`` process, start-up and file
I/O included) on each device and prints MB/s of input. The GPU run needs CuPy and a GPU and is
chosen automatically when they are present.

    python benchmarks/bench_checkpoint.py                      # 1 GB, cpu (and gpu if present)
    python benchmarks/bench_checkpoint.py --size-mb 256 --device cpu --format mxfp8
    python benchmarks/bench_checkpoint.py --device gpu --breakdown   # where the GPU time goes

The input is synced to disk and sits in the page cache (a warm read, what a second run on a
real checkpoint sees); the output is written to the same directory.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import ml_dtypes
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from lowprec_moe.io.arrays import ArrayWriter  # noqa: E402


def make_checkpoint(path: str, size_mb: int, seed: int = 0) -> int:
    """A bf16 model file: 4096 x 4096 matrices and one [8, 1024, 4096] expert stack."""
    rng = np.random.default_rng(seed)
    target = size_mb * 10**6
    stack = (8, 1024, 4096)
    mat = (4096, 4096)
    written = 0
    with ArrayWriter(path) as w:
        i = 0
        while written + 2 * np.prod(mat) <= target - 2 * np.prod(stack):
            x = (rng.standard_normal(mat, np.float32) * 0.02).astype(ml_dtypes.bfloat16)
            w.add(f"model.layers.{i}.mlp.down_proj.weight", x)
            written += x.nbytes
            i += 1
        x = (rng.standard_normal(stack, np.float32) * 0.02).astype(ml_dtypes.bfloat16)
        w.add("model.layers.0.mlp.experts.gate_up_proj", x)
        written += x.nbytes
        w.commit({"format": "pt"})
    return written


def run_cli(src: str, dst: str, fmt: str, device: str) -> float:
    cmd = [sys.executable, "-m", "lowprec_moe.cli", "quantize", src, dst, "--format", fmt,
           "--device", device, "--quiet", "--force"]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stderr}")
    return elapsed


def startup_seconds() -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "lowprec_moe.cli", "--version"], check=True,
                   capture_output=True)
    return time.perf_counter() - t0


def breakdown(src: str, fmt: str) -> None:
    """Where a GPU conversion's time goes, phase by phase, in this process (not the CLI's
    pipeline, which overlaps them): CuPy import and CUDA context, reading every tensor from the
    page cache, host-to-device copies, quantization (kernels compiled by a first call),
    device-to-host copies of the results. Each phase synchronises before its clock stops."""
    import time as _t

    t0 = _t.perf_counter()
    import cupy as cp

    cp.cuda.runtime.getDeviceCount()
    cp.zeros(1).sum().get()  # context, memory pool
    phases = {"cupy import + CUDA context": _t.perf_counter() - t0}
    import lowprec_moe as lpm
    from lowprec_moe.io.arrays import open_arrays

    f = open_arrays(src)
    names = list(f.keys())
    t0 = _t.perf_counter()
    host = [np.ascontiguousarray(f.get(n)) for n in names]
    phases["read (page cache -> host memory)"] = _t.perf_counter() - t0
    total = sum(a.nbytes for a in host)
    t0 = _t.perf_counter()
    dev = [cp.asarray(a) for a in host]
    cp.cuda.Device().synchronize()
    phases["host -> device"] = _t.perf_counter() - t0
    lpm.quantize(dev[0][:64].reshape(-1, dev[0].shape[-1]), fmt)  # compile / load kernels
    cp.cuda.Device().synchronize()
    t0 = _t.perf_counter()
    out = [lpm.quantize(a.reshape(-1, a.shape[-1]), fmt) for a in dev]
    cp.cuda.Device().synchronize()
    phases["quantize (GPU)"] = _t.perf_counter() - t0
    t0 = _t.perf_counter()
    back = [(q.rowwise_data.get(), q.rowwise_scale.get()) for q in out]
    phases["device -> host"] = _t.perf_counter() - t0
    out_bytes = sum(a.nbytes + b.nbytes for a, b in back)
    f.close()
    print(f"breakdown of {total / 1e6:.0f} MB in, {out_bytes / 1e6:.0f} MB out "
          "(phases in sequence; the CLI overlaps reading, copying and writing):")
    for name, sec in phases.items():
        print(f"  {name:<36s}{sec:8.3f} s{total / sec / 1e9:8.2f} GB/s of input")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=int, default=1000, help="input size in MB (10^6 bytes)")
    ap.add_argument("--format", default="nvfp4", choices=["nvfp4", "mxfp8"])
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "gpu", "both"])
    ap.add_argument("--repeat", type=int, default=2, help="runs per device (best is kept)")
    ap.add_argument("--dir", default=None, help="working directory (default: a temporary one)")
    ap.add_argument("--breakdown", action="store_true",
                    help="GPU: also time the phases of a conversion one by one, in-process")
    args = ap.parse_args(argv)

    from lowprec_moe.backend import cupy_available

    gpu = cupy_available()
    devices = {"auto": ["cpu"] + (["gpu"] if gpu else []), "both": ["cpu", "gpu"],
               "cpu": ["cpu"], "gpu": ["gpu"]}[args.device]
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        src, dst = os.path.join(d, "model.safetensors"), os.path.join(d, "q.safetensors")
        nbytes = make_checkpoint(src, args.size_mb)
        os.sync()  # a real checkpoint is on disk already: no write-back during the runs
        start = startup_seconds()
        print(f"input: {nbytes / 1e6:.0f} MB bf16, {os.cpu_count()} CPUs, "
              f"CLI start-up {start:.2f} s, format {args.format}")
        print(f"{'device':<8}{'best s':>10}{'MB/s':>10}{'MB/s w/o start-up':>20}   every run (s)")
        for device in devices:
            runs = [run_cli(src, dst, args.format, device) for _ in range(args.repeat)]
            best = min(runs)
            print(f"{device:<8}{best:>10.2f}{nbytes / best / 1e6:>10.0f}"
                  f"{nbytes / max(best - start, 1e-9) / 1e6:>20.0f}   "
                  + " ".join(f"{t:.2f}" for t in runs))
        if args.breakdown and gpu:
            breakdown(src, args.format)


if __name__ == "__main__":
    main()
