"""The ``lowprec-moe`` command: quantize / dequantize / inspect round trips on every input
type, bit-exact agreement with the library, and every failure mode (one line on stderr, exit
status 1 for errors and 2 for usage, no output left behind). A few cases run as real
subprocesses through ``python -m cli``."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner

from lowprec_moe import cli
import lowprec_moe as lpm
from lowprec_moe import io as lio
from lowprec_moe.io import _shard, convert

from conftest import GPU_AVAILABLE, requires_gpu
from test_io import _evil_object_array, assert_same_tensor


def _x(shape=(64, 128), seed=0, dtype=ml_dtypes.bfloat16):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * 2).astype(np.float32).astype(dtype)


def run(*args):
    return CliRunner().invoke(cli.main, [str(a) for a in args], catch_exceptions=False)


def assert_fails(result, code, match, tmp_path=None, before=None):
    """Exit ``code``, the message on stderr (one line for errors), nothing new on disk."""
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert "Traceback" not in result.stderr
    if code == 1:
        assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert re.search(match, result.stderr), result.stderr
    if tmp_path is not None:
        assert sorted(os.listdir(tmp_path)) == before


def _inputs(tmp_path):
    """The same tensors as .npy (one), .npz and .safetensors files."""
    w = _x()
    tensors = {"w": w, "bias": np.ones(128, np.float32), "odd": _x((8, 40), 1),
               "e": _x((2, 32, 64), 2, np.float16), "ids": np.arange(4, dtype=np.int32)}
    np.save(tmp_path / "w.npy", w)
    np.savez(tmp_path / "in.npz", **tensors)
    lio.save(tmp_path / "in.safetensors", tensors)
    return tensors


# ------------------------------------------------------------------------- help
def test_help_lists_commands_with_examples():
    out = run("--help").output
    for name in ("quantize", "dequantize", "inspect", "info", "demo"):
        assert re.search(rf"^  {name}\s+\S", out, re.M), out
    for name in ("quantize", "dequantize", "inspect", "info", "demo"):
        sub = run(name, "--help")
        assert sub.exit_code == 0 and "Example:" in sub.output and "lowprec-moe" in sub.output


def test_info():
    r = run("info")
    assert r.exit_code == 0
    for word in ("lowprec_moe", "backend:", "kernel dir:", "kernel cache dir:"):
        assert word in r.output
    if not GPU_AVAILABLE:
        assert "gpu: none" in r.output


# ------------------------------------------------------------------------- round trips
@pytest.mark.parametrize("src", ["w.npy", "in.npz", "in.safetensors"])
@pytest.mark.parametrize("fmt, opts, kw", [
    ("nvfp4", [], {}),
    ("nvfp4", ["--columnwise", "--row-scaled", "--layout", "lowprec"],
     {"columnwise": True, "row_scaled": True}),
    ("mxfp8", ["--fp8-dtype", "e5m2", "--block-2d"], {"fp8_dtype": "e5m2", "block_2d": True}),
])
@pytest.mark.parametrize("out", ["q.safetensors", "q.npz"])
def test_quantize_dequantize_round_trip(tmp_path, src, fmt, opts, kw, out):
    tensors = _inputs(tmp_path)
    r = run("quantize", tmp_path / src, tmp_path / out, "--format", fmt, "--device", "cpu", *opts)
    assert r.exit_code == 0, r.output
    loaded = lio.load(tmp_path / out)
    expect = lpm.quantize(tensors["w"], fmt, **kw)
    assert_same_tensor(loaded["w"], expect)
    if src != "w.npy":
        assert "copied unchanged: bias: rank 1" in r.output
        assert re.search(r"copied unchanged: odd: K=40 is not a multiple", r.output)
        assert np.array_equal(loaded["bias"], tensors["bias"])
        assert loaded["ids"].dtype == np.int32 and loaded["odd"].dtype == ml_dtypes.bfloat16
        assert "e" not in loaded  # an expert stack is written one tensor per expert
        for i in range(2):
            assert_same_tensor(loaded[f"e.{i}"], lpm.quantize(tensors["e"][i], fmt, **kw))
        assert "expert stack e: 2 experts written as e.{i}" in r.output
    for dtype in ("float32", "bfloat16"):
        dq = tmp_path / f"dq_{dtype}.safetensors"
        r = run("dequantize", tmp_path / out, dq, "--dtype", dtype)
        assert r.exit_code == 0, r.output
        back = lio.load(dq)
        assert back["w"].tobytes() == lpm.dequantize(expect, dtype=dtype).tobytes()
        assert back["w"].dtype == np.dtype(lpm.dequantize(expect, dtype=dtype).dtype)
        if src != "w.npy":
            assert back["e"].shape == (2, 32, 64)  # original shape restored
            want = np.stack([lpm.dequantize(lpm.quantize(tensors["e"][i], fmt, **kw),
                                            dtype=dtype) for i in range(2)])
            assert back["e"].tobytes() == want.tobytes()
            assert back["odd"].tobytes() == tensors["odd"].tobytes()


def test_dequantize_columnwise_and_npy_output(tmp_path):
    _inputs(tmp_path)
    assert run("quantize", tmp_path / "w.npy", tmp_path / "q.npz", "--format", "nvfp4",
               "--columnwise", "--layout", "lowprec").exit_code == 0
    q = lio.load(tmp_path / "q.npz")["w"]
    r = run("dequantize", tmp_path / "q.npz", tmp_path / "col.npy", "--direction", "columnwise",
            "--dtype", "float32")
    assert r.exit_code == 0, r.output
    got = np.load(tmp_path / "col.npy", allow_pickle=False)
    assert got.tobytes() == lpm.dequantize(q, "columnwise").tobytes()


def test_dequantize_modelopt_checkpoint(tmp_path):
    from lowprec_moe.io.safetensors import write_safetensors

    q = lpm.quantize(_x(dtype=np.float32), "nvfp4")
    s2 = (q.amax_rowwise / np.float32(2688)).astype(np.float32).reshape(())
    with open(tmp_path / "mo.safetensors", "wb") as f:
        write_safetensors(f, [("m.weight", q.rowwise_data),
                              ("m.weight_scale", q.rowwise_scale.view(ml_dtypes.float8_e4m3fn)),
                              ("m.weight_scale_2", s2)])
    r = run("dequantize", tmp_path / "mo.safetensors", tmp_path / "dq.npz")
    assert r.exit_code == 0, r.output
    expect = q.replace(amax_rowwise=(s2 * np.float32(2688)).reshape(1))
    assert lio.load(tmp_path / "dq.npz")["m.weight"].tobytes() == expect.dequantize().tobytes()


def test_keys_and_grouped(tmp_path):
    tensors = _inputs(tmp_path)
    r = run("quantize", tmp_path / "in.safetensors", tmp_path / "q.safetensors", "--format",
            "nvfp4", "--keys", "e", "--keys", "nomatch*", "--grouped", "--layout", "lowprec")
    assert r.exit_code == 0, r.output
    assert "quantized (nvfp4, lowprec layout) 1 of 5 tensors" in r.output
    assert "expert stack e: kept fused (one amax per expert)" in r.output
    assert "copied unchanged: w: not selected by --keys" in r.output
    loaded = lio.load(tmp_path / "q.safetensors")
    g = loaded["e"]
    assert isinstance(g, lpm.GroupedTensor) and g.splits == (32, 32)
    assert_same_tensor(g, lpm.GroupedTensor.quantize(tensors["e"].reshape(64, 64), [32, 32],
                                                     "nvfp4"))
    assert loaded["w"].tobytes() == tensors["w"].tobytes()


def test_inspect_table(tmp_path):
    tensors = _inputs(tmp_path)
    assert run("quantize", tmp_path / "in.npz", tmp_path / "q.safetensors", "--format",
               "nvfp4", "--columnwise", "--layout", "lowprec", "--experts", "flat").exit_code == 0
    r = run("inspect", tmp_path / "q.safetensors", "--against", tmp_path / "in.npz")
    assert r.exit_code == 0, r.output
    head = r.output.splitlines()[1]
    for col in ("name", "format", "shape", "bytes", "amax", "scale range", "SNR dB",
                "max|err|/amax"):
        assert col in head
    q = lpm.quantize(tensors["w"], "nvfp4", columnwise=True)
    ref = tensors["w"].astype(np.float64)
    err = lpm.dequantize(q).astype(np.float64) - ref
    snr = 10 * np.log10(np.sum(ref * ref) / np.sum(err * err))
    w_line = next(line for line in r.output.splitlines() if line.startswith("w "))
    assert "nvfp4 (row+col)" in w_line and "64x128" in w_line
    assert f"{snr:.2f}" in w_line and f"{q.amax_rowwise[0]:.4g}" in w_line
    assert f"{np.max(np.abs(err)) / np.max(np.abs(ref)):.3e}" in w_line
    bias = next(line for line in r.output.splitlines() if line.startswith("bias "))
    assert "float32" in bias and "inf" in bias
    rows = convert.inspect_file(tmp_path / "q.safetensors")
    assert [row["name"] for row in rows] == list(tensors)
    assert run("inspect", tmp_path / "w.npy").exit_code == 0


# ------------------------------------------------------------------------- failures
def test_missing_input(tmp_path):
    before = sorted(os.listdir(tmp_path))
    r = run("quantize", tmp_path / "nope.npy", tmp_path / "o.safetensors", "--format", "nvfp4")
    assert_fails(r, 1, "does not exist", tmp_path, before)
    assert_fails(run("inspect", tmp_path / "nope.safetensors"), 1, "does not exist")
    assert_fails(run("dequantize", tmp_path / "nope.npz", tmp_path / "o.npz"), 1,
                 "does not exist")


def test_truncated_and_inconsistent_inputs(tmp_path):
    _inputs(tmp_path)
    raw = (tmp_path / "in.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(raw[:-100])
    (tmp_path / "cut.npy").write_bytes((tmp_path / "w.npy").read_bytes()[:-1])
    (tmp_path / "cut.npz").write_bytes((tmp_path / "in.npz").read_bytes()[:300])
    before = sorted(os.listdir(tmp_path))
    for name, match in (("cut.safetensors", "truncated"), ("cut.npy", "truncated"),
                        ("cut.npz", "zip")):
        r = run("quantize", tmp_path / name, tmp_path / "o.safetensors", "--format", "mxfp8")
        assert_fails(r, 1, f"{name}: .*{match}", tmp_path, before)
        assert_fails(run("inspect", tmp_path / name), 1, match)


def test_nonfinite_inputs(tmp_path):
    x = _x(dtype=np.float32)
    x[5, 7] = np.inf
    np.savez(tmp_path / "bad.npz", ok=_x(), bad=x)
    before = sorted(os.listdir(tmp_path))
    r = run("quantize", tmp_path / "bad.npz", tmp_path / "o.safetensors", "--format", "nvfp4")
    assert_fails(r, 1, "tensor 'bad' contains NaN or inf.*--allow-nonfinite", tmp_path, before)
    r = run("quantize", tmp_path / "bad.npz", tmp_path / "o.safetensors", "--format", "nvfp4",
            "--allow-nonfinite")
    assert r.exit_code == 0, r.output
    assert_same_tensor(lio.load(tmp_path / "o.safetensors")["bad"], lpm.quantize(x, "nvfp4"))


def test_unwritable_outputs(tmp_path):
    _inputs(tmp_path)
    (tmp_path / "dir.safetensors").mkdir()
    (tmp_path / "keep.safetensors").write_bytes(b"old")
    before = sorted(os.listdir(tmp_path))
    r = run("quantize", tmp_path / "w.npy", tmp_path / "no" / "o.safetensors", "--format",
            "nvfp4")
    assert_fails(r, 1, "output directory does not exist", tmp_path, before)
    r = run("quantize", tmp_path / "w.npy", tmp_path / "dir.safetensors", "--format", "nvfp4")
    assert_fails(r, 1, "is a directory", tmp_path, before)
    # a failure after writing started keeps the old file and leaves no temporary file
    x = _x(dtype=np.float32)
    x[0, 0] = np.nan
    np.savez(tmp_path / "late.npz", a=_x(), z=x)
    before = sorted(os.listdir(tmp_path))
    r = run("quantize", tmp_path / "late.npz", tmp_path / "keep.safetensors", "--format", "nvfp4")
    assert_fails(r, 1, "already exists; pass --force", tmp_path, before)
    r = run("quantize", tmp_path / "late.npz", tmp_path / "keep.safetensors", "--format", "nvfp4",
            "--force")
    assert_fails(r, 1, r"late.npz: tensor 'z' contains NaN", tmp_path, before)
    assert (tmp_path / "keep.safetensors").read_bytes() == b"old"


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0,
                    reason="needs POSIX permissions and a non-root user")
def test_read_only_output_directory(tmp_path):
    _inputs(tmp_path)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        r = run("quantize", tmp_path / "w.npy", ro / "o.safetensors", "--format", "nvfp4")
        assert_fails(r, 1, "not writable")
    finally:
        ro.chmod(0o755)


@pytest.mark.parametrize("args, match", [
    (["quantize", "w.npy", "o.safetensors"], "Missing option '--format'"),
    (["quantize", "w.npy", "o.safetensors", "--format", "int4"], "int4"),
    (["quantize", "w.npy", "o.txt", "--format", "nvfp4"], "suffix '.txt'"),
    (["quantize", "w.txt", "o.npz", "--format", "nvfp4"], "suffix '.txt'"),
    (["quantize", "w.npy", "o.npz", "--format", "nvfp4", "--fp8-dtype", "e5m2"], "mxfp8 only"),
    (["quantize", "w.npy", "o.npz", "--format", "nvfp4", "--row-scaled", "--block-2d"],
     "row_scaled=True cannot be combined with block_2d"),
    (["quantize", "w.npy", "o.npz", "--format", "mxfp8", "--row-scaled"], "row_scaled"),
    (["dequantize", "q.npz", "o.npz", "--dtype", "float64"], "float64"),
    (["inspect"], "Missing argument"),
])
def test_usage_errors(tmp_path, args, match):
    _inputs(tmp_path)
    before = sorted(os.listdir(tmp_path))
    args = [str(tmp_path / a) if "." in a and not a.startswith("-") else a for a in args]
    assert_fails(run(*args), 2, match, tmp_path, before)


def test_other_errors_are_one_line(tmp_path, monkeypatch):
    tensors = _inputs(tmp_path)
    before = sorted(os.listdir(tmp_path))
    r = run("quantize", tmp_path / "w.npy", tmp_path / "o.npz", "--format", "nvfp4", "--keys",
            "x*")
    assert_fails(r, 1, r"no tensor name matches keys=\['x\*'\]", tmp_path, before)
    r = run("dequantize", tmp_path / "in.safetensors", tmp_path / "o.npz")
    assert_fails(r, 1, "holds no quantized tensors", tmp_path, before)
    lio.save(tmp_path / "q.npz", {"w": lpm.quantize(tensors["w"], "nvfp4"), "b": np.ones(2)})
    before = sorted(os.listdir(tmp_path))
    assert_fails(run("dequantize", tmp_path / "q.npz", tmp_path / "o.npz", "--direction",
                     "columnwise"), 1, "tensor 'w' has no columnwise copy", tmp_path, before)
    assert_fails(run("dequantize", tmp_path / "q.npz", tmp_path / "o.npy"), 1,
                 "a .npy file holds one array", tmp_path, before)
    assert_fails(run("quantize", tmp_path / "q.npz", tmp_path / "o.npz", "--format", "nvfp4"),
                 1, "already holds quantized tensors", tmp_path, before)
    lio.save(tmp_path / "clash.npz", {"w": tensors["w"], "w_scale": np.ones(2)})
    before = sorted(os.listdir(tmp_path))
    assert_fails(run("quantize", tmp_path / "clash.npz", tmp_path / "o.npz", "--format",
                     "nvfp4"), 1, "name clash: output array 'w_scale'", tmp_path, before)

    def no_kernel(*a, **k):
        raise NotImplementedError("the GPU kernel for quantize_nvfp4 is not available yet; "
                                  "move the input to the host explicitly")

    monkeypatch.setattr(_shard, "quantize", no_kernel)
    assert_fails(run("quantize", tmp_path / "w.npy", tmp_path / "o.npz", "--format", "nvfp4"),
                 1, "not available yet", tmp_path, before)


@pytest.mark.skipif(GPU_AVAILABLE, reason="checks the message on machines without a GPU")
def test_device_gpu_without_gpu(tmp_path):
    _inputs(tmp_path)
    before = sorted(os.listdir(tmp_path))
    r = run("quantize", tmp_path / "w.npy", tmp_path / "o.npz", "--format", "nvfp4", "--device",
            "gpu")
    assert_fails(r, 1, "needs CuPy and a CUDA GPU", tmp_path, before)
    r = run("quantize", tmp_path / "w.npy", tmp_path / "o.npz", "--format", "nvfp4", "--device",
            "auto")
    assert r.exit_code == 0


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_device_gpu_matches_cpu(tmp_path, fmt):
    _inputs(tmp_path)
    outs = {}
    for device in ("cpu", "gpu"):
        out = tmp_path / f"{device}.safetensors"
        r = run("quantize", tmp_path / "in.safetensors", out, "--format", fmt, "--columnwise",
                "--layout", "lowprec", "--device", device)
        if device == "gpu" and r.exit_code == 1 and "not available yet" in r.stderr:
            pytest.skip("the GPU quantize kernels are not available in this build")
        assert r.exit_code == 0, r.output
        outs[device] = out.read_bytes()
    assert outs["cpu"] == outs["gpu"]


def test_progress_bar_on_a_terminal(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self):
            return True

    err = Tty()
    monkeypatch.setattr(cli.sys, "stderr", err)
    assert list(cli._progress(["a", "b", "c"], "quantizing")) == ["a", "b", "c"]
    assert "quantizing" in err.getvalue()
    assert list(cli._progress(["a"], "quantizing")) == ["a"]


# ------------------------------------------------------------------------- subprocesses
def _sub(*args, cwd):
    return subprocess.run([sys.executable, "-m", "lowprec_moe.cli", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_subprocess_round_trip_and_failures(tmp_path):
    x = _x((32, 64))
    np.save(tmp_path / "x.npy", x)
    r = _sub("quantize", "x.npy", "x.safetensors", "--format", "nvfp4", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = _sub("dequantize", "x.safetensors", "y.npy", cwd=tmp_path)  # bf16: NumPy cannot read it
    assert r.returncode == 1 and "NumPy cannot read bfloat16" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "y.npy").exists()
    r = _sub("dequantize", "x.safetensors", "y.npy", "--dtype", "float32", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    y = np.load(tmp_path / "y.npy", allow_pickle=False)
    assert y.tobytes() == lpm.dequantize(lpm.quantize(x, "nvfp4"), dtype="float32").tobytes()
    r = _sub("inspect", "x.safetensors", "--against", "x.npy", cwd=tmp_path)
    assert r.returncode == 0 and re.search(r"^x\s+nvfp4 \(row\)\s+32x64", r.stdout, re.M)

    marker = tmp_path / "PWNED"
    np.save(tmp_path / "evil.npy", _evil_object_array(marker), allow_pickle=True)
    (tmp_path / "cut.safetensors").write_bytes((tmp_path / "x.safetensors").read_bytes()[:-3])
    before = sorted(os.listdir(tmp_path))
    for args in (("quantize", "evil.npy", "o.safetensors", "--format", "mxfp8"),
                 ("inspect", "evil.npy"), ("dequantize", "cut.safetensors", "o.npz")):
        r = _sub(*args, cwd=tmp_path)
        assert r.returncode == 1, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
        assert re.search("unpickled|truncated", r.stderr)
    assert not marker.exists()
    assert sorted(os.listdir(tmp_path)) == before
    r = _sub("quantize", "x.npy", "o.safetensors", cwd=tmp_path)
    assert r.returncode == 2 and "--format" in r.stderr


def test_entry_point_help(tmp_path):
    exe = os.path.join(os.path.dirname(sys.executable), "lowprec-moe")
    if not os.path.exists(exe):
        pytest.skip("the lowprec-moe entry point is not installed next to this Python")
    r = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "quantize" in r.stdout
