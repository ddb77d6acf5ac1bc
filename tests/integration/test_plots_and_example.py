"""Plot helpers, ``inspect --plot`` and the training example (CPU smoke run)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "train_char_moe.py"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _runs():
    steps = list(range(1, 11))
    return {name: dict(train_steps=steps, train_loss=[5.0 - 0.1 * s + off for s in steps],
                       eval_steps=[5, 10], eval_loss=[4.8 + off, 4.3 + off])
            for name, off in (("bf16", 0.0), ("mxfp8", 0.01), ("nvfp4", 0.05))}


def test_plot_loss_curves_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    from lowprec_moe.plot import plot_loss_curves

    out = tmp_path / "loss.png"
    plot_loss_curves(_runs(), out, title="t")
    assert out.read_bytes().startswith(PNG_MAGIC)


def test_plot_loss_curves_rejects():
    from lowprec_moe.plot import plot_loss_curves

    with pytest.raises(ValueError, match="empty"):
        plot_loss_curves({}, "x.png")
    with pytest.raises(ValueError, match="smoothing"):
        plot_loss_curves(_runs(), "x.png", smoothing=1.0)


def test_plot_inspect_needs_a_comparison(tmp_path):
    pytest.importorskip("matplotlib")
    from lowprec_moe.plot import plot_inspect

    rows = [dict(name="a", format="nvfp4", snr_db=20.0, max_rel_err=0.1),
            dict(name="b", format="float32", snr_db=float("inf"), max_rel_err=0.0),
            dict(name="c", format="mxfp8", snr_db=None, max_rel_err=None)]
    assert plot_inspect(rows, tmp_path / "e.png") == 2
    assert (tmp_path / "e.png").read_bytes().startswith(PNG_MAGIC)
    with pytest.raises(ValueError, match="no tensor was compared"):
        plot_inspect(rows[2:], tmp_path / "f.png")


def test_inspect_plot_option(tmp_path):
    pytest.importorskip("matplotlib")
    from lowprec_moe.cli import main

    rng = np.random.default_rng(0)
    orig = tmp_path / "m.npz"
    np.savez(orig, w=rng.standard_normal((32, 64)).astype(np.float32),
             v=rng.standard_normal((16, 64)).astype(np.float32))
    q = tmp_path / "q.safetensors"
    runner = CliRunner()
    assert runner.invoke(main, ["quantize", str(orig), str(q), "--format", "mxfp8"]).exit_code == 0
    png = tmp_path / "e.png"
    res = runner.invoke(main, ["inspect", str(q), "--against", str(orig), "--plot", str(png)])
    assert res.exit_code == 0, res.output
    assert "wrote" in res.output and png.read_bytes().startswith(PNG_MAGIC)
    res = runner.invoke(main, ["inspect", str(q), "--plot", str(png)])
    assert res.exit_code == 2 and "--plot needs --against" in res.output


@pytest.mark.slow
def test_train_example_cpu_smoke(tmp_path):
    pytest.importorskip("torch")
    cmd = [sys.executable, str(EXAMPLE), "--device", "cpu", "--tiny", "--steps", "2",
           "--recipes", "bf16,nvfp4", "--out-dir", str(tmp_path)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    assert list(results["runs"]) == ["bf16", "nvfp4"]
    for run in results["runs"].values():
        assert len(run["train_loss"]) == 2 and np.isfinite(run["final_eval"])
        assert 4.0 < run["train_loss"][0] < 7.0        # ~ln(256) at the start
    table = (tmp_path / "results.md").read_text()
    assert "| nvfp4 |" in table and "held-out gap to bf16" in table
    try:
        import matplotlib  # noqa: F401
    except ModuleNotFoundError:
        return
    assert (tmp_path / "loss.png").read_bytes().startswith(PNG_MAGIC)
    # --replot renders again from the JSON alone
    (tmp_path / "loss.png").unlink()
    res = subprocess.run([sys.executable, str(EXAMPLE), "--replot",
                          str(tmp_path / "results.json")], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "loss.png").exists()


@pytest.mark.gpu
def test_train_example_gpu_smoke(tmp_path):
    """The training example on the GPU, every recipe, a few steps: finite losses that start
    near ln(256)."""
    torch = pytest.importorskip("torch")
    from lowprec_moe.backend import cupy_available

    if not (cupy_available() and torch.cuda.is_available()):
        pytest.skip("needs CuPy, torch with CUDA and a GPU")
    cmd = [sys.executable, str(EXAMPLE), "--device", "cuda", "--tiny", "--steps", "3",
           "--out-dir", str(tmp_path)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    assert len(results["runs"]) == 4
    for run in results["runs"].values():
        assert len(run["train_loss"]) == 3 and np.isfinite(run["final_eval"])
        assert 4.0 < run["train_loss"][0] < 7.0
