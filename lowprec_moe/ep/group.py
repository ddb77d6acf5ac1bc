"""Process groups of expert parallelism: the transport interface that
:func:`~lowprec_moe.ep.dispatch` and :func:`~lowprec_moe.ep.combine` use, and a group of threads
in one process.

The interface is two collectives, nothing else:

* :meth:`Group.all_to_all` -- every rank sends row ``d`` of a ``[size, n]`` array to rank ``d``
  and receives row ``s`` from rank ``s`` (the per-expert counts, before each exchange);
* :meth:`Group.all_to_all_v` -- every rank sends ``send_counts[d]`` consecutive rows of a few
  arrays to rank ``d`` and receives ``recv_counts[s]`` rows of each from rank ``s``, concatenated
  in rank order (the tokens, the experts' outputs, their gradients).

:class:`~lowprec_moe.ep.ProcessGroup` implements them with NCCL (one process per GPU);
:class:`ThreadGroup` implements them with threads of one process over NumPy or CuPy arrays, so
that the whole multi-rank algorithm runs (and is tested) without GPUs. :func:`run_threads` runs
one function per rank of a thread group.
"""

from __future__ import annotations

import numbers
import threading

import numpy as np

from lowprec_moe.backend import get_xp

__all__ = ["Group", "ThreadGroup", "run_threads"]


class Group:
    """What expert parallelism needs of a process group (the transport interface).

    Attributes
    ----------
    rank : int
        This member's index, ``0 <= rank < size``.
    size : int
        Number of members; each holds ``num_experts / size`` experts.

    Every member must make the same sequence of calls (collectives), as with any process
    group. Subclasses implement :meth:`all_to_all` and :meth:`all_to_all_v`.
    """

    rank: int
    size: int

    def check_arrays(self, xp, device_id) -> None:
        """Raise ``TypeError`` / ``ValueError`` when this group cannot move arrays of module
        ``xp`` on device ``device_id`` (None for NumPy). The default accepts any."""

    def all_to_all(self, send):
        """Send row ``d`` of ``send`` to rank ``d``; receive row ``s`` from rank ``s``.

        Parameters
        ----------
        send : array ``[size, n]``, C-contiguous

        Returns
        -------
        array ``[size, n]`` of ``send``'s dtype and module
        """
        raise NotImplementedError

    def all_to_all_v(self, arrays, send_counts, recv_counts):
        """Exchange rows of a few arrays: ``send_counts[d]`` consecutive rows of each array go
        to rank ``d`` (ranks in order), ``recv_counts[s]`` rows of each come from rank ``s``.

        Parameters
        ----------
        arrays : sequence of arrays ``[sum(send_counts), ...]``, C-contiguous
        send_counts, recv_counts : sequence of ``size`` ints (host)
            What the peers send must match: ``send_counts[d]`` here equals ``recv_counts[rank]``
            on rank ``d`` (the counts exchange makes it so).

        Returns
        -------
        list of arrays ``[sum(recv_counts), ...]``
            One per input array (same dtype and trailing shape), rows of rank 0 first.
        """
        raise NotImplementedError


def check_counts(group: Group, arrays, send_counts, recv_counts):
    """The arguments of :meth:`Group.all_to_all_v` as host int tuples and row offsets, checked
    against the arrays (a mismatch is a bug of the caller, not a user error)."""
    send = tuple(int(c) for c in send_counts)
    recv = tuple(int(c) for c in recv_counts)
    if len(send) != group.size or len(recv) != group.size:
        raise ValueError(f"send_counts and recv_counts must have {group.size} entries, got "
                         f"{len(send)} and {len(recv)}")
    if min(send + recv, default=0) < 0:
        raise ValueError(f"counts must be non-negative, got send {send}, recv {recv}")
    for i, a in enumerate(arrays):
        if a.ndim < 1 or a.shape[0] != sum(send):
            raise ValueError(f"arrays[{i}] has shape {tuple(a.shape)}; its rows must equal "
                             f"sum(send_counts)={sum(send)}")
    return send, recv, np.concatenate([[0], np.cumsum(send)]), np.concatenate([[0],
                                                                               np.cumsum(recv)])


class _Exchange:
    """The mailboxes and barrier a thread group shares: ``boxes[src][dst]``."""

    def __init__(self, size: int, timeout: float):
        self.barrier = threading.Barrier(size, timeout=timeout)
        self.boxes = [[None] * size for _ in range(size)]


class _PeerFailed(RuntimeError):
    """Another member of a thread group failed (or the exchange timed out)."""


class ThreadGroup(Group):
    """A group of ``size`` members in one process, one thread each, exchanging arrays through
    shared memory (a copy per message) and a barrier.

    It runs the whole multi-rank algorithm of :mod:`lowprec_moe.ep` on NumPy (or CuPy) arrays
    without NCCL: the tests compare every rank's results with a single-process run on it.
    Create the members together with :meth:`create`, or let :func:`run_threads` do it.
    """

    def __init__(self, rank: int, size: int, exchange: _Exchange):
        self.rank = rank
        self.size = size
        self._x = exchange

    @classmethod
    def create(cls, size: int, *, timeout: float = 300.0) -> list:
        """The ``size`` members of a new thread group, rank order.

        Parameters
        ----------
        size : int
            Number of members (>= 1).
        timeout : float
            Seconds a member waits for the others at a collective before it fails.

        Returns
        -------
        list of ThreadGroup
        """
        if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 1:
            raise ValueError(f"size={size!r} must be a positive int")
        if not isinstance(timeout, numbers.Real) or not timeout > 0:
            raise ValueError(f"timeout={timeout!r} must be a positive number of seconds")
        exchange = _Exchange(int(size), float(timeout))
        return [cls(r, int(size), exchange) for r in range(int(size))]

    def abort(self) -> None:
        """Break the barrier: every member waiting at (or arriving at) a collective fails."""
        self._x.barrier.abort()

    def _wait(self) -> None:
        try:
            self._x.barrier.wait()
        except threading.BrokenBarrierError:
            raise _PeerFailed(f"rank {self.rank}: another rank of the thread group failed or "
                              "the exchange timed out") from None

    def all_to_all(self, send):
        if send.ndim < 1 or send.shape[0] != self.size:
            raise ValueError(f"send must have {self.size} rows, got shape {tuple(send.shape)}")
        xp = get_xp(send)
        row = self._x.boxes[self.rank]
        for d in range(self.size):
            row[d] = send[d].copy()
        self._wait()
        out = xp.stack([self._x.boxes[s][self.rank] for s in range(self.size)])
        self._wait()  # the boxes are free again
        return out

    def all_to_all_v(self, arrays, send_counts, recv_counts):
        arrays = list(arrays)
        send, recv, so, ro = check_counts(self, arrays, send_counts, recv_counts)
        row = self._x.boxes[self.rank]
        for d in range(self.size):
            row[d] = [a[so[d]:so[d + 1]].copy() for a in arrays]
        self._wait()
        got = [self._x.boxes[s][self.rank] for s in range(self.size)]
        for s in range(self.size):
            for i, part in enumerate(got[s]):
                if part.shape[0] != recv[s]:
                    self.abort()
                    raise RuntimeError(f"rank {self.rank}: rank {s} sent {part.shape[0]} rows of "
                                       f"arrays[{i}], recv_counts[{s}]={recv[s]}")
        out = []
        for i, a in enumerate(arrays):
            xp = get_xp(a)
            out.append(xp.ascontiguousarray(xp.concatenate([got[s][i] for s in range(self.size)])))
        self._wait()
        return out


def run_threads(fn, size: int, *, timeout: float = 300.0) -> list:
    """Run ``fn(group)`` once per member of a new :class:`ThreadGroup`, each in its own thread.

    Parameters
    ----------
    fn : callable
        Called with one :class:`ThreadGroup` member; every member must make the same sequence
        of collective calls.
    size : int
        Number of members.
    timeout : float
        Seconds a member waits at a collective before the group fails.

    Returns
    -------
    list
        ``fn``'s results, rank order.

    Raises
    ------
    Exception
        The first exception a member raised (lowest rank first, other than the failures it
        caused in the members waiting for it).
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    groups = ThreadGroup.create(size, timeout=timeout)
    results: list = [None] * len(groups)
    errors: list = [None] * len(groups)

    def body(g: ThreadGroup) -> None:
        try:
            results[g.rank] = fn(g)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the calling thread below
            errors[g.rank] = exc
            g.abort()

    threads = [threading.Thread(target=body, args=(g,), name=f"ep-rank-{g.rank}", daemon=True)
               for g in groups]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first = [e for e in errors if e is not None and not isinstance(e, _PeerFailed)]
    if first or any(e is not None for e in errors):
        raise (first or [e for e in errors if e is not None])[0]
    return results
