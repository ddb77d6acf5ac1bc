"""Guards that keep user data safe: inputs must be regular files, an output is never an input,
an existing output is replaced only when asked, and signals still clean temporary files up."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import stat
import threading
from typing import Iterable, Iterator

__all__ = ["Interrupted", "check_regular_file", "same_file", "check_output_target",
           "cleanup_on_signals"]


class Interrupted(BaseException):
    """Raised in the main thread by :func:`cleanup_on_signals` when SIGTERM / SIGHUP arrive.

    A ``BaseException`` (like ``KeyboardInterrupt``) so that ``except Exception`` blocks do not
    swallow it, while every ``try / finally`` and atomic-output cleanup on the way out runs.
    """

    def __init__(self, signum: int):
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum


def check_regular_file(path, what: str = "input") -> os.stat_result:
    """``os.stat`` of ``path``, refusing anything but a regular file (after symlinks).

    A FIFO or a character device would block or never end when read, so they are refused before
    the file is opened.

    Raises
    ------
    FileNotFoundError, IsADirectoryError
        With ``path`` as ``filename``.
    ValueError
        ``path`` is a FIFO, socket or device.
    """
    path = os.fspath(path)
    st = os.stat(path)
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, f"{what} is a directory", path)
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
                else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
                else "not a regular file")
        raise ValueError(f"{path!r}: {what} is {kind}; only regular files are read")
    return st


def same_file(a, b) -> bool:
    """Whether ``a`` and ``b`` name the same file (same device and inode: symlinks and hard
    links included). False when either does not exist."""
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _inside(path: str, directory: str) -> bool:
    path, directory = os.path.realpath(path), os.path.realpath(directory)
    return os.path.commonpath([path, directory]) == directory


def check_output_target(dst, inputs: Iterable, *, force: bool) -> str:
    """Refuse an output that would destroy an input or an existing file.

    Parameters
    ----------
    dst : path
        The output file or directory.
    inputs : iterable of path
        Every file the conversion reads (all shards, the index, ``config.json`` ...).
    force : bool
        Allow replacing an existing ``dst`` that is not an input.

    Raises
    ------
    ValueError
        ``dst`` is one of the inputs (same path, symlink or hard link), a directory holding an
        input, or exists while ``force`` is false.
    """
    dst = os.fspath(dst)
    inputs = [os.fspath(p) for p in inputs]
    for src in inputs:
        if same_file(src, dst) or os.path.realpath(src) == os.path.realpath(dst):
            raise ValueError(f"output {dst!r} is the input {src!r} (same file); refusing to "
                             "overwrite the original; choose another output")
        if os.path.isdir(dst) and _inside(src, dst):
            raise ValueError(f"output directory {dst!r} holds the input {src!r}; refusing to "
                             "replace it; choose another output")
    if os.path.lexists(dst) and not force:
        raise ValueError(f"output {dst!r} already exists; pass --force (force=True) to "
                         "replace it")
    return dst


@contextlib.contextmanager
def cleanup_on_signals(signals: Iterable[int] = ()) -> Iterator[None]:
    """Turn SIGTERM and SIGHUP (plus ``signals``) into :class:`Interrupted` for the block.

    SIGINT already raises ``KeyboardInterrupt``. Either way the exception unwinds through the
    writers, whose cleanup deletes their temporary files; the previous handlers come back after
    the block. Outside the main thread (where Python cannot install handlers) this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    wanted = {signal.SIGTERM, *signals}
    if hasattr(signal, "SIGHUP"):
        wanted.add(signal.SIGHUP)

    def handler(signum, frame):
        raise Interrupted(signum)

    old = {}
    try:
        for s in wanted:
            old[s] = signal.signal(s, handler)
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
