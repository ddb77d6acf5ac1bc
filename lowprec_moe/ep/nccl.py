"""NCCL process groups through CuPy (``cupy.cuda.nccl``): one process per GPU.

Start-up follows the ecosystem's convention (torchrun, Megatron, DeepSpeed): each process reads
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` from its
environment (``python -m lowprec_moe.ep.launch`` sets them), selects GPU ``LOCAL_RANK``, and
rank 0 serves NCCL's unique id on ``MASTER_ADDR:MASTER_PORT`` over a plain TCP socket from which
the other ranks fetch it; then every rank creates its ``NcclCommunicator``.

The collectives are grouped point-to-point calls: ``groupStart``, one ``send`` and one ``recv``
per peer (and per array), ``groupEnd``, on the current CuPy stream. They are enqueued like
kernels and never synchronise the host. The part a rank sends to itself is a device copy.
"""

from __future__ import annotations

import numbers
import os
import socket
import struct
import time
from dataclasses import dataclass

from lowprec_moe.ep.group import Group, check_counts

__all__ = ["Environment", "ProcessGroup", "init_process_group", "read_environment",
           "share_bytes"]

ENV_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
_MAGIC = b"lpm-ep-1"
_HELLO = struct.Struct("!8sII")  # magic, rank, world size
_REPLY = struct.Struct("!8sI")  # magic, payload length


@dataclass(frozen=True)
class Environment:
    """A process's place in the group, as its environment says.

    Attributes
    ----------
    rank, world_size, local_rank : int
    master_addr : str
    master_port : int
    """

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int


def read_environment(environ=None) -> Environment:
    """Read ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``.

    Parameters
    ----------
    environ : mapping, optional
        Default: ``os.environ``.

    Returns
    -------
    Environment

    Raises
    ------
    ValueError
        A variable is missing or out of range (the message names it and its value).
    """
    env = os.environ if environ is None else environ
    missing = [k for k in ENV_VARS if not str(env.get(k, "")).strip()]
    if missing:
        raise ValueError(f"the environment lacks {', '.join(missing)}; start the processes with "
                         "python -m lowprec_moe.ep.launch --nproc N script.py (or torchrun), "
                         "which set " + ", ".join(ENV_VARS))

    def integer(name: str) -> int:
        text = str(env[name]).strip()
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{name}={text!r} must be an integer") from None

    rank, world, local, port = (integer(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                      "MASTER_PORT"))
    if world < 1:
        raise ValueError(f"WORLD_SIZE={world} must be >= 1")
    if not 0 <= rank < world:
        raise ValueError(f"RANK={rank} must be in [0, WORLD_SIZE={world})")
    if local < 0:
        raise ValueError(f"LOCAL_RANK={local} must be >= 0")
    if not 0 < port < 65536:
        raise ValueError(f"MASTER_PORT={port} must be in [1, 65535]")
    return Environment(rank, world, local, str(env["MASTER_ADDR"]).strip(), port)


# ----------------------------------------------------------------------- the unique id exchange
def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"the peer closed the connection after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def share_bytes(payload: bytes | None, env: Environment, *, timeout: float = 300.0) -> bytes:
    """Rank 0 hands ``payload`` to every other rank over TCP on ``MASTER_ADDR:MASTER_PORT``.

    Rank 0 listens until each of ranks ``1 .. WORLD_SIZE-1`` has connected once, said who it is
    and received the payload; the others connect (retrying while rank 0 is not listening yet)
    and return what they received. Standard library sockets only; used for NCCL's unique id.

    Parameters
    ----------
    payload : bytes or None
        Rank 0: the bytes to share. Other ranks: None.
    env : Environment
    timeout : float
        Seconds before a rank gives up (``TimeoutError`` naming what it waited for).

    Returns
    -------
    bytes
        The payload, on every rank.
    """
    if not isinstance(env, Environment):
        raise TypeError(f"env must be an Environment, got {type(env).__name__}")
    if not isinstance(timeout, numbers.Real) or not timeout > 0:
        raise ValueError(f"timeout={timeout!r} must be a positive number of seconds")
    if env.rank == 0:
        if not isinstance(payload, (bytes, bytearray)):
            raise TypeError(f"payload must be bytes on rank 0, got {type(payload).__name__}")
        _serve(bytes(payload), env, float(timeout))
        return bytes(payload)
    if payload is not None:
        raise ValueError(f"payload must be None on rank {env.rank} (rank 0 provides it)")
    return _fetch(env, float(timeout))


def _serve(payload: bytes, env: Environment, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    waiting = set(range(1, env.world_size))
    if not waiting:
        return
    with socket.create_server((env.master_addr, env.master_port)) as server:
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"rank 0: ranks {sorted(waiting)} did not connect to "
                                   f"{env.master_addr}:{env.master_port} within {timeout} s")
            server.settimeout(left)
            try:
                conn, _ = server.accept()
            except socket.timeout:
                continue
            with conn:
                conn.settimeout(max(deadline - time.monotonic(), 1.0))
                magic, rank, world = _HELLO.unpack(_recv_exact(conn, _HELLO.size))
                if magic != _MAGIC:
                    raise RuntimeError(f"rank 0: a connection to {env.master_addr}:"
                                       f"{env.master_port} is not a lowprec_moe rank")
                if world != env.world_size or rank not in waiting:
                    raise RuntimeError(f"rank 0: a peer says RANK={rank}, WORLD_SIZE={world}; "
                                       f"expected WORLD_SIZE={env.world_size} and one of "
                                       f"{sorted(waiting)}")
                conn.sendall(_REPLY.pack(_MAGIC, len(payload)) + payload)
                waiting.discard(rank)


def _fetch(env: Environment, timeout: float) -> bytes:
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"rank {env.rank}: rank 0 did not serve on {env.master_addr}:"
                               f"{env.master_port} within {timeout} s")
        try:
            with socket.create_connection((env.master_addr, env.master_port),
                                          timeout=left) as conn:
                conn.sendall(_HELLO.pack(_MAGIC, env.rank, env.world_size))
                magic, n = _REPLY.unpack(_recv_exact(conn, _REPLY.size))
                if magic != _MAGIC:
                    raise RuntimeError(f"rank {env.rank}: {env.master_addr}:{env.master_port} "
                                       "is not served by rank 0 of this group")
                return _recv_exact(conn, n)
        except (ConnectionRefusedError, ConnectionResetError, ConnectionAbortedError):
            time.sleep(0.05)  # rank 0 is not listening yet


# ---------------------------------------------------------------------------- the NCCL group
def _nccl():
    try:
        import cupy
        from cupy.cuda import nccl
    except Exception as exc:  # ImportError, or a CUDA install that fails to load
        raise RuntimeError("ProcessGroup needs CuPy with NCCL (pip install -e \".[gpu]\"): "
                           f"importing cupy failed ({type(exc).__name__}: {exc})") from exc
    if not getattr(nccl, "available", False):
        raise RuntimeError("ProcessGroup needs NCCL, which this CuPy install cannot load "
                           "(pip install nvidia-nccl-cu13, or the wheel of CuPy's CUDA version)")
    return cupy, nccl


class ProcessGroup(Group):
    """An NCCL communicator over one GPU per process, made with :func:`init_process_group`.

    Attributes
    ----------
    rank, size, local_rank : int
    device_id : int
        The CUDA device of this process (``LOCAL_RANK``).
    """

    def __init__(self, env: Environment, comm, device_id: int):
        self.rank = env.rank
        self.size = env.world_size
        self.local_rank = env.local_rank
        self.device_id = device_id
        self.env = env
        self._comm = comm

    def __repr__(self) -> str:
        return (f"ProcessGroup(rank={self.rank}, size={self.size}, device={self.device_id}, "
                f"{'closed' if self._comm is None else 'open'})")

    # ------------------------------------------------------------------------------ set-up
    @classmethod
    def from_environment(cls, environ=None, *, timeout: float = 300.0) -> "ProcessGroup":
        """Create this process's member from ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` /
        ``MASTER_ADDR`` / ``MASTER_PORT`` (see :func:`init_process_group`)."""
        env = read_environment(environ)
        cupy, nccl = _nccl()
        count = int(cupy.cuda.runtime.getDeviceCount())
        if env.local_rank >= count:
            raise ValueError(f"LOCAL_RANK={env.local_rank} names no GPU: this process sees "
                             f"{count} (one process per GPU)")
        cupy.cuda.Device(env.local_rank).use()
        uid = nccl.get_unique_id() if env.rank == 0 else None
        if isinstance(uid, tuple):  # CuPy before 14 gave the id as signed chars
            uid = bytes(v & 0xFF for v in uid)
        uid = share_bytes(uid, env, timeout=timeout)
        comm = nccl.NcclCommunicator(env.world_size, _uid_for(cupy, uid), env.rank)
        return cls(env, comm, env.local_rank)

    def close(self) -> None:
        """Destroy the communicator (the group is unusable afterwards)."""
        if self._comm is not None:
            cupy, _ = _nccl()
            cupy.cuda.Device(self.device_id).synchronize()  # let enqueued exchanges finish
            self._comm.destroy()
            self._comm = None

    def __enter__(self) -> "ProcessGroup":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def check_arrays(self, xp, device_id) -> None:
        if device_id is None:
            raise TypeError("a ProcessGroup (NCCL) moves CuPy arrays; got NumPy arrays "
                            "(ThreadGroup runs the same algorithm on NumPy)")
        if device_id != self.device_id:
            raise ValueError(f"the arrays are on GPU {device_id}, this rank's group on GPU "
                             f"{self.device_id} (LOCAL_RANK={self.local_rank})")

    def _open(self):
        if self._comm is None:
            raise RuntimeError(f"rank {self.rank}: the ProcessGroup is closed")
        return self._comm

    # -------------------------------------------------------------------------- collectives
    def all_to_all(self, send):
        cupy, nccl = _nccl()
        comm = self._open()
        if send.ndim < 1 or send.shape[0] != self.size:
            raise ValueError(f"send must have {self.size} rows, got shape {tuple(send.shape)}")
        send = cupy.ascontiguousarray(send)
        out = cupy.empty_like(send)
        row = send.nbytes // self.size
        stream = cupy.cuda.get_current_stream().ptr
        if row:
            nccl.groupStart()
            try:
                for p in range(self.size):
                    if p != self.rank:
                        comm.send(send.data.ptr + p * row, row, nccl.NCCL_UINT8, p, stream)
                        comm.recv(out.data.ptr + p * row, row, nccl.NCCL_UINT8, p, stream)
            finally:
                nccl.groupEnd()
        out[self.rank] = send[self.rank]
        return out

    def all_to_all_v(self, arrays, send_counts, recv_counts):
        cupy, nccl = _nccl()
        comm = self._open()
        arrays = [cupy.ascontiguousarray(a) for a in arrays]
        send, recv, so, ro = check_counts(self, arrays, send_counts, recv_counts)
        r = self.rank
        if send[r] != recv[r]:
            raise ValueError(f"rank {r}: sends itself {send[r]} rows but expects {recv[r]}")
        outs = [cupy.empty((int(ro[-1]),) + tuple(a.shape[1:]), dtype=a.dtype) for a in arrays]
        row_bytes = [a.dtype.itemsize * _prod(a.shape[1:]) for a in arrays]
        stream = cupy.cuda.get_current_stream().ptr
        nccl.groupStart()
        try:
            for p in range(self.size):
                if p == self.rank:
                    continue
                # per peer, the arrays in order on both sides: NCCL matches a pair's sends and
                # receives in the order they are posted
                for a, o, rb in zip(arrays, outs, row_bytes):
                    if send[p] and rb:
                        comm.send(a.data.ptr + int(so[p]) * rb, send[p] * rb, nccl.NCCL_UINT8,
                                  p, stream)
                    if recv[p] and rb:
                        comm.recv(o.data.ptr + int(ro[p]) * rb, recv[p] * rb, nccl.NCCL_UINT8,
                                  p, stream)
        finally:
            nccl.groupEnd()
        for a, o in zip(arrays, outs):
            if send[r]:
                o[int(ro[r]):int(ro[r + 1])] = a[int(so[r]):int(so[r + 1])]
        return outs

    def barrier(self) -> None:
        """Wait (host and device) until every rank got here: a one-byte all-to-all, then a
        synchronisation of the current stream. For benchmarks and tests, not the data path."""
        cupy, _ = _nccl()
        self.all_to_all(cupy.zeros((self.size, 1), dtype=cupy.uint8))
        cupy.cuda.get_current_stream().synchronize()


def _prod(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _uid_for(cupy, uid: bytes):
    """The unique id in the form this CuPy's ``NcclCommunicator`` takes (bytes since CuPy 14,
    a tuple of signed chars before)."""
    if int(cupy.__version__.split(".")[0]) >= 14:
        return uid
    return tuple(b - 256 if b > 127 else b for b in uid)


def init_process_group(environ=None, *, timeout: float = 300.0) -> ProcessGroup:
    """Join the NCCL process group that the environment describes (one process per GPU).

    Reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` (set by
    ``python -m lowprec_moe.ep.launch --nproc N script.py``, or by torchrun), makes GPU
    ``LOCAL_RANK`` the current CuPy device, receives NCCL's unique id from rank 0 over TCP on
    ``MASTER_ADDR:MASTER_PORT`` and creates the communicator.

    Parameters
    ----------
    environ : mapping, optional
        Default: ``os.environ``.
    timeout : float
        Seconds to wait for the other ranks at start-up.

    Returns
    -------
    ProcessGroup

    Raises
    ------
    ValueError
        A variable is missing or out of range, or ``LOCAL_RANK`` names no GPU.
    RuntimeError
        CuPy or its NCCL cannot be loaded.
    TimeoutError
        The other ranks did not show up within ``timeout``.
    """
    return ProcessGroup.from_environment(environ, timeout=timeout)
