"""lowprec_moe.backend: module selection and the NumPy/CuPy mixing rules.

The CPU tests stand a small fake ``cupy`` module in ``sys.modules`` so the mixing and
multi-device rules are checked on machines without a GPU; the ``gpu`` tests repeat the important
ones with the real CuPy.
"""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from lowprec_moe import backend


# ------------------------------------------------------------------------------------------
# A fake CuPy: just enough for is_cupy_array / get_xp


class _FakeDevice:
    def __init__(self, id_):
        self.id = id_


class _FakeNdarray:
    def __init__(self, device=0):
        self.device = _FakeDevice(device)

    def get(self):
        return np.zeros(3)


@pytest.fixture
def fake_cupy(monkeypatch):
    mod = types.ModuleType("cupy")
    mod.ndarray = _FakeNdarray
    monkeypatch.setitem(sys.modules, "cupy", mod)
    return mod


@pytest.fixture
def reset_cache(monkeypatch):
    monkeypatch.setattr(backend, "_cupy_available", None)


def _gpu_ok() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


requires_gpu = pytest.mark.skipif(not _gpu_ok(), reason="needs CuPy and a CUDA GPU")


# ------------------------------------------------------------------------------------------
# cupy_available


def test_cupy_available_is_bool_and_does_not_raise():
    assert isinstance(backend.cupy_available(), bool)


def test_cupy_available_false_without_cupy(monkeypatch, reset_cache):
    monkeypatch.setitem(sys.modules, "cupy", None)  # makes `import cupy` raise ImportError
    assert backend.cupy_available() is False


def test_cupy_available_false_when_cuda_runtime_fails(monkeypatch, reset_cache, fake_cupy):
    class CUDARuntimeError(RuntimeError):
        pass

    def no_device():
        raise CUDARuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")

    fake_cupy.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDeviceCount=no_device))
    assert backend.cupy_available() is False


def test_cupy_available_false_with_zero_devices(monkeypatch, reset_cache, fake_cupy):
    fake_cupy.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDeviceCount=lambda: 0))
    assert backend.cupy_available() is False


def test_cupy_available_true_with_a_device(monkeypatch, reset_cache, fake_cupy):
    fake_cupy.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDeviceCount=lambda: 1))
    assert backend.cupy_available() is True


def test_cupy_available_false_when_import_crashes(monkeypatch, reset_cache):
    class Boom(types.ModuleType):
        def __getattr__(self, name):
            raise OSError("libcudart.so: cannot open shared object file")

    monkeypatch.setitem(sys.modules, "cupy", Boom("cupy"))
    assert backend.cupy_available() is False


# ------------------------------------------------------------------------------------------
# is_cupy_array / get_xp without CuPy


def test_numpy_only_gives_numpy():
    a = np.zeros((2, 3), np.float32)
    assert backend.get_xp() is np
    assert backend.get_xp(a) is np
    assert backend.get_xp(a, None, a[0]) is np
    assert backend.get_xp(None, None) is np


def test_non_arrays_are_ignored():
    assert backend.get_xp(1, 2.5, "nvfp4", [1, 2], np.float32(3)) is np


def test_is_cupy_array_on_numpy_and_others():
    assert not backend.is_cupy_array(np.zeros(3))
    assert not backend.is_cupy_array(None)
    assert not backend.is_cupy_array([1, 2])


def test_is_cupy_array_does_not_import_cupy(monkeypatch):
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    assert not backend.is_cupy_array(np.zeros(3))
    assert "cupy" not in sys.modules


def test_asnumpy_explicit_numpy_is_identity():
    a = np.arange(4)
    assert backend.asnumpy_explicit(a) is a
    with pytest.raises(TypeError, match="list"):
        backend.asnumpy_explicit([1, 2])


def test_array_device_id_numpy_is_none():
    assert backend.array_device_id(np.zeros(1)) is None


# ------------------------------------------------------------------------------------------
# Mixing rules, with the fake CuPy


def test_fake_cupy_selected(fake_cupy):
    c = _FakeNdarray(0)
    assert backend.is_cupy_array(c)
    assert backend.get_xp(c) is fake_cupy
    assert backend.get_xp(None, c, None, c) is fake_cupy
    assert backend.array_device_id(_FakeNdarray(3)) == 3


def test_mixing_numpy_and_cupy_is_type_error(fake_cupy):
    a = np.zeros(3)
    c = _FakeNdarray(0)
    with pytest.raises(TypeError, match=r"argument 0 is numpy\.ndarray.*argument 2 is cupy"):
        backend.get_xp(a, None, c)
    with pytest.raises(TypeError, match=r"argument 2 is numpy\.ndarray.*argument 0 is cupy"):
        backend.get_xp(c, None, a)


def test_cupy_arrays_on_different_devices_is_value_error(fake_cupy):
    with pytest.raises(ValueError, match=r"argument 0 is on GPU 0, argument 2 is on GPU 1"):
        backend.get_xp(_FakeNdarray(0), _FakeNdarray(0), _FakeNdarray(1))


def test_same_device_ok(fake_cupy):
    assert backend.get_xp(_FakeNdarray(2), _FakeNdarray(2)) is fake_cupy


def test_asnumpy_explicit_cupy(fake_cupy):
    assert isinstance(backend.asnumpy_explicit(_FakeNdarray(0)), np.ndarray)


# ------------------------------------------------------------------------------------------
# Real CuPy


@pytest.mark.gpu
@requires_gpu
def test_real_cupy():
    import cupy

    assert backend.cupy_available() is True
    c = cupy.zeros(3, dtype=cupy.float32)
    assert backend.is_cupy_array(c)
    assert backend.get_xp(c, None) is cupy
    with pytest.raises(TypeError, match="argument 1 is numpy"):
        backend.get_xp(c, np.zeros(3))
    assert isinstance(backend.asnumpy_explicit(c), np.ndarray)
    assert backend.array_device_id(c) == c.device.id


@pytest.mark.gpu
@requires_gpu
def test_real_cupy_two_devices():
    import cupy

    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    with cupy.cuda.Device(0):
        a = cupy.zeros(3)
    with cupy.cuda.Device(1):
        b = cupy.zeros(3)
    with pytest.raises(ValueError, match="different GPUs"):
        backend.get_xp(a, b)
