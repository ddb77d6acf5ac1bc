"""lowprec_moe.interop: conversions share memory (same pointer), keep dtype and values, and on
the GPU run on torch's current stream without making the host wait."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import lowprec_moe as lpm
from lowprec_moe import interop

DTYPES = list(interop.SUPPORTED_DTYPES)


def _np_dtype(name):
    return ml_dtypes.bfloat16 if name == "bfloat16" else np.dtype(name)


def _aligned(shape, name):
    """A NumPy array starting on a 64-byte boundary (JAX shares CPU memory only then)."""
    dt = np.dtype(_np_dtype(name))
    nbytes = int(np.prod(shape)) * dt.itemsize
    buf = np.empty(nbytes + 64, np.uint8)
    off = (-buf.ctypes.data) % 64
    a = buf[off:off + nbytes].view(dt).reshape(shape)
    a[...] = (np.arange(a.size).reshape(shape) % 7 - 3).astype(np.float32).astype(dt)
    return a


def _torch():
    return pytest.importorskip("torch")


def _jax():
    return pytest.importorskip("jax")


def _torch_dtype(torch, name):
    return getattr(torch, name)


# ============================================================================================
# CPU: NumPy <-> torch


@pytest.mark.parametrize("name", DTYPES)
def test_numpy_torch_round_trip_shares_memory(name):
    torch = _torch()
    a = _aligned((3, 5), name)
    t = interop.to_torch(a)
    assert t.dtype == _torch_dtype(torch, name)
    assert t.data_ptr() == a.ctypes.data
    assert tuple(t.shape) == a.shape
    back = interop.to_numpy(t)
    assert back.dtype == a.dtype and back.ctypes.data == a.ctypes.data
    np.testing.assert_array_equal(back.astype(np.float64), a.astype(np.float64))
    # writes through: the same memory, not a copy
    if name != "bool":
        t[0, 0] = 5
        assert float(a[0, 0]) == 5.0


def test_torch_strided_view_keeps_strides():
    torch = _torch()
    t = torch.arange(40, dtype=torch.bfloat16).reshape(5, 8)[:, 2:6]
    a = interop.to_numpy(t)
    assert a.ctypes.data == t.data_ptr()
    assert a.strides == tuple(s * 2 for s in t.stride())
    np.testing.assert_array_equal(a.astype(np.float32), t.float().numpy())


def test_to_xp_detaches_and_library_runs_on_it():
    torch = _torch()
    x = torch.randn(64, 64, dtype=torch.bfloat16, requires_grad=True)
    xa = interop.to_xp(x)
    assert isinstance(xa, np.ndarray) and xa.dtype == ml_dtypes.bfloat16
    assert xa.ctypes.data == x.data_ptr()
    q = lpm.quantize(xa, "nvfp4")
    data = interop.to_torch(q.rowwise_data)
    assert data.dtype == torch.uint8 and data.data_ptr() == q.rowwise_data.ctypes.data


def test_requires_grad_must_be_detached():
    torch = _torch()
    with pytest.raises(TypeError, match="detach"):
        interop.to_numpy(torch.zeros(2, requires_grad=True))


@pytest.mark.parametrize("bad", [[1, 2], 3.0, "x"])
def test_unknown_types_rejected(bad):
    with pytest.raises(TypeError, match="numpy, cupy, torch or jax"):
        interop.to_torch(bad)


def test_unsupported_dtypes_rejected():
    torch = _torch()
    with pytest.raises(TypeError, match="complex64"):
        interop.to_torch(np.zeros(4, np.complex64))
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        interop.to_numpy(torch.zeros(4, dtype=torch.float8_e4m3fn))


def test_array_kind():
    assert interop.array_kind(np.zeros(1)) == "numpy"
    torch = _torch()
    assert interop.array_kind(torch.zeros(1)) == "torch"


# ============================================================================================
# CPU: JAX


@pytest.mark.parametrize("name", DTYPES)
def test_numpy_jax_round_trip_shares_memory(name):
    jax = _jax()
    a = _aligned((4, 16), name)
    if name in ("float64", "int64") and not jax.config.jax_enable_x64:
        with pytest.raises(TypeError, match="jax_enable_x64"):
            interop.to_jax(a)
        return
    j = interop.to_jax(a)
    assert str(j.dtype) == name
    assert j.unsafe_buffer_pointer() == a.ctypes.data
    back = interop.to_numpy(j)
    assert back.dtype == a.dtype and back.ctypes.data == a.ctypes.data
    np.testing.assert_array_equal(np.asarray(j).astype(np.float64), a.astype(np.float64))


@pytest.mark.parametrize("name", ["float32", "float16", "bfloat16", "uint8", "int32"])
def test_torch_jax_round_trip_shares_memory(name):
    torch, jax = _torch(), _jax()
    del jax
    t = torch.ones(8, 32, dtype=_torch_dtype(torch, name))
    j = interop.to_jax(t)
    assert j.unsafe_buffer_pointer() == t.data_ptr() and str(j.dtype) == name
    t2 = interop.to_torch(j)
    assert t2.data_ptr() == t.data_ptr() and t2.dtype == t.dtype


def test_jax_refuses_unaligned_numpy():
    _jax()
    a = _aligned((65,), "float32")[1:]
    with pytest.raises(ValueError, match="64-byte"):
        interop.to_jax(a)


def test_jax_cpu_array_is_not_a_gpu_array():
    jax = _jax()
    with pytest.raises(TypeError, match="CPU jax array"):
        interop.to_cupy(jax.numpy.zeros(4))


# ============================================================================================
# GPU: torch <-> CuPy, streams


def _cuda():
    torch = _torch()
    cupy = pytest.importorskip("cupy")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    try:
        if cupy.cuda.runtime.getDeviceCount() == 0:
            pytest.skip("CuPy sees no GPU")
    except Exception:
        pytest.skip("CuPy cannot reach a GPU")
    return torch, cupy


@pytest.mark.gpu
@pytest.mark.parametrize("name", DTYPES)
def test_torch_cupy_round_trip_shares_memory(name):
    torch, cupy = _cuda()
    t = (torch.arange(60, device="cuda").reshape(6, 10) % 5).to(_torch_dtype(torch, name))
    with interop.torch_stream(t.device):
        c = interop.to_cupy(t)
        assert c.data.ptr == t.data_ptr() and c.dtype == _np_dtype(name)
        assert isinstance(c, cupy.ndarray)
        back = interop.to_torch(c)
    assert back.data_ptr() == t.data_ptr() and back.dtype == t.dtype
    np.testing.assert_array_equal(cupy.asnumpy(c).astype(np.float64),
                                  t.cpu().double().numpy())


@pytest.mark.gpu
def test_gpu_to_numpy_refused():
    torch, _ = _cuda()
    with pytest.raises(TypeError, match="GPU torch array"):
        interop.to_numpy(torch.zeros(4, device="cuda"))
    with pytest.raises(TypeError, match="CPU torch array"):
        interop.to_cupy(torch.zeros(4))


@pytest.mark.gpu
def test_torch_stream_is_cupys_current_stream():
    torch, cupy = _cuda()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        with interop.torch_stream("cuda") as ext:
            assert cupy.cuda.get_current_stream().ptr == side.cuda_stream
            assert ext.ptr == side.cuda_stream
    with interop.torch_stream("cuda"):
        assert cupy.cuda.get_current_stream().ptr == torch.cuda.current_stream().cuda_stream
    with interop.torch_stream("cpu") as none:
        assert none is None


@pytest.mark.gpu
def test_conversions_and_library_calls_do_not_wait_for_the_stream():
    """With a long kernel queued on torch's stream, converting both ways and quantizing return
    while that kernel still runs (no host synchronisation), and the results are ordered after it
    on the same stream."""
    torch, cupy = _cuda()
    side = torch.cuda.Stream()
    x = torch.randn(256, 1024, device="cuda", dtype=torch.bfloat16)
    # once untimed: loading torch's and the library's kernels waits for the device, and the
    # memory pools fill
    with torch.cuda.stream(side):
        y = x * 2
        with interop.torch_stream("cuda"):
            interop.to_torch(lpm.quantize(interop.to_cupy(y), "nvfp4").rowwise_data)
    side.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(2_000_000_000)                 # ~1 s of GPU time on this stream
        y = x * 2                                         # ordered after the sleep
        with interop.torch_stream("cuda"):
            yc = interop.to_cupy(y)
            q = lpm.quantize(yc, "nvfp4")
            data = interop.to_torch(q.rowwise_data)
        busy = not side.query()
    assert busy, "the host waited for the stream (a synchronisation was added)"
    side.synchronize()
    ref = lpm.quantize(interop.to_cupy(x * 2), "nvfp4")
    assert torch.equal(data, interop.to_torch(ref.rowwise_data))
    assert yc.data.ptr == y.data_ptr()
