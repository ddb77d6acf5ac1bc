"""ArrayWriter's ways of producing a safetensors file give the same bytes: arrays written at
once, arrays held until commit, held arrays spilling over ``HOLD_BYTES``, and the kernel copy of
the temporary file with every fallback."""

from __future__ import annotations

import errno
import os

import ml_dtypes
import numpy as np
import pytest

from lowprec_moe.io import arrays as A


def _arrays():
    rng = np.random.default_rng(0)
    base = rng.standard_normal((6, 10)).astype(np.float32)
    return [("a", base.astype(ml_dtypes.bfloat16)), ("b", rng.integers(0, 255, 333, np.uint8)),
            ("t", base.T), ("be", base.astype(">f4")), ("e", np.zeros((0, 3), np.float16)),
            ("s", np.array(1.5, np.float32)), ("f8", base.astype(ml_dtypes.float8_e4m3fn)),
            ("c", rng.integers(-9, 9, (4, 5), np.int64))]


def _write(path, hold):
    with A.ArrayWriter(path, hold=hold) as w:
        for name, a in _arrays():
            w.add(name, a)
        w.commit({"k": "v"})
    return path.read_bytes()


@pytest.mark.parametrize("hold_bytes", [0, 400, 1 << 30])
def test_held_and_streamed_files_are_identical(tmp_path, monkeypatch, hold_bytes):
    streamed = _write(tmp_path / "s.safetensors", hold=False)
    monkeypatch.setattr(A.ArrayWriter, "HOLD_BYTES", hold_bytes)  # 400: spills midway
    assert _write(tmp_path / "h.safetensors", hold=True) == streamed
    assert sorted(os.listdir(tmp_path)) == ["h.safetensors", "s.safetensors"]


def _fail_with(code):
    def copy_file_range(*args, **kwargs):
        raise OSError(code, os.strerror(code))
    return copy_file_range


@pytest.mark.parametrize("how", ["missing", "EXDEV", "ENOSYS", "EINVAL", "EOPNOTSUPP",
                                 "partial"])
def test_copy_fallbacks_give_the_same_file(tmp_path, monkeypatch, how):
    expected = _write(tmp_path / "ref.safetensors", hold=False)
    if how == "missing":
        monkeypatch.delattr(os, "copy_file_range", raising=False)
    elif how == "partial":
        real, calls = os.copy_file_range, []

        def copy_file_range(src, dst, count, offset_src=None, offset_dst=None):
            if calls:
                raise OSError(errno.EXDEV, "cross-device")
            calls.append(1)
            return real(src, dst, min(count, 100), offset_src, offset_dst)
        monkeypatch.setattr(os, "copy_file_range", copy_file_range)
    else:
        monkeypatch.setattr(os, "copy_file_range", _fail_with(getattr(errno, how)))
    assert _write(tmp_path / "x.safetensors", hold=False) == expected


def test_copy_error_is_raised_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "copy_file_range", _fail_with(errno.ENOSPC))
    with pytest.raises(OSError, match="No space"):
        _write(tmp_path / "x.safetensors", hold=False)
    assert os.listdir(tmp_path) == []


def test_uncommitted_held_arrays_leave_nothing(tmp_path):
    with A.ArrayWriter(tmp_path / "x.safetensors", hold=True) as w:
        w.add("a", np.ones(4))
    assert os.listdir(tmp_path) == []
