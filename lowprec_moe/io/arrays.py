"""Named-array files: one reader interface over .npy / .npz / .safetensors, and a streaming writer.

Readers (:func:`open_arrays`) validate the whole file when opened and hand out read-only,
memory-mapped arrays one name at a time. The writer (:class:`ArrayWriter`) takes arrays one at a
time, so a converter never holds more than one tensor in memory, and publishes the file
atomically on :meth:`ArrayWriter.commit` (nothing is left behind if it is never reached).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
import zipfile
from typing import IO

import ml_dtypes
import numpy as np

from lowprec_moe.io._common import CheckpointError, atomic_output, check_output_path, describe
from lowprec_moe.io._safety import check_regular_file
from lowprec_moe.io.numpy_files import METADATA_KEY, NpyFile, NpzFile
from lowprec_moe.io.safetensors import SafetensorsFile, dtype_label, header_bytes, write_array_bytes

__all__ = ["SUFFIXES", "file_kind", "open_arrays", "ArrayWriter"]

#: File suffix -> kind.
SUFFIXES = {".npy": "npy", ".npz": "npz", ".safetensors": "safetensors"}


def file_kind(path) -> str:
    """``"npy"``, ``"npz"`` or ``"safetensors"`` from the suffix of ``path``.

    Raises
    ------
    ValueError
        For any other suffix.
    """
    suffix = os.path.splitext(os.fspath(path))[1].lower()
    if suffix not in SUFFIXES:
        raise ValueError(f"{os.fspath(path)!r}: unsupported file type {suffix or '(none)'!r}; "
                         f"use one of {', '.join(SUFFIXES)}")
    return SUFFIXES[suffix]


def open_arrays(path):
    """Open a .npy, .npz or .safetensors file for reading, validating it first.

    Parameters
    ----------
    path : str or os.PathLike

    Returns
    -------
    NpyFile, NpzFile or SafetensorsFile
        All three offer ``keys()``, ``info(name) -> (dtype, shape)``, ``get(name)`` (a read-only
        array, memory-mapped where the file allows), ``metadata`` (dict of str) and ``close()``.
        A ``.npy`` file holds one array named after the file (``w.npy`` -> ``"w"``).

    Raises
    ------
    OSError
        The file cannot be read (missing, a directory, no permission).
    CheckpointError
        The file is truncated, inconsistent or holds something refused (pickled objects).
    """
    kind = file_kind(path)
    path = os.fspath(path)
    check_regular_file(path)
    reader = {"npy": NpyFile, "npz": NpzFile, "safetensors": SafetensorsFile}[kind]
    try:
        return reader(path)
    except CheckpointError as exc:
        raise CheckpointError(f"{path}: {exc}") from None


class ArrayWriter:
    """Write named host arrays one at a time to a .safetensors, .npz or .npy file.

    Parameters
    ----------
    path : str or os.PathLike
        The destination; its suffix picks the format. A ``.npy`` file takes exactly one array.
    hold : bool
        The writer may keep added arrays by reference until :meth:`commit` instead of writing
        their bytes at once (the caller must not modify them in between). For a safetensors
        file this saves passing the tensor bytes through a temporary file.

    Notes
    -----
    Nothing appears at ``path`` before :meth:`commit`. A safetensors header must precede the
    data and is only known at the end, so tensor bytes are held (``hold=True``, up to
    ``HOLD_BYTES``) or go to an anonymous temporary file in the destination directory;
    ``.npz`` members are streamed straight into the archive (uncompressed, so readers can
    memory-map them). Use as a context manager: leaving the block without :meth:`commit` (or
    with an exception) discards everything.
    """

    #: The most tensor bytes a ``hold=True`` writer keeps by reference; later arrays are written
    #: to its temporary file (bounds the memory a conversion keeps alive).
    HOLD_BYTES = 1 << 30

    def __init__(self, path, *, hold: bool = False):
        self.kind = file_kind(path)
        self.path = check_output_path(path)
        self._names: list[str] = []
        self._entries: list[tuple[str, str, tuple]] = []
        self._dir = os.path.dirname(os.path.abspath(self.path))
        self._held: list[np.ndarray] = []
        self._hold_left = self.HOLD_BYTES if hold else -1
        self._body = None
        self._out = None
        self._zip = None
        self._npy = None
        if self.kind == "safetensors":
            self._body = tempfile.TemporaryFile(dir=self._dir, prefix=".lowprec_moe.")
        elif self.kind == "npz":
            self._out = atomic_output(self.path)
            f = self._out.__enter__()
            try:
                self._zip = zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True)
            except BaseException:
                self.abort()
                raise

    @property
    def names(self) -> list[str]:
        """Names written so far, in order."""
        return list(self._names)

    def add(self, name: str, array) -> None:
        """Append one host array under ``name``.

        Raises
        ------
        TypeError
            ``array`` is not a NumPy array or has a dtype the format cannot store.
        ValueError
            ``name`` is empty, reserved (``__metadata__``) or already used.
        """
        if not isinstance(array, np.ndarray):
            raise TypeError(f"tensor {name!r} must be a numpy array, got {describe(array)} "
                            "(copy GPU arrays to the host first)")
        if not isinstance(name, str) or not name or name == METADATA_KEY:
            raise ValueError(f"tensor name {name!r} is not allowed")
        if name in self._names:
            raise ValueError(f"tensor name {name!r} is used twice")
        if array.dtype.hasobject:
            raise TypeError(f"tensor {name!r}: dtype=object cannot be saved (no pickling)")
        if self.kind == "safetensors":
            label = dtype_label(array.dtype)
            # held arrays precede the temporary file's bytes: once one array went there, all do
            if array.nbytes <= self._hold_left:
                self._held.append(array)
                self._hold_left -= array.nbytes
            else:
                self._hold_left = -1
                write_array_bytes(self._body, array)
            self._entries.append((name, label, tuple(array.shape)))
        elif self.kind == "npz":
            if array.dtype.itemsize == 1 and array.dtype.kind == "V" or _is_fp8(array.dtype):
                array = array.view(np.uint8)
            with self._zip.open(name + ".npy", "w", force_zip64=True) as fh:
                np.lib.format.write_array(fh, array, allow_pickle=False)
        else:
            if self._npy is not None:
                raise ValueError(f"{self.path!r}: a .npy file holds one array; got a second one "
                                 f"({name!r}); write .npz or .safetensors instead")
            self._npy = array
        self._names.append(name)

    def commit(self, metadata: dict[str, str] | None = None) -> None:
        """Finish the file and move it onto ``path`` atomically.

        ``metadata`` (str to str) goes to the safetensors ``__metadata__`` map, or to a
        ``__metadata__`` member of an .npz archive (a JSON string); .npy files have none.
        """
        if self.kind == "safetensors":
            head = header_bytes(self._entries, metadata)
            with atomic_output(self.path) as f:
                f.write(head)
                # each array is let go once written: its memory can hold the next pages
                self._held.reverse()
                while self._held:
                    write_array_bytes(f, self._held.pop())
                copy_file(self._body, f)
        elif self.kind == "npz":
            if metadata:
                check_metadata(metadata)
                with self._zip.open(METADATA_KEY + ".npy", "w") as fh:
                    np.lib.format.write_array(fh, np.array(json.dumps(metadata)),
                                              allow_pickle=False)
            self._zip.close()
            self._zip = None
            out, self._out = self._out, None
            out.__exit__(None, None, None)
        else:
            if self._npy is None:
                raise ValueError(f"{self.path!r}: nothing to write")
            with atomic_output(self.path) as f:
                np.lib.format.write_array(f, self._npy, allow_pickle=False)
        self.abort()

    def abort(self) -> None:
        """Discard everything written so far (no-op after :meth:`commit`)."""
        if self._zip is not None:
            try:
                self._zip.close()
            except Exception:  # the archive is being thrown away anyway
                pass
            self._zip = None
        if self._out is not None:
            out, self._out = self._out, None
            try:
                out.__exit__(CheckpointError, CheckpointError("aborted"), None)
            except CheckpointError:
                pass
        if self._body is not None:
            self._body.close()
            self._body = None
        self._held = []
        self._npy = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.abort()


def copy_file(src: IO[bytes], dst: IO[bytes]) -> None:
    """Append all of ``src`` to ``dst`` (both open binary files), in the kernel where possible."""
    src.flush()
    dst.flush()
    size = os.fstat(src.fileno()).st_size
    done = 0
    try:
        while done < size:
            n = os.copy_file_range(src.fileno(), dst.fileno(), size - done, done)
            if n == 0:
                break
            done += n
    except AttributeError:  # not on Linux
        pass
    except OSError as exc:  # a file system or kernel without it
        if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
            raise
    if done < size:
        src.seek(done)
        dst.seek(0, os.SEEK_END)
        shutil.copyfileobj(src, dst, 1 << 24)
    dst.seek(0, os.SEEK_END)


def check_metadata(metadata) -> None:
    """Metadata must map str to str (what both readers accept)."""
    if not isinstance(metadata, dict):
        raise TypeError(f"metadata must be a dict of str to str, got {describe(metadata)}")
    for k, v in metadata.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(f"metadata must map str to str, got {k!r}: {describe(v)}")


def _is_fp8(dtype: np.dtype) -> bool:
    return dtype in (np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2))
