"""Validation at the public boundary (NUMERICS §9).

Every public entry point calls these helpers once, before any work, so that both backends raise
the same exception type with a message naming the offending argument and value.
"""

from __future__ import annotations

import numbers

import numpy as np

from lowprec_moe import formats as F
from lowprec_moe import quant_formats
from lowprec_moe.backend import get_xp, is_cupy_array

_FLOAT_DTYPE_NAMES = ("float32", "float16", "bfloat16")


_DTYPE_NAMES: dict = {}


def dtype_name(dtype) -> str:
    """Canonical name of a NumPy / CuPy dtype (``bfloat16`` for ml_dtypes' bfloat16).

    Memoized per dtype object (``np.dtype(...).name`` builds the string anew on every call, a
    visible share of a small GEMM's host time)."""
    try:
        return _DTYPE_NAMES[dtype]
    except (KeyError, TypeError):  # TypeError: an unhashable dtype-like argument
        pass
    name = np.dtype(dtype).name
    if isinstance(dtype, np.dtype) and len(_DTYPE_NAMES) < 256:
        _DTYPE_NAMES[dtype] = name
    return name


def check_array(name: str, a, *, min_rank: int = 2) -> None:
    """Require a NumPy or CuPy array of a supported float dtype and rank >= ``min_rank``."""
    if not (isinstance(a, np.ndarray) or is_cupy_array(a)):
        raise TypeError(f"{name} must be a numpy or cupy array, got {type(a).__name__}")
    if dtype_name(a.dtype) not in _FLOAT_DTYPE_NAMES:
        raise TypeError(f"{name}.dtype={dtype_name(a.dtype)} is not supported; "
                        f"use one of {', '.join(_FLOAT_DTYPE_NAMES)}")
    if a.ndim < min_rank:
        raise ValueError(f"{name} must have rank >= {min_rank}, got shape {tuple(a.shape)}")


def as_2d(a):
    """View an array of rank >= 2 as ``[M, K]`` with ``M = prod(shape[:-1])`` (C-contiguous)."""
    xp = get_xp(a)
    a = xp.ascontiguousarray(a)
    return a.reshape(-1, a.shape[-1])


def check_format(fmt) -> str:
    return quant_formats.get(fmt).name


def check_fp8_dtype(fp8_dtype) -> str:
    if fp8_dtype not in F.FP8_DTYPES:
        raise ValueError(f"fp8_dtype={fp8_dtype!r} must be one of {F.FP8_DTYPES}")
    return fp8_dtype


def block_size(fmt: str) -> int:
    return quant_formats.get(fmt).block


def check_k(k: int, fmt: str) -> None:
    b = block_size(fmt)
    if k % b:
        raise ValueError(f"K={k} must be a multiple of {b} for {fmt}")


def check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed={seed!r} must be an int")
    seed = int(seed)
    if not 0 <= seed < 2**64:
        raise ValueError(f"seed={seed} must be in [0, 2**64)")
    return seed


def check_first_member(first_member, num_members: int) -> int:
    """The stochastic-rounding member index of a grouped tensor's first member: an int such that
    every member's index fits 32 bits."""
    if isinstance(first_member, bool) or not isinstance(first_member, numbers.Integral):
        raise TypeError(f"first_member={first_member!r} must be an int")
    first_member = int(first_member)
    if not 0 <= first_member or first_member + num_members > 2**32:
        raise ValueError(f"first_member={first_member} must be >= 0 with first_member + "
                         f"{num_members} members <= 2**32")
    return first_member


def check_options(fmt: str, *, rowwise, columnwise, row_scaled, block_2d, rht,
                  stochastic_rounding, fp8_dtype, dtype) -> None:
    """Check a combination of quantization options (raises ValueError naming the conflict)."""
    if not rowwise and not columnwise:
        raise ValueError("rowwise=False and columnwise=False: nothing to quantize")
    quant_formats.get(fmt).check_options(
        row_scaled=row_scaled, rht=rht, stochastic_rounding=stochastic_rounding,
        block_2d=block_2d, fp8_dtype=fp8_dtype, dtype_name=dtype_name(dtype))


def check_splits(splits, m_total: int) -> tuple[int, ...]:
    """Validate expert split sizes: host ints, non-negative, summing to ``m_total``."""
    if type(splits) in (tuple, list) and all(type(v) is int for v in splits):
        # the common case (plain Python ints: no array conversion); the same checks and
        # messages as below
        if not splits:
            raise ValueError("splits=[] must name at least one group")
        if min(splits) < 0:
            raise ValueError(f"splits={list(splits)} must be non-negative")
        total = sum(splits)
        if total != m_total:
            raise ValueError(f"splits={list(splits)} sum to {total}, expected M={m_total}")
        return tuple(splits)
    if is_cupy_array(splits):
        raise TypeError("splits must be host integers (list, tuple or numpy array), got a cupy "
                        "array; reading it would need a device-to-host copy")
    try:
        arr = np.asarray(splits)
    except Exception:  # pragma: no cover - exotic inputs
        raise TypeError(f"splits={splits!r} must be a sequence of ints") from None
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise TypeError(f"splits={splits!r} must be a 1-D sequence of ints")
    if arr.size == 0:
        raise ValueError("splits=[] must name at least one group")
    values = arr.tolist()  # Python ints: sums cannot wrap around as int64 / uint64 sums do
    if min(values) < 0:
        raise ValueError(f"splits={values} must be non-negative")
    total = sum(values)
    if total != m_total:
        raise ValueError(f"splits={values} sum to {total}, expected M={m_total}")
    return tuple(values)


def check_device_splits(splits, like, what: str = "x", *, copy: bool = False):
    """Device splits of a GPU call: a 1-D integer CuPy array of at least one expert on the
    device of ``like`` (the array named ``what``). Returns it as a contiguous int64 array, a
    fresh one with ``copy`` (for what keeps the splits: the caller may refill its buffer, as
    the router does at every step). Its values are not read (that would need a
    device-to-host copy; NUMERICS §7.5)."""
    if not is_cupy_array(like):
        raise TypeError(f"splits is a cupy array but {what} is a numpy array; pass host splits "
                        "(list, tuple or numpy array)")
    if splits.ndim != 1 or splits.size == 0:
        raise ValueError(f"splits must be a 1-D array of at least one expert, got shape "
                         f"{tuple(splits.shape)}")
    if splits.dtype.kind not in "iu":
        raise TypeError(f"splits.dtype={splits.dtype} must be an integer dtype")
    if splits.device.id != like.device.id:
        raise ValueError(f"splits is on device {splits.device.id} but {what} is on device "
                         f"{like.device.id}")
    if splits.dtype == np.int64 and splits.flags.c_contiguous and not copy:
        return splits
    import cupy as cp

    with splits.device:
        return cp.array(splits, dtype=cp.int64, order="C", copy=True)


def check_finite(name: str, a) -> None:
    xp = get_xp(a)
    if not bool(xp.isfinite(a.astype(xp.float32)).all()):
        raise ValueError(f"{name} contains NaN or inf values (check_finite=True)")


def check_dequant_dtype(dtype) -> str:
    name = dtype if isinstance(dtype, str) else dtype_name(dtype)
    if name not in F.DEQUANT_DTYPES:
        raise ValueError(f"dtype={dtype!r} must be one of {F.DEQUANT_DTYPES}")
    return name


def check_direction(direction) -> str:
    if direction not in ("rowwise", "columnwise"):
        raise ValueError(f"direction={direction!r} must be 'rowwise' or 'columnwise'")
    return direction
