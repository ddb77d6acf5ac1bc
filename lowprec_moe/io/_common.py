"""Shared pieces of the file readers and writers: the error type and atomic output."""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from typing import IO, Iterator

import numpy as np


class CheckpointError(ValueError):
    """A file is not a valid .npy / .npz / .safetensors file, or not a valid checkpoint.

    Raised before any tensor data is used: truncated files, bad headers, inconsistent byte
    counts, refused dtypes (Python objects, which would need unpickling) and the like.
    """


def empty_readonly(shape, dtype):
    """A read-only zero-filled array, like the memory-mapped views the readers return."""
    a = np.zeros(shape, dtype)
    a.flags.writeable = False
    return a


def describe(obj) -> str:
    """Short type description of ``obj`` for error messages."""
    return type(obj).__name__


def check_output_path(path) -> str:
    """Check that ``path`` can be created: its directory exists and it is not a directory.

    Returns
    -------
    str
        The path as a string.

    Raises
    ------
    FileNotFoundError, IsADirectoryError, PermissionError
        With the offending path as ``filename``.
    """
    path = os.fspath(path)
    parent = os.path.dirname(path) or os.curdir
    if os.path.isdir(path):
        raise IsADirectoryError(errno.EISDIR, "output is a directory", path)
    if not os.path.isdir(parent):
        raise FileNotFoundError(errno.ENOENT, "output directory does not exist", parent)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PermissionError(errno.EACCES, "output directory is not writable", parent)
    return path


def _umask() -> int:
    """The process umask, read without changing it where the OS allows (Linux)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_output(path) -> Iterator[IO[bytes]]:
    """Open a temporary file next to ``path``; move it onto ``path`` only on success.

    The temporary file lives in the destination directory (so ``os.replace`` is atomic), is
    flushed to disk before the rename, and is deleted if the block raises: a failure never leaves
    a partial ``path`` behind, and an existing ``path`` stays untouched until the new one is whole.
    """
    path = check_output_path(path)
    parent = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=parent, prefix="." + os.path.basename(path) + ".",
                               suffix=".tmp")
    try:
        with os.fdopen(fd, "w+b") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
