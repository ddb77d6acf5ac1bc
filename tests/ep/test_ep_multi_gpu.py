"""Expert parallelism over NCCL, one process per GPU, started by the launcher: every rank's
output and gradients equal a one-GPU run of the whole model byte for byte (2 GPUs, and 4 where
there are), with skewed routing, ranks that receive nothing and a rank without tokens; the
example and the benchmark run under the launcher.

Marked ``gpu``; each test skips unless CuPy, its NCCL and enough GPUs are present.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import _ep_cases as C

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().parent / "_ep_worker.py"


def _nccl_gpus() -> int:
    try:
        import cupy
        from cupy.cuda import nccl

        if not getattr(nccl, "available", False):
            return 0
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:
        return 0


GPUS = _nccl_gpus()


def _need(n: int) -> None:
    if GPUS < n:
        pytest.skip(f"needs CuPy with NCCL and {n} GPUs, found {GPUS}")


def _launch(nproc: int, *argv, timeout: int = 1200):
    path = os.environ.get("PYTHONPATH")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + (os.pathsep + path if path else ""))
    cmd = [sys.executable, "-m", "lowprec_moe.ep.launch", "--nproc", str(nproc), *map(str, argv)]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=timeout)
    assert out.returncode == 0, f"exit status {out.returncode}\n{out.stdout}\n{out.stderr}"
    return out.stdout


@pytest.mark.parametrize("world", [2, 4])
def test_every_rank_equals_one_gpu(world):
    _need(world)
    stdout = _launch(world, WORKER)
    lines = [line for line in stdout.splitlines() if line.startswith("rank ")]
    assert sum(line.endswith(": ok") for line in lines) == world * (
        1 + len(C.CASES) * len(C.WIRES)), stdout
    assert "MISMATCH" not in stdout


def test_example_under_the_launcher():
    _need(2)
    for wire in ("mxfp8", "bf16"):
        stdout = _launch(2, ROOT / "examples" / "ep_moe.py", "--device", "gpu", "--wire", wire)
        assert "ranks: 2, experts per rank: 4" in stdout
        assert stdout.count("bytes dispatched") == 1  # rank 0 prints


def test_benchmark_under_the_launcher():
    _need(2)
    stdout = _launch(2, ROOT / "benchmarks" / "bench_ep.py", "--quick")
    assert "dispatch+combine" in stdout and "layer step" in stdout, stdout
