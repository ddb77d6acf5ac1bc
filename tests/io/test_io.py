"""lowprec_moe.io: the safetensors / npy / npz readers and writers, save / load of quantized
tensors (bit-exact round trips, ModelOpt-compatible names) and every refused or broken file."""

from __future__ import annotations

import dataclasses
import json
import mmap
import os
import struct
import zipfile

import ml_dtypes
import numpy as np
import pytest

import lowprec_moe as lpm
from lowprec_moe import io as lio
from lowprec_moe.io.safetensors import DTYPES, write_safetensors

from conftest import requires_gpu


def _x(m=48, k=64, seed=0, dtype=ml_dtypes.bfloat16):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((m, k)) * 3).astype(np.float32).astype(dtype)


def assert_same_tensor(a, b, what=""):
    """Every dataclass field equal; arrays equal in dtype, shape and bytes."""
    assert type(a) is type(b), what
    for f in dataclasses.fields(a):
        va, vb = getattr(a, f.name), getattr(b, f.name)
        if isinstance(va, np.ndarray) or isinstance(vb, np.ndarray):
            assert isinstance(va, np.ndarray) and isinstance(vb, np.ndarray), (what, f.name)
            assert va.dtype == vb.dtype and va.shape == vb.shape, (what, f.name)
            assert va.tobytes() == vb.tobytes(), (what, f.name)
        else:
            assert va == vb, (what, f.name, va, vb)


def _tensors():
    x = _x()
    return {
        "nvfp4": lpm.quantize(x, "nvfp4", columnwise=True),
        "nvfp4_rs": lpm.quantize(x, "nvfp4", row_scaled=True, columnwise=True),
        "nvfp4_2d": lpm.quantize(x, "nvfp4", block_2d=True, columnwise=True),
        "nvfp4_rht_sr": lpm.quantize(x, "nvfp4", columnwise=True, rht=True,
                                     stochastic_rounding=True, seed=2**64 - 3),
        "nvfp4_col": lpm.quantize(x[:40], "nvfp4", rowwise=False, columnwise=True),
        "mxfp8": lpm.quantize(x, "mxfp8", columnwise=True),
        "mxfp8_e5m2_2d": lpm.quantize(x[:32], "mxfp8", fp8_dtype="e5m2", block_2d=True),
        "g_nvfp4": lpm.GroupedTensor.quantize(x, [10, 0, 38], "nvfp4", columnwise=True),
        "g_nvfp4_rs": lpm.GroupedTensor.quantize(x, [16, 32, 0], "nvfp4", row_scaled=True,
                                                 columnwise=True),
        "g_mxfp8": lpm.GroupedTensor.quantize(x, [5, 43], "mxfp8", columnwise=True),
        "bias": np.arange(7, dtype=np.float32),
        "emb": x,
        "fp8": x.astype(ml_dtypes.float8_e5m2),
        "ids": np.arange(6, dtype=np.int64).reshape(2, 3),
        "scalar": np.array(1.5, np.float32),
        "empty": np.zeros((0, 3), np.float16),
    }


# ------------------------------------------------------------------------- save / load
@pytest.mark.parametrize("suffix", [".safetensors", ".npz"])
def test_save_load_bit_exact(tmp_path, suffix):
    tensors = _tensors()
    path = tmp_path / f"ck{suffix}"
    lio.save(path, tensors, metadata={"source": "test"})
    loaded = lio.load(path)
    assert list(loaded) == list(tensors)
    for name, t in tensors.items():
        if isinstance(t, np.ndarray):
            assert loaded[name].dtype == t.dtype and loaded[name].shape == t.shape, name
            assert loaded[name].tobytes() == t.tobytes(), name
        else:
            assert_same_tensor(loaded[name], t, name)
            for d in ("rowwise", "columnwise"):
                if getattr(t, f"{d}_data") is not None:
                    assert loaded[name].dequantize(d).tobytes() == t.dequantize(d).tobytes()
    with lio.open_checkpoint(path) as ck:
        assert ck.metadata == {"source": "test"}
    assert sorted(os.listdir(tmp_path)) == [path.name]


def _raw_safetensors(path):
    """An independent minimal parser: header dict and data bytes."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:], n


def test_modelopt_names_and_metadata(tmp_path):
    x = _x()
    q = lpm.quantize(x, "nvfp4")
    m = lpm.quantize(x, "mxfp8", fp8_dtype="e5m2", columnwise=True)
    path = tmp_path / "w.safetensors"
    lio.save(path, {"layer.weight": q, "expert.weight": m})
    header, data, n = _raw_safetensors(path)
    assert (8 + n) % 8 == 0
    meta = header.pop("__metadata__")
    assert meta["format"] == "pt"
    own = json.loads(meta["lowprec_moe"])
    assert own["version"] == lpm.__version__ and own["scale_layout"] == "compact"
    e = own["tensors"]["layer.weight"]
    assert e["format"] == "nvfp4" and e["shape"] == [48, 64] and e["row_scaled"] is False
    assert header["layer.weight"]["dtype"] == "U8" and header["layer.weight"]["shape"] == [48, 32]
    assert header["layer.weight_scale"]["dtype"] == "F8_E4M3"
    assert header["layer.weight_scale_2"] == {**header["layer.weight_scale_2"], "dtype": "F32",
                                              "shape": []}
    b, e_ = header["layer.weight_scale_2"]["data_offsets"]
    scale_2 = np.frombuffer(data[b:e_], "<f4")[0]
    assert scale_2 == np.float32(q.amax_rowwise[0]) / np.float32(2688)
    assert header["expert.weight"]["dtype"] == "F8_E5M2"
    assert header["expert.weight_scale"]["dtype"] == "U8"
    assert header["expert.weight_columnwise"]["dtype"] == "F8_E5M2"
    assert "expert.weight_scale_2" not in header
    b, e_ = header["layer.weight"]["data_offsets"]
    assert data[b:e_] == q.rowwise_data.tobytes()


def test_load_modelopt_checkpoint_without_metadata(tmp_path):
    x = _x(dtype=np.float32)
    q = lpm.quantize(x, "nvfp4")
    path = tmp_path / "modelopt.safetensors"
    s2 = (q.amax_rowwise / np.float32(2688)).astype(np.float32).reshape(())
    with open(path, "wb") as f:
        write_safetensors(f, [("w", q.rowwise_data),
                              ("w_scale", q.rowwise_scale.view(ml_dtypes.float8_e4m3fn)),
                              ("w_scale_2", s2), ("w_input_scale", np.ones((), np.float32))])
    loaded = lio.load(path)
    assert set(loaded) == {"w", "w_input_scale"}
    w = loaded["w"]
    assert w.format == "nvfp4" and w.shape == (48, 64)
    assert w.rowwise_data.tobytes() == q.rowwise_data.tobytes()
    assert w.amax_rowwise.shape == (1,)
    assert w.amax_rowwise[0] == s2 * np.float32(2688)
    np.testing.assert_allclose(w.dequantize(), q.dequantize(), rtol=1e-6)


def test_every_safetensors_dtype_round_trips(tmp_path):
    rng = np.random.default_rng(1)
    arrays = [(label, (rng.standard_normal((3, 5)) * 4).astype(dt)) for label, dt in DTYPES.items()]
    arrays += [("scalar", np.array(2.5, np.float32)), ("empty", np.zeros((0, 4), np.float16))]
    path = tmp_path / "all.safetensors"
    with open(path, "wb") as f:
        write_safetensors(f, arrays, {"k": "v"})
    header, _, _ = _raw_safetensors(path)
    for label in DTYPES:
        assert header[label]["dtype"] == label
    with lio.open_arrays(path) as r:
        assert r.keys() == [n for n, _ in arrays] and r.metadata == {"k": "v"}
        for name, a in arrays:
            got = r.get(name)
            assert got.dtype == a.dtype and got.shape == a.shape and got.tobytes() == a.tobytes()
            assert not got.flags.writeable


@pytest.mark.parametrize("suffix", [".safetensors", ".npz"])
def test_non_contiguous_and_big_endian_arrays(tmp_path, suffix):
    base = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    arrays = {"t": base.transpose(2, 0, 1), "f": np.asfortranarray(base[0]),
              "s": base[:, ::2, 1], "be": base.astype(">i4")}
    lio.save(tmp_path / f"a{suffix}", arrays)
    got = lio.load(tmp_path / f"a{suffix}")
    for name, a in arrays.items():
        assert np.array_equal(got[name], a) and got[name].shape == a.shape, name


def test_reads_foreign_safetensors_layout(tmp_path):
    """Header order differs from data order; no metadata; no padding."""
    a = np.arange(6, dtype="<f4").reshape(2, 3)
    b = np.arange(4, dtype="<u2")
    head = {"b": {"dtype": "U16", "shape": [4], "data_offsets": [0, 8]},
            "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [8, 32]}}
    raw = json.dumps(head).encode()
    path = tmp_path / "f.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b.tobytes() + a.tobytes())
    r = lio.load(path)
    assert np.array_equal(r["a"], a) and np.array_equal(r["b"], b)


def _maps_file(a) -> bool:
    while isinstance(a, np.ndarray):
        a = a.base
    return isinstance(a.obj if isinstance(a, memoryview) else a, mmap.mmap)


def test_numpy_inputs_are_memory_mapped(tmp_path):
    x = _x()
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "f.npy", np.asfortranarray(np.arange(12.0).reshape(3, 4)))
    np.savez(tmp_path / "s.npz", x=x, b=np.ones(3))
    np.savez_compressed(tmp_path / "c.npz", x=x)
    with lio.open_arrays(tmp_path / "x.npy") as r:
        got = r.get("x")
        assert got.dtype == ml_dtypes.bfloat16 and got.tobytes() == x.tobytes()
        assert not got.flags.writeable and _maps_file(got)
    assert np.array_equal(lio.load(tmp_path / "f.npy")["f"], np.arange(12.0).reshape(3, 4))
    s = lio.load(tmp_path / "s.npz")
    assert s["x"].tobytes() == x.tobytes() and _maps_file(s["x"])
    assert lio.load(tmp_path / "c.npz")["x"].tobytes() == x.tobytes()


@pytest.mark.gpu
@requires_gpu
def test_gpu_tensor_saves_like_cpu_tensor(tmp_path):
    import cupy

    q = lpm.quantize(_x(), "nvfp4", columnwise=True)
    gq = q.replace(**{f: cupy.asarray(getattr(q, f)) for f in
                      ("rowwise_data", "rowwise_scale", "columnwise_data", "columnwise_scale",
                       "amax_rowwise", "amax_columnwise")})
    lio.save(tmp_path / "c.safetensors", {"w": q})
    lio.save(tmp_path / "g.safetensors", {"w": gq})
    assert (tmp_path / "c.safetensors").read_bytes() == (tmp_path / "g.safetensors").read_bytes()


# ------------------------------------------------------------------------- refused files
def _st(path, header, data=b"", pad=True):
    raw = json.dumps(header).encode() if not isinstance(header, bytes) else header
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


BAD_HEADERS = {
    "not json": (b"{nope", b"", "not valid JSON"),
    "not an object": (b"[1, 2]", b"", "must be a JSON object"),
    "duplicate": (b'{"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, '
                  b'"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}', b"x",
                  "duplicate key"),
    "bad dtype": ({"a": {"dtype": "F4", "shape": [2], "data_offsets": [0, 1]}}, b"x",
                  "dtype 'F4' is not supported"),
    "negative shape": ({"a": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 0]}}, b"",
                       "non-negative"),
    "bool shape": ({"a": {"dtype": "U8", "shape": [True], "data_offsets": [0, 1]}}, b"x",
                   "non-negative ints"),
    "byte count": ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"xxxx",
                   "needs 8"),
    "overlap": ({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                 "b": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}}, b"xxx",
                "overlap"),
    "hole": ({"a": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}}, b"xx", "hole"),
    "truncated data": ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"x" * 9,
                       "truncated"),
    "trailing data": ({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}, b"xx",
                      "inconsistent"),
    "extra key": ({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1], "x": 1}}, b"x",
                  "exactly the keys"),
    "metadata types": ({"__metadata__": {"a": 1}}, b"", "strings to strings"),
    "bad offsets": ({"a": {"dtype": "U8", "shape": [1], "data_offsets": [2, 1]}}, b"x",
                    "data_offsets"),
}


@pytest.mark.parametrize("case", list(BAD_HEADERS))
def test_bad_safetensors_headers(tmp_path, case):
    header, data, match = BAD_HEADERS[case]
    path = _st(tmp_path / "bad.safetensors", header, data)
    with pytest.raises(lio.CheckpointError, match=match):
        lio.load(path)


def test_truncated_safetensors_at_every_cut(tmp_path):
    good = tmp_path / "good.safetensors"
    lio.save(good, {"w": lpm.quantize(_x(16, 32), "nvfp4")})
    raw = good.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    for cut in (0, 3, 7, 8, 20, 8 + n - 1, 8 + n, len(raw) - 1):
        bad = tmp_path / f"cut{cut}.safetensors"
        bad.write_bytes(raw[:cut])
        with pytest.raises(lio.CheckpointError, match=f"{bad.name}: .*(truncated|exceeds)"):
            lio.load(bad)


def test_huge_header_length_is_refused(tmp_path):
    path = tmp_path / "h.safetensors"
    path.write_bytes(struct.pack("<Q", 2**63) + b"{}")
    with pytest.raises(lio.CheckpointError, match="exceeds the file size"):
        lio.load(path)


def _evil_object_array(marker):
    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    a = np.empty(2, dtype=object)
    a[0] = Evil()
    return a


def test_pickled_npy_is_never_unpickled(tmp_path):
    marker = tmp_path / "PWNED"
    np.save(tmp_path / "evil.npy", _evil_object_array(marker), allow_pickle=True)
    np.savez(tmp_path / "evil.npz", ok=np.ones(2), x=_evil_object_array(marker))
    for name in ("evil.npy", "evil.npz"):
        with pytest.raises(lio.CheckpointError, match="unpickled"):
            lio.load(tmp_path / name)
    assert not marker.exists()


def test_bad_npy_files(tmp_path):
    np.save(tmp_path / "ok.npy", np.arange(10, dtype=np.float32))
    raw = (tmp_path / "ok.npy").read_bytes()
    cases = {"trunc.npy": (raw[:-4], "truncated"), "long.npy": (raw + b"\0", "inconsistent"),
             "magic.npy": (b"NOTNUMPY" + raw[8:], "not a valid .npy"),
             "empty.npy": (b"", "not a valid .npy")}
    np.save(tmp_path / "rec.npy", np.zeros(2, dtype=[("a", "<i4")]))
    for name, (data, match) in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(lio.CheckpointError, match=match):
            lio.load(tmp_path / name)
    with pytest.raises(lio.CheckpointError, match="structured"):
        lio.load(tmp_path / "rec.npy")


def test_bad_npz_files(tmp_path):
    np.savez(tmp_path / "ok.npz", a=np.arange(100.0))
    raw = (tmp_path / "ok.npz").read_bytes()
    (tmp_path / "trunc.npz").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(lio.CheckpointError, match="zip"):
        lio.load(tmp_path / "trunc.npz")
    np.savez_compressed(tmp_path / "c.npz", a=np.arange(1000.0))
    raw = bytearray((tmp_path / "c.npz").read_bytes())
    raw[200] ^= 0xFF  # inside the compressed stream
    (tmp_path / "crc.npz").write_bytes(bytes(raw))
    with pytest.raises(lio.CheckpointError):
        lio.load(tmp_path / "crc.npz")
    with zipfile.ZipFile(tmp_path / "other.npz", "w") as z:
        z.writestr("readme.txt", "hi")
    with pytest.raises(lio.CheckpointError, match="not a .npy"):
        lio.load(tmp_path / "other.npz")


def _rewrite_meta(src, dst, fn):
    header, data, _ = _raw_safetensors(src)
    own = json.loads(header["__metadata__"]["lowprec_moe"])
    fn(own, header)
    header["__metadata__"]["lowprec_moe"] = json.dumps(own)
    raw = json.dumps(header).encode()
    dst.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return dst


@pytest.mark.parametrize("edit, match", [
    (lambda o, h: o["tensors"]["w"].update(shape=[48, 128]), "has shape"),
    (lambda o, h: o["tensors"]["w"].update(format="int4"), "format='int4'"),
    (lambda o, h: o["tensors"]["w"].update(shape=[48, 60]), "K=60"),
    (lambda o, h: o["tensors"]["w"]["arrays"].update(rowwise_data="gone"), "missing"),
    (lambda o, h: o["tensors"]["w"]["arrays"].pop("amax_rowwise") and
     o["tensors"]["w"]["arrays"].pop("rowwise_scale_2"), "incomplete rowwise"),
    (lambda o, h: o.update(layout_version=99), "layout_version"),
    (lambda o, h: o.pop("tensors"), "no 'tensors'"),
    (lambda o, h: o["tensors"]["w"].update(seed=-1), "seed"),
    (lambda o, h: o["tensors"]["w"].update(row_scaled=True), "has shape"),
])
def test_inconsistent_checkpoint_metadata(tmp_path, edit, match):
    good = tmp_path / "good.safetensors"
    lio.save(good, {"w": lpm.quantize(_x(), "nvfp4")})
    bad = _rewrite_meta(good, tmp_path / "bad.safetensors", edit)
    with pytest.raises(lio.CheckpointError, match=match):
        lio.load(bad)


def test_lowprec_metadata_not_json(tmp_path):
    path = _st(tmp_path / "m.safetensors", {"__metadata__": {"lowprec_moe": "{oops"}})
    with pytest.raises(lio.CheckpointError, match="not valid JSON"):
        lio.load(path)


# ------------------------------------------------------------------------- atomic writes
def test_failed_save_leaves_nothing_behind(tmp_path):
    path = tmp_path / "out.safetensors"
    path.write_bytes(b"previous")
    bad = np.empty(2, dtype=object)
    for target in (path, tmp_path / "new.npz"):
        with pytest.raises(TypeError, match="dtype=object"):
            lio.save(target, {"ok": np.ones(3), "bad": bad})
    assert path.read_bytes() == b"previous"
    assert sorted(os.listdir(tmp_path)) == ["out.safetensors"]


def test_save_errors(tmp_path):
    q = lpm.quantize(_x(), "nvfp4")
    with pytest.raises(FileNotFoundError):
        lio.save(tmp_path / "no" / "x.safetensors", {"w": q})
    with pytest.raises(ValueError, match="unsupported file type"):
        lio.save(tmp_path / "x.bin", {"w": q})
    with pytest.raises(ValueError, match="used twice"):
        lio.save(tmp_path / "x.safetensors", {"w": q, "w_scale": np.ones(2)})
    with pytest.raises(TypeError, match="must be an array"):
        lio.save(tmp_path / "x.safetensors", {"w": [1, 2]})
    with pytest.raises(TypeError, match="mapping"):
        lio.save(tmp_path / "x.safetensors", [q])
    (tmp_path / "d.safetensors").mkdir()
    with pytest.raises(IsADirectoryError):
        lio.save(tmp_path / "d.safetensors", {"w": q})
    assert sorted(os.listdir(tmp_path)) == ["d.safetensors"]


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0,
                    reason="needs POSIX permissions and a non-root user")
def test_unwritable_directory(tmp_path):
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)
    try:
        with pytest.raises(PermissionError):
            lio.save(d / "x.safetensors", {"a": np.ones(2)})
    finally:
        d.chmod(0o755)
