"""Progress of long conversions, in bytes, with throughput and time left.

:class:`ByteProgress` writes to a stream (the CLI passes stderr): on a terminal one line that
rewrites itself, elsewhere (a log, a pipe, a batch job) one line every ``interval`` seconds and a
summary at the end, so that a long job shows it is alive (a job shorter than one interval prints
nothing there). :class:`NoProgress` says nothing.
"""

from __future__ import annotations

import time
from typing import IO

__all__ = ["NoProgress", "ByteProgress", "format_bytes"]


def format_bytes(n: float) -> str:
    """``1.50 GiB``, ``12.0 MiB``, ``512 B``."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def _duration(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class NoProgress:
    """The progress interface, silent: ``start(total, label)``, ``advance(nbytes, name)``,
    ``finish()``."""

    def start(self, total: int, label: str) -> None:
        pass

    def advance(self, nbytes: int, name: str = "") -> None:
        pass

    def finish(self) -> None:
        pass


class ByteProgress(NoProgress):
    """Bytes done of ``total``, MB/s and ETA on ``stream``.

    Parameters
    ----------
    stream : file
        Where to write (stderr in the CLI).
    interval : float
        Seconds between lines when ``stream`` is not a terminal (and between redraws on one).
    tty : bool, optional
        Force terminal / line mode (default: ``stream.isatty()``).
    clock : callable
        Seconds as a float (tests pass a fake one).
    """

    def __init__(self, stream: IO[str], *, interval: float = 5.0, tty: bool | None = None,
                 clock=time.monotonic):
        self.stream = stream
        self.interval = interval
        self.tty = stream.isatty() if tty is None else tty
        self.clock = clock
        self.total = self.done = 0
        self.label = ""
        self._t0 = self._last = 0.0
        self._drawn = False
        self._lines = 0

    def start(self, total: int, label: str) -> None:
        self.total, self.done, self.label = int(total), 0, label
        self._t0 = self._last = self.clock()
        self._lines = 0
        if self.tty:
            self._emit("")

    def line(self, name: str = "") -> str:
        """The status line for the current state."""
        elapsed = max(self.clock() - self._t0, 1e-9)
        rate = self.done / elapsed
        pct = 100.0 * self.done / self.total if self.total else 100.0
        eta = (self.total - self.done) / rate if rate > 0 else float("inf")
        eta_s = _duration(eta) if eta != float("inf") else "?"
        text = (f"{self.label}: {format_bytes(self.done)} / {format_bytes(self.total)} "
                f"({pct:.0f}%), {rate / 1e6:.1f} MB/s, ETA {eta_s}")
        return text + (f"  {name}" if name else "")

    def _emit(self, name: str) -> None:
        if self.tty:
            self.stream.write("\r\033[K" + self.line(name)[:200])
            self._drawn = True
        else:
            self.stream.write(self.line(name) + "\n")
            self._lines += 1
        self.stream.flush()

    def advance(self, nbytes: int, name: str = "") -> None:
        self.done += int(nbytes)
        now = self.clock()
        if now - self._last >= (min(self.interval, 0.2) if self.tty else self.interval):
            self._last = now
            self._emit(name)

    def finish(self) -> None:
        if not self.tty and not self._lines:
            return  # a job shorter than one interval needs no progress report
        elapsed = max(self.clock() - self._t0, 1e-9)
        text = (f"{self.label}: {format_bytes(self.done)} in {elapsed:.1f} s "
                f"({self.done / elapsed / 1e6:.1f} MB/s)")
        self.stream.write(("\r\033[K" if self._drawn else "") + text + "\n")
        self.stream.flush()
        self._drawn = False
