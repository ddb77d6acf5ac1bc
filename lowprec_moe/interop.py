"""Zero-copy conversion between PyTorch, JAX, NumPy and CuPy arrays.

Every conversion shares memory with its input (DLPack, or a dtype view of it); none copies, and
an array that cannot be shared raises instead of being copied. Supported dtypes: float64,
float32, float16, bfloat16 and the integer payload dtypes (bool, uint8, int8, int16, int32,
int64). bfloat16 crosses as a 16-bit integer view wherever one side has no DLPack bfloat16
(NumPy / CuPy hold it as ``ml_dtypes.bfloat16``, which neither exports nor imports through
DLPack).

Streams: DLPack consumers pass their current stream to the producer, which makes that stream
wait for its own when the two differ. Inside :func:`torch_stream`, CuPy's current stream *is*
PyTorch's current CUDA stream, so conversions in either direction add no wait at all, and every
CuPy kernel the library launches is ordered with the surrounding PyTorch work without a
synchronisation::

    import torch
    from lowprec_moe import interop

    x = torch.randn(256, 1024, device="cuda", dtype=torch.bfloat16)
    with interop.torch_stream(x.device):
        xc = interop.to_cupy(x)                # same memory, ml_dtypes.bfloat16 cupy array
        q = lpm.quantize(xc, "nvfp4")          # runs on torch's current stream
        data = interop.to_torch(q.rowwise_data)  # uint8 torch tensor, same memory

PyTorch, JAX and CuPy are imported only when an array of theirs is passed or asked for.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
from typing import Any

import numpy as np

from lowprec_moe.backend import is_cupy_array

__all__ = [
    "SUPPORTED_DTYPES",
    "array_kind",
    "to_cupy",
    "to_jax",
    "to_numpy",
    "to_torch",
    "to_xp",
    "torch_stream",
]

#: dtype names that cross without a copy, in every direction.
SUPPORTED_DTYPES = ("float64", "float32", "float16", "bfloat16",
                    "bool", "uint8", "int8", "int16", "int32", "int64")

# DLPack type codes (dlpack.h: DLDataTypeCode)
_DL_INT, _DL_BFLOAT = 0, 4
# DLPack device types (dlpack.h: DLDeviceType)
_DL_CPU, _DL_CUDA = 1, 2


# ============================================================================================
# classification


def _torch_if_loaded():
    return sys.modules.get("torch")


def _jax_if_loaded():
    return sys.modules.get("jax")


def _is_torch(a: Any) -> bool:
    torch = _torch_if_loaded()
    return torch is not None and isinstance(a, torch.Tensor)


def _is_jax(a: Any) -> bool:
    jax = _jax_if_loaded()
    return jax is not None and isinstance(a, jax.Array)


def array_kind(a: Any) -> str:
    """Which library an array belongs to.

    Parameters
    ----------
    a : object

    Returns
    -------
    {"numpy", "cupy", "torch", "jax"}

    Raises
    ------
    TypeError
        For anything else (lists, scalars, other array libraries).
    """
    if isinstance(a, np.ndarray):
        return "numpy"
    if is_cupy_array(a):
        return "cupy"
    if _is_torch(a):
        return "torch"
    if _is_jax(a):
        return "jax"
    raise TypeError(f"expected a numpy, cupy, torch or jax array, got {type(a).__name__}")


def _dtype_name(a: Any, kind: str) -> str:
    if kind == "torch":
        name = str(a.dtype).removeprefix("torch.")
    else:
        name = np.dtype(a.dtype).name
    if name not in SUPPORTED_DTYPES:
        raise TypeError(f"dtype {name} of a {kind} array has no zero-copy conversion here; "
                        f"supported: {', '.join(SUPPORTED_DTYPES)}")
    return name


def _bf16():
    import ml_dtypes  # noqa: PLC0415

    return ml_dtypes.bfloat16


def _is_cuda(a: Any, kind: str) -> bool:
    if kind == "cupy":
        return True
    if kind == "numpy":
        return False
    if kind == "torch":
        if a.device.type not in ("cpu", "cuda"):
            raise TypeError(f"torch tensors on {a.device.type} are not supported (cpu or cuda)")
        return a.device.type == "cuda"
    dev_type, _ = a.__dlpack_device__()
    if dev_type not in (_DL_CPU, _DL_CUDA):
        raise TypeError(f"jax arrays on DLPack device type {dev_type} are not supported "
                        "(cpu or cuda)")
    return dev_type == _DL_CUDA


# ============================================================================================
# DLPack capsules with a different element type


_capsule_get_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_get_name.restype = ctypes.c_char_p
_capsule_get_name.argtypes = [ctypes.py_object]
_capsule_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_get_pointer.restype = ctypes.c_void_p
_capsule_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]

# Offset of DLTensor inside DLManagedTensor (legacy: first member) and DLManagedTensorVersioned
# (after DLPackVersion, manager_ctx, deleter, flags); of DLDataType inside DLTensor (after
# data, device, ndim).
_DLTENSOR_OFFSET = {b"dltensor": 0, b"dltensor_versioned": 32}
_DTYPE_OFFSET = 20


class _Retyped:
    """An array seen through DLPack with a 16-bit element type code swapped.

    JAX exports and imports bfloat16, NumPy and CuPy do not; both sides agree on int16. The
    producer's capsule is unconsumed when it reaches us, so its element-type field can be
    rewritten before the consumer reads it; data, shape, strides and the deleter are the
    producer's own, so the memory is shared and released exactly as without the rewrite.
    """

    def __init__(self, obj: Any, from_code: int, to_code: int):
        self._obj, self._from, self._to = obj, from_code, to_code

    def __dlpack_device__(self):
        return self._obj.__dlpack_device__()

    def __dlpack__(self, *, stream=None, **_ignored):
        # A legacy (unversioned) capsule is always acceptable to consumers that ask for a
        # versioned one, and every producer here can make it.
        capsule = self._obj.__dlpack__(stream=stream)
        name = _capsule_get_name(capsule)
        if name not in _DLTENSOR_OFFSET:
            raise TypeError(f"unexpected DLPack capsule {name!r}")
        base = _capsule_get_pointer(capsule, name) + _DLTENSOR_OFFSET[name] + _DTYPE_OFFSET
        code = ctypes.c_uint8.from_address(base)
        bits = ctypes.c_uint8.from_address(base + 1)
        if code.value != self._from or bits.value != 16:
            raise TypeError(f"DLPack element type (code {code.value}, {bits.value} bits) is not "
                            f"the expected 16-bit code {self._from}")
        code.value = self._to
        return capsule


# ============================================================================================
# conversions


def to_numpy(a: Any) -> np.ndarray:
    """A NumPy array sharing memory with a CPU array.

    Parameters
    ----------
    a : numpy.ndarray, CPU torch.Tensor or CPU jax.Array
        Any shape; a dtype of :data:`SUPPORTED_DTYPES` (bfloat16 gives ``ml_dtypes.bfloat16``).
        A torch tensor that requires grad must be detached first (as for ``Tensor.numpy``).

    Returns
    -------
    numpy.ndarray
        Same shape, dtype, strides and memory.

    Raises
    ------
    TypeError
        For GPU arrays (use :func:`to_cupy`), unsupported dtypes or unknown array types.
    """
    kind = array_kind(a)
    if kind == "numpy":
        return a
    name = _dtype_name(a, kind)
    if _is_cuda(a, kind):
        raise TypeError(f"a is a GPU {kind} array; to_numpy would copy it to the host "
                        "(use to_cupy for the GPU)")
    if kind == "torch":
        if a.requires_grad:
            raise TypeError("a requires grad; call .detach() first (as Tensor.numpy asks)")
        if name == "bfloat16":
            return a.view(_torch().int16).numpy().view(_bf16())
        return a.numpy()
    if name == "bfloat16":
        return np.from_dlpack(_Retyped(a, _DL_BFLOAT, _DL_INT)).view(_bf16())
    return np.from_dlpack(a)


def to_cupy(a: Any):
    """A CuPy array sharing memory with a GPU array.

    Parameters
    ----------
    a : cupy.ndarray, CUDA torch.Tensor or GPU jax.Array
        Any shape; a dtype of :data:`SUPPORTED_DTYPES` (bfloat16 gives ``ml_dtypes.bfloat16``).

    Returns
    -------
    cupy.ndarray
        Same shape, dtype, strides and memory. CuPy's current stream waits for the producer's
        stream only if the two differ (never inside :func:`torch_stream` for torch tensors).

    Raises
    ------
    TypeError
        For CPU arrays (use :func:`to_numpy`), unsupported dtypes or unknown array types.
    """
    kind = array_kind(a)
    if kind == "cupy":
        return a
    name = _dtype_name(a, kind)
    if not _is_cuda(a, kind):
        raise TypeError(f"a is a CPU {kind} array; to_cupy would copy it to the GPU "
                        "(use to_numpy for the CPU)")
    import cupy  # noqa: PLC0415

    if kind == "torch":
        if name == "bfloat16":
            return cupy.from_dlpack(a.detach().view(_torch().int16)).view(_bf16())
        return cupy.from_dlpack(a.detach())
    if name == "bfloat16":
        return cupy.from_dlpack(_Retyped(a, _DL_BFLOAT, _DL_INT)).view(_bf16())
    return cupy.from_dlpack(a)


def to_xp(a: Any):
    """The library's array kind for ``a``: NumPy for CPU data, CuPy for GPU data (no copy).

    Parameters
    ----------
    a : numpy, cupy, torch or jax array

    Returns
    -------
    numpy.ndarray or cupy.ndarray
        Sharing memory with ``a``. Torch tensors are taken detached (the autograd graph is the
        caller's business).
    """
    kind = array_kind(a)
    if kind in ("numpy", "cupy"):
        return a
    if kind == "torch":
        a = a.detach()
    return to_cupy(a) if _is_cuda(a, kind) else to_numpy(a)


def _torch():
    import torch  # noqa: PLC0415

    return torch


def to_torch(a: Any):
    """A torch.Tensor sharing memory with a NumPy, CuPy or JAX array.

    Parameters
    ----------
    a : numpy.ndarray, cupy.ndarray, jax.Array or torch.Tensor
        Any shape; a dtype of :data:`SUPPORTED_DTYPES` (``ml_dtypes.bfloat16`` becomes
        ``torch.bfloat16``).

    Returns
    -------
    torch.Tensor
        On the CPU for NumPy / CPU JAX data, on the array's CUDA device otherwise; same shape,
        strides and memory. Torch's current stream waits for the producer's current stream only
        if the two differ (never inside :func:`torch_stream` for CuPy arrays).
    """
    kind = array_kind(a)
    if kind == "torch":
        return a
    torch = _torch()
    name = _dtype_name(a, kind)
    if kind == "jax":
        return torch.from_dlpack(a)
    if name == "bfloat16":
        return torch.from_dlpack(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_dlpack(a)


def to_jax(a: Any):
    """A jax.Array sharing memory with a NumPy, CuPy or torch array.

    Parameters
    ----------
    a : numpy.ndarray, cupy.ndarray, torch.Tensor or jax.Array
        Any shape; a dtype of :data:`SUPPORTED_DTYPES` (float64 / int64 only with
        ``jax_enable_x64``). JAX shares only compact row-major layouts and, on the CPU, data
        aligned to 64 bytes (torch's CPU allocations are; NumPy's need not be).

    Returns
    -------
    jax.Array
        On the CPU or GPU device that holds the data. JAX treats it as immutable: writing to
        the source afterwards changes the JAX array as well.

    Raises
    ------
    TypeError
        64-bit dtypes without ``jax_enable_x64`` (JAX would narrow them in a copy).
    ValueError
        CPU data not aligned to 64 bytes; JAX's own error for layouts it cannot share.
    """
    kind = array_kind(a)
    if kind == "jax":
        return a
    import jax  # noqa: PLC0415
    import jax.dlpack  # noqa: PLC0415

    name = _dtype_name(a, kind)
    if name in ("float64", "int64") and not jax.config.jax_enable_x64:
        raise TypeError(f"{name} needs jax_enable_x64; without it JAX would copy the data to a "
                        f"32-bit type")
    if kind == "numpy" and a.ctypes.data % 64:
        raise ValueError("JAX shares CPU memory only when it is 64-byte aligned and this NumPy "
                         f"array starts at {a.ctypes.data % 64} bytes past a 64-byte boundary "
                         "(torch CPU tensors always are aligned)")
    # copy=False: JAX would otherwise copy silently where it cannot share
    if kind == "torch":
        return jax.dlpack.from_dlpack(a.detach(), copy=False)
    if name == "bfloat16":
        return jax.dlpack.from_dlpack(_Retyped(a.view(np.int16), _DL_INT, _DL_BFLOAT),
                                      copy=False)
    return jax.dlpack.from_dlpack(a, copy=False)


# ============================================================================================
# streams


@contextlib.contextmanager
def torch_stream(device=None):
    """Make PyTorch's current CUDA stream CuPy's current stream for the block.

    Parameters
    ----------
    device : torch.device, str or int, optional
        The CUDA device (default: torch's current one). A CPU device makes this a no-op, so
        callers can wrap CPU and GPU work alike.

    Yields
    ------
    cupy.cuda.ExternalStream or None
        The stream CuPy launches on (None for a CPU device).

    Notes
    -----
    CuPy's current device is set to the same device for the block. The wrapper does not own the
    stream; nothing is synchronised on entry or exit.
    """
    torch = _torch()
    dev = torch.device("cuda" if device is None else device) if not isinstance(
        device, int) else torch.device("cuda", device)
    if dev.type == "cpu":
        yield None
        return
    if dev.type != "cuda":
        raise TypeError(f"device {dev} is neither cpu nor cuda")
    import cupy  # noqa: PLC0415

    index = torch.cuda.current_device() if dev.index is None else dev.index
    stream = torch.cuda.current_stream(index)
    with cupy.cuda.Device(index):
        # CuPy 14 wraps foreign streams through the __cuda_stream__ protocol (ExternalStream is
        # deprecated there); older CuPy only has ExternalStream. Both wrap the same handle.
        from_external = getattr(cupy.cuda.Stream, "from_external", None)
        ext = (from_external(stream) if from_external is not None
               else cupy.cuda.ExternalStream(stream.cuda_stream, index))
        with ext:
            yield ext
