"""benchmarks/bench_ep.py on the CPU: it imports, shows --help, refuses a full-size run without
the launcher, and its whole harness runs on tiny shapes with a thread group (a smoke test; the
numbers come from a run under the launcher on GPUs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "bench_ep.py"


def _run(*argv, timeout=300):
    return subprocess.run([sys.executable, str(BENCH), *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def test_help_and_refusal():
    out = _run("--help")
    assert out.returncode == 0, out.stderr
    assert "lowprec_moe.ep.launch" in out.stdout and "--tokens" in out.stdout
    out = _run()
    assert out.returncode == 2 and "pass --quick" in out.stderr


def test_tiny_run_in_threads(tmp_path):
    path = tmp_path / "ep.json"
    out = _run("--quick", "--threads", "2", "--tokens", "16,24", "--hidden", "64",
               "--experts", "4", "--topk", "2", "--ffn", "32", "--reps", "1",
               "--json", str(path))
    assert out.returncode == 0, out.stderr
    assert "dispatch+combine" in out.stdout and "layer step" in out.stdout
    assert "dispatch bytes 0.516" in out.stdout  # (64 + 2) / 128
    data = json.loads(path.read_text())
    assert [(r["tokens"], r["wire"]) for r in data["exchange"]] == [
        (16, "mxfp8"), (16, "bf16"), (24, "mxfp8"), (24, "bf16")]
    assert len(data["layer"]) == 4
