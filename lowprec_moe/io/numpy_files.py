"""Strict readers of NumPy's ``.npy`` and ``.npz`` files that never unpickle.

Headers are parsed with NumPy's own header functions (``ast.literal_eval``, no code runs) and
checked before any data is read: object dtypes (whose payload is a pickle) and structured dtypes
are refused, and the byte count the header promises must match the file exactly.

Data is memory-mapped: a ``.npy`` file directly, an ``.npz`` member when it is stored
uncompressed (``numpy.savez``); compressed members (``numpy.savez_compressed``) are decompressed
one at a time, with their CRC checked.

A 2-byte void dtype (``|V2``, which is how ``numpy.save`` writes ``ml_dtypes.bfloat16``) is read
as bfloat16.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import struct
import zipfile
import zlib
from typing import IO

import ml_dtypes
import numpy as np

from lowprec_moe.io._common import CheckpointError, empty_readonly

__all__ = ["NpyFile", "NpzFile", "read_npy_header"]

_MAX_HEADER = 1 << 20
#: deflate's largest expansion (258-byte matches from 2-bit codes): about 1032 to 1.
_DEFLATE_MAX_RATIO = 1032
METADATA_KEY = "__metadata__"


def read_npy_header(fp: IO[bytes]) -> tuple[np.dtype, tuple, bool, int]:
    """Parse a ``.npy`` header from ``fp`` (positioned at the magic string).

    Returns
    -------
    dtype, shape, fortran_order, data_offset
        ``data_offset`` is where the array bytes start, relative to the magic string.

    Raises
    ------
    CheckpointError
        Not a ``.npy`` stream, an unreadable header, or a refused dtype.
    """
    fmt = np.lib.format
    start = fp.tell()
    try:
        version = fmt.read_magic(fp)
        if version == (1, 0):
            shape, fortran, dtype = fmt.read_array_header_1_0(fp, max_header_size=_MAX_HEADER)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = fmt.read_array_header_2_0(fp, max_header_size=_MAX_HEADER)
        else:
            raise CheckpointError(f"unsupported .npy format version {version}")
    except CheckpointError:
        raise
    except Exception as exc:  # literal_eval of a damaged header raises many kinds of errors
        raise CheckpointError(f"not a valid .npy header ({type(exc).__name__}: "
                              f"{' '.join(str(exc).split())[:200]})") from None
    if dtype.hasobject:
        raise CheckpointError(f"dtype={dtype} holds Python objects, which would have to be "
                              "unpickled; refusing to load it (allow_pickle=False)")
    if dtype.fields is not None or dtype.subdtype is not None:
        raise CheckpointError(f"structured dtype {dtype} is not supported")
    if dtype.kind == "V" and dtype.itemsize == 2:
        dtype = np.dtype(ml_dtypes.bfloat16)
    if any(s < 0 for s in shape):
        raise CheckpointError(f"negative dimension in shape {shape}")
    return dtype, tuple(int(s) for s in shape), bool(fortran), fp.tell() - start


def _nbytes(dtype: np.dtype, shape: tuple) -> int:
    return math.prod(shape) * dtype.itemsize


def _crc32(view: memoryview, chunk: int = 1 << 26) -> int:
    crc = 0
    for i in range(0, len(view), chunk):
        crc = zlib.crc32(view[i:i + chunk], crc)
    return crc


def _view(buf, dtype, shape, fortran, offset) -> np.ndarray:
    n = math.prod(shape)
    if n == 0:
        return empty_readonly(shape, dtype)
    arr = np.frombuffer(buf, dtype=dtype, count=n, offset=offset)
    return arr.reshape(shape, order="F" if fortran else "C")


class NpyFile:
    """A validated, memory-mapped ``.npy`` file holding one array, named ``name``."""

    def __init__(self, path, name: str | None = None):
        self.path = os.fspath(path)
        self.name = name if name is not None else os.path.splitext(os.path.basename(self.path))[0]
        self.metadata: dict[str, str] = {}
        with open(self.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            self._dtype, self._shape, self._fortran, self._offset = read_npy_header(f)
            need = self._offset + _nbytes(self._dtype, self._shape)
            if size != need:
                what = "truncated" if size < need else "inconsistent"
                raise CheckpointError(f"{what} file: the header promises {need - self._offset} "
                                      f"data bytes, the file holds {size - self._offset}")
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)

    def keys(self) -> list[str]:
        return [self.name]

    def __contains__(self, name) -> bool:
        return name == self.name

    def info(self, name: str) -> tuple[np.dtype, tuple]:
        self._check(name)
        return self._dtype, self._shape

    def get(self, name: str) -> np.ndarray:
        """The array, a read-only memory-mapped view."""
        self._check(name)
        return _view(self._map, self._dtype, self._shape, self._fortran, self._offset)

    def _check(self, name):
        if name != self.name:
            raise KeyError(name)

    def close(self) -> None:
        self._map = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class NpzFile:
    """A validated ``.npz`` archive; every member's header is checked when it is opened.

    An ``__metadata__`` member holding a 0-d string array of a JSON object (string to string)
    is read into :attr:`metadata`, like the safetensors ``__metadata__`` map.
    """

    def __init__(self, path):
        self.path = os.fspath(path)
        try:
            self._zip = zipfile.ZipFile(self.path)
        except zipfile.BadZipFile as exc:
            raise CheckpointError(f"not a valid .npz (zip) archive ({exc})") from None
        self._members: dict[str, tuple] = {}
        self.metadata: dict[str, str] = {}
        self._map = None
        self._crc_ok: set[str] = set()
        try:
            self._scan()
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError, NotImplementedError,
                RuntimeError) as exc:
            self._zip.close()
            raise CheckpointError(f"corrupt .npz archive ({exc})") from None
        except BaseException:
            self._zip.close()
            raise

    def _scan(self) -> None:
        size = os.path.getsize(self.path)
        spans = sorted((*self._span(zi, size), zi.filename) for zi in self._zip.infolist())
        for (_, end, a), (begin, _, b) in zip(spans, spans[1:]):
            if begin < end:  # members sharing bytes: the classic non-recursive zip bomb
                raise CheckpointError(f"members {a!r} and {b!r} overlap in the archive")
        ends = {name: end for _, end, name in spans}
        for zi in self._zip.infolist():
            if not zi.filename.endswith(".npy"):
                raise CheckpointError(f"member {zi.filename!r} is not a .npy file")
            name = zi.filename[:-4]
            if name in self._members:
                raise CheckpointError(f"member {zi.filename!r} appears twice")
            if zi.flag_bits & 0x1:
                raise CheckpointError(f"member {zi.filename!r} is encrypted")
            if zi.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                raise CheckpointError(f"member {zi.filename!r}: compression method "
                                      f"{zi.compress_type} is not supported (NumPy writes "
                                      "stored or deflated members)")
            end = ends[zi.filename]
            # Bound what the member may expand to before anything is allocated: stored data
            # is its own size, deflate cannot expand more than 1032:1.
            bound = (zi.compress_size if zi.compress_type == zipfile.ZIP_STORED
                     else zi.compress_size * _DEFLATE_MAX_RATIO + 64)
            if zi.file_size > bound:
                raise CheckpointError(f"member {zi.filename!r} claims {zi.file_size} bytes but "
                                      f"holds {zi.compress_size} "
                                      f"{'stored' if bound == zi.compress_size else 'compressed'}"
                                      f" bytes, which cannot expand to that much")
            with self._zip.open(zi) as fh:
                dtype, shape, fortran, hlen = read_npy_header(fh)
            need = hlen + _nbytes(dtype, shape)
            if zi.file_size != need:
                raise CheckpointError(f"member {zi.filename!r}: the header promises "
                                      f"{need - hlen} data bytes, the member holds "
                                      f"{zi.file_size - hlen}")
            start = None
            if zi.compress_type == zipfile.ZIP_STORED:
                start = end - zi.compress_size + hlen
            self._members[name] = (zi, dtype, shape, fortran, hlen, start)
        if METADATA_KEY in self._members:
            self.metadata = self._read_metadata(self._members.pop(METADATA_KEY))

    def _span(self, zi: zipfile.ZipInfo, size: int) -> tuple[int, int]:
        """Byte range of a member (local header through its data) in the archive."""
        with open(self.path, "rb") as f:
            f.seek(zi.header_offset)
            local = f.read(30)
        if len(local) != 30 or local[:4] != b"PK\x03\x04":
            raise CheckpointError(f"member {zi.filename!r}: bad local file header")
        name_len, extra_len = struct.unpack("<HH", local[26:30])
        start = zi.header_offset + 30 + name_len + extra_len
        if start + zi.compress_size > size:
            raise CheckpointError(f"truncated archive: member {zi.filename!r} ends past the "
                                  f"end of the file ({size} bytes)")
        return zi.header_offset, start + zi.compress_size

    def _read_metadata(self, member) -> dict[str, str]:
        zi, dtype, shape, fortran, hlen, start = member
        if dtype.kind != "U" or shape != ():
            raise CheckpointError("__metadata__ must be a 0-d string array")
        try:
            meta = json.loads(str(self._read(member)[()]))
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"__metadata__ is not valid JSON ({exc.msg})") from None
        except RecursionError:
            raise CheckpointError("__metadata__ is nested too deeply") from None
        if not isinstance(meta, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
            raise CheckpointError("__metadata__ must map strings to strings")
        return meta

    def keys(self) -> list[str]:
        return list(self._members)

    def __contains__(self, name) -> bool:
        return name in self._members

    def info(self, name: str) -> tuple[np.dtype, tuple]:
        _, dtype, shape, _, _, _ = self._members[name]
        return dtype, shape

    def get(self, name: str) -> np.ndarray:
        """Member ``name``: a memory-mapped view when stored, else decompressed (CRC-checked)."""
        return self._read(self._members[name])

    def _read(self, member) -> np.ndarray:
        zi, dtype, shape, fortran, hlen, start = member
        if start is not None:
            if self._map is None:
                with open(self.path, "rb") as f:
                    self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            if zi.filename not in self._crc_ok:
                # zipfile checks the CRC of what it decompresses; a memory-mapped stored
                # member is checked here, once, over its header and data.
                first = start - hlen
                crc = _crc32(memoryview(self._map)[first:first + zi.file_size])
                if crc != zi.CRC:
                    raise CheckpointError(f"member {zi.filename!r} is corrupt (bad CRC-32: "
                                          f"{crc:08x}, the archive says {zi.CRC:08x})")
                self._crc_ok.add(zi.filename)
            return _view(self._map, dtype, shape, fortran, start)
        buf = bytearray(_nbytes(dtype, shape))
        try:
            with self._zip.open(zi) as fh:
                fh.read(hlen)
                got = fh.readinto(buf)
                if got != len(buf) or fh.read(1):
                    raise CheckpointError(f"member {zi.filename!r}: unexpected data size")
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError, RuntimeError) as exc:
            raise CheckpointError(f"member {zi.filename!r} is corrupt ({exc})") from None
        return _view(buf, dtype, shape, fortran, 0)

    def close(self) -> None:
        self._map = None
        self._zip.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
