"""A small, strict reader and writer of the safetensors file format (no ``safetensors`` package).

File layout
-----------
``[8 bytes: N, little-endian uint64][N bytes: JSON header][data]``. The header maps each tensor
name to ``{"dtype": ..., "shape": [...], "data_offsets": [begin, end]}`` (byte offsets into the
data section, which tensors must tile exactly, in order, without holes) and may hold
``"__metadata__"``, a string-to-string map. Tensor bytes are little-endian and row-major.

Reading validates the whole header (JSON syntax, duplicate names, dtypes, shapes, byte ranges and
the file size) before any tensor is touched, then memory-maps the file: :meth:`SafetensorsFile.get`
returns read-only NumPy views, so a large checkpoint is never loaded whole.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import struct
from typing import IO, Any

import ml_dtypes
import numpy as np

from lowprec_moe.io._common import CheckpointError, describe, empty_readonly

__all__ = ["DTYPES", "dtype_label", "SafetensorsFile", "header_bytes", "write_array_bytes",
           "write_safetensors"]

#: safetensors dtype label -> NumPy dtype (little-endian).
DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "U8": np.dtype("<u1"),
    "I8": np.dtype("<i1"),
    "I16": np.dtype("<i2"),
    "U16": np.dtype("<u2"),
    "I32": np.dtype("<i4"),
    "U32": np.dtype("<u4"),
    "I64": np.dtype("<i8"),
    "U64": np.dtype("<u8"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
}
_LABELS = {dt: label for label, dt in DTYPES.items()}

#: Refuse headers larger than this (the reference implementation uses the same bound).
MAX_HEADER_BYTES = 100_000_000
#: NumPy's limit on the number of dimensions.
_MAX_DIMS = 32


def dtype_label(dtype) -> str:
    """The safetensors label of a NumPy dtype (``"BF16"`` for ``ml_dtypes.bfloat16``).

    Raises
    ------
    TypeError
        For a dtype the format cannot store (object, strings, complex, structured ...).
    """
    dt = np.dtype(dtype)
    if dt.byteorder == ">":
        dt = dt.newbyteorder("<")
    label = _LABELS.get(dt)
    if label is None:
        raise TypeError(f"dtype={dt} cannot be stored in safetensors; supported: "
                        f"{', '.join(str(d) for d in _LABELS)}")
    return label


def _no_duplicates(pairs):
    out = {}
    for key, value in pairs:
        if key in out:
            raise CheckpointError(f"duplicate key {key!r} in the header")
        out[key] = value
    return out


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _parse_header(raw: bytes, data_size: int) -> tuple[dict[str, tuple], dict[str, str]]:
    """Validate a header; return ``{name: (label, shape, begin, end)}`` and the metadata."""
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except UnicodeDecodeError:
        raise CheckpointError("header is not valid UTF-8") from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"header is not valid JSON ({exc.msg} at byte {exc.pos})") from None
    except RecursionError:
        raise CheckpointError("header is nested too deeply to be a safetensors header") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"header must be a JSON object, got {type(header).__name__}")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise CheckpointError("__metadata__ must map strings to strings")
    entries: dict[str, tuple] = {}
    for name, info in header.items():
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise CheckpointError(f"tensor {name!r}: entry must have exactly the keys dtype, "
                                  f"shape and data_offsets, got {info!r}")
        label, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if label not in DTYPES:
            raise CheckpointError(f"tensor {name!r}: dtype {label!r} is not supported; "
                                  f"supported: {', '.join(DTYPES)}")
        if (not isinstance(shape, list) or len(shape) > _MAX_DIMS
                or not all(_is_int(s) and 0 <= s < 2**62 for s in shape)):
            raise CheckpointError(f"tensor {name!r}: shape {str(shape)[:100]} must be a list of "
                                  f"at most {_MAX_DIMS} non-negative ints below 2**62")
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(_is_int(o) for o in offsets) or not 0 <= offsets[0] <= offsets[1]):
            raise CheckpointError(f"tensor {name!r}: data_offsets {offsets!r} must be "
                                  "[begin, end] with 0 <= begin <= end")
        nbytes = math.prod(shape) * DTYPES[label].itemsize
        if offsets[1] - offsets[0] != nbytes:
            raise CheckpointError(f"tensor {name!r}: data_offsets {offsets} hold "
                                  f"{offsets[1] - offsets[0]} bytes, but {label} {shape} "
                                  f"needs {nbytes}")
        entries[name] = (label, tuple(shape), offsets[0], offsets[1])
    end = 0
    for name, (_, _, begin, stop) in sorted(entries.items(), key=lambda kv: kv[1][2:]):
        if begin != end:
            raise CheckpointError(f"tensor {name!r}: data starts at byte {begin}, expected {end} "
                                  "(tensors overlap or leave a hole)")
        end = stop
    if end != data_size:
        what = "truncated" if end > data_size else "inconsistent"
        raise CheckpointError(f"{what} file: the header describes {end} data bytes, the file "
                              f"holds {data_size}")
    return entries, metadata


class SafetensorsFile:
    """A validated, memory-mapped safetensors file.

    Parameters
    ----------
    path : str or os.PathLike
        The file; its header is read and checked at once (:class:`CheckpointError` on any
        inconsistency, ``OSError`` if it cannot be read).

    Attributes
    ----------
    metadata : dict of str to str
        The ``__metadata__`` map (empty when absent).
    """

    def __init__(self, path):
        self.path = os.fspath(path)
        with open(self.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 8:
                raise CheckpointError(f"truncated file: {size} bytes, a safetensors file starts "
                                      "with an 8-byte header length")
            (n,) = struct.unpack("<Q", f.read(8))
            if n > min(size - 8, MAX_HEADER_BYTES):
                raise CheckpointError(f"header length {n} exceeds the file size ({size} bytes)"
                                      if n > size - 8 else f"header length {n} is too large")
            raw = f.read(n)
            self._entries, self.metadata = _parse_header(raw, size - 8 - n)
            self._start = 8 + n
            self._map = (mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                         if size > self._start else None)

    def keys(self) -> list[str]:
        """Tensor names, in header order."""
        return list(self._entries)

    def __contains__(self, name) -> bool:
        return name in self._entries

    def label(self, name: str) -> str:
        """The safetensors dtype label of ``name``."""
        return self._entries[name][0]

    def info(self, name: str) -> tuple[np.dtype, tuple]:
        """``(dtype, shape)`` of ``name`` without reading its data."""
        label, shape, _, _ = self._entries[name]
        return DTYPES[label], shape

    def get(self, name: str) -> np.ndarray:
        """A read-only NumPy view of tensor ``name`` (memory-mapped; nothing is copied)."""
        label, shape, begin, end = self._entries[name]
        dtype = DTYPES[label]
        if end == begin:
            return empty_readonly(shape, dtype)
        arr = np.frombuffer(self._map, dtype=dtype, count=(end - begin) // dtype.itemsize,
                            offset=self._start + begin)
        return arr.reshape(shape)

    def close(self) -> None:
        """Forget the mapping (it closes once no returned view refers to it)."""
        self._map = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def write_array_bytes(f: IO[bytes], a: np.ndarray, chunk: int = 1 << 26) -> None:
    """Write ``a``'s bytes, row-major little-endian, without copying all of it at once."""
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    if a.flags.c_contiguous:
        mv = memoryview(a.reshape(-1).view(np.uint8))
        for i in range(0, len(mv), chunk):
            f.write(mv[i:i + chunk])
        return
    flat_rows = a.reshape(a.shape[0], -1) if a.ndim > 1 else a.reshape(1, -1)
    step = max(1, chunk // max(1, flat_rows[0].nbytes))
    for i in range(0, flat_rows.shape[0], step):
        f.write(np.ascontiguousarray(flat_rows[i:i + step]).tobytes())


def header_bytes(tensors: list[tuple[str, str, tuple]], metadata: dict[str, str] | None) -> bytes:
    """The 8-byte length plus JSON header for ``(name, label, shape)`` entries stored in order.

    The JSON is padded with spaces so that the data section starts 8-byte aligned.
    """
    header: dict[str, Any] = {}
    if metadata:
        for k, v in metadata.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise TypeError(f"metadata must map str to str, got {k!r}: {type(v).__name__}")
        header["__metadata__"] = dict(metadata)
    offset = 0
    for name, label, shape in tensors:
        if not isinstance(name, str) or name == "__metadata__":
            raise ValueError(f"tensor name {name!r} is not allowed")
        if name in header:
            raise ValueError(f"tensor name {name!r} appears twice")
        nbytes = math.prod(shape) * DTYPES[label].itemsize
        header[name] = {"dtype": label, "shape": [int(s) for s in shape],
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-(8 + len(raw)) % 8)
    return struct.pack("<Q", len(raw)) + raw


def write_safetensors(f: IO[bytes], arrays: list[tuple[str, np.ndarray]],
                      metadata: dict[str, str] | None = None) -> None:
    """Write named host arrays, in order, as one safetensors stream to the open file ``f``."""
    entries = []
    for name, a in arrays:
        if not isinstance(a, np.ndarray):
            raise TypeError(f"tensor {name!r} must be a numpy array, got {describe(a)}")
        entries.append((name, dtype_label(a.dtype), a.shape))
    f.write(header_bytes(entries, metadata))
    for _, a in arrays:
        write_array_bytes(f, a)
