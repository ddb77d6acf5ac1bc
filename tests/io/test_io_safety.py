"""No input can lose data or exhaust memory: outputs never replace inputs, existing outputs need
--force, signals leave no temporary files, and every reader bounds sizes, checks CRCs, refuses
non-regular files and contradictions, naming the file and the tensor."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
import zipfile

import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner

import lowprec_moe as lpm
from lowprec_moe import cli
from lowprec_moe import io as lio
from lowprec_moe.io import _safety, convert
from lowprec_moe.io.safetensors import write_safetensors


def _x(shape=(64, 128), seed=0, dtype=ml_dtypes.bfloat16):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * 2).astype(np.float32).astype(dtype)


def run(*args):
    return CliRunner().invoke(cli.main, [str(a) for a in args], catch_exceptions=False)


def _model(tmp_path, name="m.safetensors"):
    path = tmp_path / name
    lio.save(path, {"layers.0.mlp.w1.weight": _x(), "norm.weight": np.ones(128, np.float32)})
    return path


def _no_temp_files(directory):
    left = [f for f in os.listdir(directory) if f.endswith((".tmp", ".old"))]
    assert not left, left


# ------------------------------------------------------------------ outputs vs inputs
@pytest.mark.parametrize("how", ["same", "dot", "symlink", "hardlink"])
def test_quantize_refuses_to_write_over_its_input(tmp_path, how, monkeypatch):
    src = _model(tmp_path)
    original = src.read_bytes()
    monkeypatch.chdir(tmp_path)
    dst = {"same": "m.safetensors", "dot": "./m.safetensors"}.get(how)
    if how == "symlink":
        os.symlink(src, tmp_path / "link.safetensors")
        dst = "link.safetensors"
    elif how == "hardlink":
        os.link(src, tmp_path / "hard.safetensors")
        dst = "hard.safetensors"
    for extra in ([], ["--force"]):
        r = run("quantize", "m.safetensors", dst, "--format", "nvfp4", *extra)
        assert r.exit_code == 1 and "is the input" in r.stderr, r.output
        assert len(r.stderr.strip().splitlines()) == 1
    assert src.read_bytes() == original
    _no_temp_files(tmp_path)


def test_dequantize_refuses_to_write_over_its_input(tmp_path):
    src = _model(tmp_path)
    q = tmp_path / "q.safetensors"
    assert run("quantize", src, q, "--format", "nvfp4").exit_code == 0
    before = q.read_bytes()
    r = run("dequantize", q, q, "--force")
    assert r.exit_code == 1 and "is the input" in r.stderr
    assert q.read_bytes() == before
    with pytest.raises(ValueError, match="is the input"):
        convert.dequantize_file(q, q, force=True)


def test_existing_output_needs_force(tmp_path):
    src = _model(tmp_path)
    out = tmp_path / "q.safetensors"
    out.write_bytes(b"keep me")
    r = run("quantize", src, out, "--format", "nvfp4")
    assert r.exit_code == 1 and "already exists; pass --force" in r.stderr
    assert out.read_bytes() == b"keep me"
    assert run("quantize", src, out, "--format", "nvfp4", "--force").exit_code == 0
    assert "layers.0.mlp.w1.weight" in lio.load(out)


def test_directory_output_holding_the_input_is_refused(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    _model(model, "model.safetensors")
    for dst in (model, tmp_path):
        r = run("quantize", model, dst, "--format", "nvfp4", "--force")
        assert r.exit_code == 1 and ("is the input" in r.stderr or "holds the input"
                                     in r.stderr), r.output
    assert (model / "model.safetensors").exists()


# ------------------------------------------------------------------ signals
def test_sigterm_inside_a_conversion_leaves_no_temporary_file(tmp_path):
    src = _model(tmp_path)

    class KillMidway:
        def start(self, total, label):
            pass

        def advance(self, nbytes, name=""):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.5)  # the handler runs at the next bytecode

        def finish(self):
            pass

    with pytest.raises(_safety.Interrupted):
        with _safety.cleanup_on_signals():
            convert.quantize_file(src, tmp_path / "q.npz", "nvfp4", progress=KillMidway())
    assert sorted(os.listdir(tmp_path)) == ["m.safetensors"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


@pytest.mark.skipif(os.name != "posix", reason="POSIX signals")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_cli_killed_by_a_signal_cleans_up(tmp_path, sig):
    if sig == signal.SIGINT and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # a background job: the child inherits the ignored SIGINT, and Python keeps it ignored
        pytest.skip("SIGINT is ignored in this process, so it is in the CLI it starts")
    # big enough that the conversion outlives the first temporary file by ~0.5 s on 2 cores
    rng = np.random.default_rng(0)
    lio.save(tmp_path / "big.safetensors",
             {f"l{i}.weight": rng.standard_normal((1024, 2048), np.float32) for i in range(48)})
    p = subprocess.Popen([sys.executable, "-m", "lowprec_moe.cli", "quantize",
                          "big.safetensors", "q.npz", "--format", "nvfp4", "--device", "cpu"],
                         cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not any(f.endswith(".tmp") for f in os.listdir(tmp_path)):
        assert p.poll() is None and time.monotonic() < deadline, "no temporary file appeared"
        time.sleep(0.01)
    p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 128 + sig, err
    assert "no output was written" in err and "Traceback" not in err
    assert sorted(os.listdir(tmp_path)) == ["big.safetensors"]


# ------------------------------------------------------------------ readers
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifo_input_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "in.safetensors"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="is a FIFO"):
        lio.load(fifo)
    r = run("quantize", fifo, tmp_path / "o.safetensors", "--format", "nvfp4")
    assert r.exit_code == 1 and "FIFO" in r.stderr


def test_corrupt_byte_in_a_stored_npz_member_is_caught(tmp_path):
    path = tmp_path / "a.npz"
    np.savez(path, w=np.arange(4096, dtype=np.float32))
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x40
    path.write_bytes(bytes(raw))
    with pytest.raises(zipfile.BadZipFile, match="Bad CRC-32"):  # what NumPy itself says
        np.load(path)["w"]
    with pytest.raises(lio.CheckpointError, match=r"a\.npz: .*'w\.npy' is corrupt \(bad CRC-32"):
        lio.load(path)
    r = run("quantize", path, tmp_path / "o.safetensors", "--format", "nvfp4")
    assert r.exit_code == 1 and "bad CRC-32" in r.stderr


def _patch_sizes(raw: bytes, size: int) -> bytes:
    """Make every zip header of ``raw`` claim ``size`` uncompressed bytes."""
    raw = bytearray(raw)
    for sig, off in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
        i = raw.find(sig)
        while i >= 0:
            raw[i + off:i + off + 4] = struct.pack("<I", size)
            i = raw.find(sig, i + 4)
    return bytes(raw)


def test_tiny_npz_claiming_gigabytes_is_refused_before_allocating(tmp_path):
    path = tmp_path / "claim.npz"
    np.savez_compressed(path, w=np.zeros(8, np.float32))
    path.write_bytes(_patch_sizes(path.read_bytes(), 4_000_000_000))
    assert path.stat().st_size < 400
    import tracemalloc

    tracemalloc.start()
    with pytest.raises(lio.CheckpointError, match="claims 4000000000 bytes.*cannot expand"):
        lio.load(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 50 << 20


def test_overlapping_npz_members_are_refused(tmp_path):
    path = tmp_path / "bomb.npz"
    np.savez_compressed(path, a=np.zeros(1 << 16, np.float32))
    raw = path.read_bytes()
    cd = raw.find(b"PK\x01\x02")
    eocd = raw.find(b"PK\x05\x06")
    entry = raw[cd:eocd]
    twin = entry.replace(b"a.npy", b"b.npy")  # a second name for the same compressed bytes
    tail = bytearray(raw[eocd:])
    tail[8:12] = struct.pack("<HH", 2, 2)
    tail[12:16] = struct.pack("<I", 2 * len(entry))
    path.write_bytes(raw[:eocd] + twin + bytes(tail))
    assert len(zipfile.ZipFile(path).infolist()) == 2
    with pytest.raises(lio.CheckpointError, match="overlap"):
        lio.load(path)


def test_dtype_contradicted_by_metadata_is_refused(tmp_path):
    x = _x((4, 32)).astype(ml_dtypes.float8_e4m3fn)
    path = tmp_path / "f8.safetensors"
    meta = {"lowprec_moe": json.dumps({"version": "0", "layout_version": 1, "tensors": {
        "x": {"type": "array", "dtype": "float8_e5m2"}}})}
    with open(path, "wb") as f:
        write_safetensors(f, [("x", x)], meta)
    with pytest.raises(lio.CheckpointError, match=r"f8\.safetensors: tensor 'x': the file stores "
                                                  r"it as float8_e4m3fn, the metadata says"):
        lio.load(path)


def test_index_cannot_point_outside_its_directory(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    _model(tmp_path, "outside.safetensors")
    (model / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"layers.0.mlp.w1.weight": "../outside.safetensors"}}))
    r = run("quantize", model, tmp_path / "out", "--format", "nvfp4")
    assert r.exit_code == 1 and "must be a plain file name" in r.stderr
    (model / "model.safetensors.index.json").write_text("[" * 100000)
    r = run("quantize", model, tmp_path / "out", "--format", "nvfp4")
    assert r.exit_code == 1 and "model.safetensors.index.json" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "out").exists()


# ------------------------------------------------------------------ save refuses what load refuses
def test_save_refuses_non_string_npz_metadata(tmp_path):
    for meta in ({"a": 1}, {"a": ["x"]}, {1: "x"}):
        with pytest.raises(TypeError, match="metadata must map str to str"):
            lio.save(tmp_path / "m.npz", {"x": np.ones(2)}, metadata=meta)
    assert os.listdir(tmp_path) == []


def test_save_refuses_a_hand_built_tensor_with_a_wrong_scale_shape(tmp_path):
    q = lpm.quantize(_x((32, 64)), "nvfp4")
    bad = q.replace(rowwise_scale=np.zeros((32, 3), np.uint8))
    for suffix in (".safetensors", ".npz"):
        with pytest.raises(ValueError, match=r"tensor 'w': array 'w_scale' has shape \(32, 3\), "
                                             r"expected \(32, 4\).*cannot be saved"):
            lio.save(tmp_path / f"w{suffix}", {"w": bad})
    assert os.listdir(tmp_path) == []


def test_errors_name_the_file_and_the_tensor(tmp_path):
    x = _x((32, 64), dtype=np.float32)
    x[3, 5] = np.inf
    lio.save(tmp_path / "nan.safetensors", {"ok.weight": _x((32, 64)), "bad.weight": x})
    with pytest.raises(ValueError, match=r"nan\.safetensors: tensor 'bad\.weight' contains NaN"):
        convert.quantize_file(tmp_path / "nan.safetensors", tmp_path / "o.safetensors", "nvfp4")
    assert sorted(os.listdir(tmp_path)) == ["nan.safetensors"]


@pytest.mark.parametrize("header, match", [
    (b"[" * 50000 + b"]" * 50000, "header is nested too deeply"),
    (json.dumps({"x": {"dtype": "F32", "shape": [2**63, 0], "data_offsets": [0, 0]}}).encode(),
     r"tensor 'x': shape \[9223372036854775808, 0\] must be a list of at most 32 "
     "non-negative ints"),
    (json.dumps({"x": {"dtype": "F32", "shape": [1] * 70, "data_offsets": [0, 4]}}).encode(),
     "must be a list of at most 32 non-negative ints"),
    (json.dumps({"__metadata__": {"lowprec_moe": "[" * 50000 + "]" * 50000}}).encode(),
     r"__metadata__\['lowprec_moe'\] is nested too deeply"),
])
def test_hostile_headers_give_clear_errors(tmp_path, header, match):
    path = tmp_path / "x.safetensors"
    body = b"\0" * 4 if b"[1, 1" in header else b""
    path.write_bytes(struct.pack("<Q", len(header)) + header + body)
    with pytest.raises(lio.CheckpointError, match=r"x\.safetensors: .*" + match):
        lio.load(path)
    r = run("inspect", path)
    assert r.exit_code == 1 and "x.safetensors" in r.stderr and "Traceback" not in r.stderr
