"""Array-module selection: NumPy (CPU reference) or CuPy (GPU).

Every public function of the library takes NumPy or CuPy arrays and returns arrays of the same
kind. :func:`get_xp` picks the module from the arguments and refuses mixtures: a NumPy and a
CuPy array in one call is a :class:`TypeError`, CuPy arrays on two different GPUs a
:class:`ValueError`. Nothing here copies data between host and device; a CuPy input never
round-trips through the host silently.

CuPy is imported lazily, so this module (and the whole CPU path) works on machines without CuPy
or without a GPU.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

import numpy as np

__all__ = [
    "cupy_available",
    "is_cupy_array",
    "get_xp",
    "array_device_id",
    "asnumpy_explicit",
]

_cupy_available: bool | None = None


def _import_cupy() -> ModuleType | None:
    """Import CuPy, or return None where it is not installed or cannot be loaded."""
    try:
        import cupy  # noqa: PLC0415
    except Exception:  # ImportError, or a broken CUDA install raising at import time
        return None
    return cupy


def cupy_available() -> bool:
    """Whether CuPy is importable and at least one CUDA GPU can be used.

    Never raises: a missing CuPy (``ImportError``), a missing driver or no visible device
    (CUDA runtime errors) all give ``False``. The answer is cached for the process.

    Returns
    -------
    bool
        ``True`` when CuPy imports and reports one or more CUDA devices.
    """
    global _cupy_available
    if _cupy_available is None:
        cupy = _import_cupy()
        ok = False
        if cupy is not None:
            try:
                ok = int(cupy.cuda.runtime.getDeviceCount()) > 0
            except Exception:  # cupy.cuda.runtime.CUDARuntimeError, driver errors, ...
                ok = False
        _cupy_available = ok
    return _cupy_available


def _cupy_if_loaded() -> ModuleType | None:
    # An object can only be a CuPy array if CuPy has already been imported by someone; looking
    # in sys.modules keeps is_cupy_array cheap and free of import side effects.
    return sys.modules.get("cupy")


def is_cupy_array(a: Any) -> bool:
    """Whether ``a`` is a ``cupy.ndarray``.

    Does not import CuPy: if CuPy was never imported, no CuPy array can exist.

    Parameters
    ----------
    a : object
        Any object.

    Returns
    -------
    bool
    """
    cupy = _cupy_if_loaded()
    return cupy is not None and isinstance(a, cupy.ndarray)


def array_device_id(a: Any) -> int | None:
    """The CUDA device id of a CuPy array, or ``None`` for anything else."""
    if is_cupy_array(a):
        return int(a.device.id)
    return None


def _describe(a: Any) -> str:
    if is_cupy_array(a):
        return f"cupy.ndarray on GPU {a.device.id}"
    if isinstance(a, np.ndarray):
        return "numpy.ndarray"
    return type(a).__name__


def get_xp(*arrays: Any) -> ModuleType:
    """The array module (``numpy`` or ``cupy``) for a set of arguments.

    ``None`` entries and non-array objects (Python scalars, strings) are ignored. With no CuPy
    array among the arguments the answer is ``numpy``.

    Parameters
    ----------
    *arrays : array or None
        The arguments of one call, in the order they were passed.

    Returns
    -------
    module
        ``numpy`` or ``cupy``.

    Raises
    ------
    TypeError
        If NumPy and CuPy arrays are mixed; the message names the argument positions and types.
    ValueError
        If CuPy arrays live on different GPUs; the message names positions and device ids.
    """
    numpy_pos: list[int] = []
    cupy_pos: list[int] = []
    for i, a in enumerate(arrays):
        if a is None:
            continue
        if is_cupy_array(a):
            cupy_pos.append(i)
        elif isinstance(a, np.ndarray):
            numpy_pos.append(i)
    if not cupy_pos:
        return np
    if numpy_pos:
        raise TypeError(
            "cannot mix NumPy and CuPy arrays in one call: "
            f"argument {numpy_pos[0]} is {_describe(arrays[numpy_pos[0]])}, "
            f"argument {cupy_pos[0]} is {_describe(arrays[cupy_pos[0]])} "
            "(move the data explicitly with cupy.asarray / cupy.asnumpy)"
        )
    first = cupy_pos[0]
    dev0 = int(arrays[first].device.id)
    for i in cupy_pos[1:]:
        dev = int(arrays[i].device.id)
        if dev != dev0:
            raise ValueError(
                "CuPy arrays on different GPUs: "
                f"argument {first} is on GPU {dev0}, argument {i} is on GPU {dev}"
            )
    return _cupy_if_loaded()


def asnumpy_explicit(a: Any) -> np.ndarray:
    """Copy an array to the host on purpose (for tests and the CLI, never on a hot path).

    Parameters
    ----------
    a : numpy.ndarray or cupy.ndarray
        The array.

    Returns
    -------
    numpy.ndarray
        ``a`` itself for a NumPy array, a host copy for a CuPy array.

    Raises
    ------
    TypeError
        If ``a`` is neither a NumPy nor a CuPy array.
    """
    if is_cupy_array(a):
        return a.get()
    if isinstance(a, np.ndarray):
        return a
    raise TypeError(f"expected a numpy or cupy array, got {type(a).__name__}")
