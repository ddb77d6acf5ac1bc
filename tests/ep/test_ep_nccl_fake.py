"""ProcessGroup's collectives (the NCCL path) on the CPU, with stand-ins for CuPy and
``cupy.cuda.nccl``: arrays are NumPy arrays that expose ``.data.ptr``, and a fake communicator
records each rank's grouped ``send`` / ``recv`` calls and, at ``groupEnd``, copies the bytes
between the threads' buffers (``ctypes.memmove``), matching a pair's sends and receives in the
order they were posted, as NCCL does. So the pointer arithmetic, byte counts, zero-count skips
and the local copy of ``ProcessGroup`` run here; the whole multi-rank model then runs over it
and equals one process, byte for byte."""

from __future__ import annotations

import ctypes
import threading
import types

import numpy as np
import pytest

import _ep_cases as C
from lowprec_moe import ep
from lowprec_moe.ep import nccl as N


class _Dev(np.ndarray):
    """A NumPy array that shows its address as CuPy does (``a.data.ptr``)."""

    @property
    def data(self):  # noqa: D401 - mirrors cupy.ndarray.data
        return types.SimpleNamespace(ptr=self.ctypes.data)


def _dev(a):
    return np.ascontiguousarray(a).view(_Dev)


class _FakeNccl:
    """``groupStart`` / ``groupEnd`` / ``NCCL_UINT8`` and communicators of one thread group."""

    NCCL_UINT8 = 1
    available = True

    def __init__(self, size: int):
        self.size = size
        self.barrier = threading.Barrier(size, timeout=60)
        self.posted = [None] * size
        self.local = threading.local()
        self.calls = [0] * size  # grouped calls per rank

    def groupStart(self):  # noqa: N802 - NCCL's name
        assert getattr(self.local, "ops", None) is None, "nested groupStart"
        self.local.ops = []

    def groupEnd(self):  # noqa: N802
        ops, self.local.ops = self.local.ops, None
        rank = self.local.rank
        self.calls[rank] += 1
        self.posted[rank] = ops
        self.barrier.wait()
        try:
            sends_to_me = {p: [o for o in self.posted[p] if o[0] == "send" and o[3] == rank]
                           for p in range(self.size)}
            mine = [o for o in ops if o[0] == "recv"]
            for peer in range(self.size):
                recvs = [o for o in mine if o[3] == peer]
                sends = sends_to_me[peer]
                assert len(recvs) == len(sends), f"rank {rank}: {len(recvs)} recvs from {peer}, " \
                                                 f"{len(sends)} sends"
                for (_, dst, n, _), (_, src, m, _) in zip(recvs, sends):
                    assert n == m, f"rank {rank} receives {n} bytes from {peer}, it sends {m}"
                    ctypes.memmove(dst, src, n)
        finally:
            self.barrier.wait()

    def comm(self, rank: int):
        fake = self

        class Comm:
            def send(self, ptr, count, dtype, peer, stream):
                assert dtype == fake.NCCL_UINT8 and peer != rank and count > 0
                fake.local.rank = rank
                fake.local.ops.append(("send", ptr, count, peer))

            def recv(self, ptr, count, dtype, peer, stream):
                assert dtype == fake.NCCL_UINT8 and peer != rank and count > 0
                fake.local.rank = rank
                fake.local.ops.append(("recv", ptr, count, peer))

            def destroy(self):
                pass

        return Comm()


_fake_cupy = types.SimpleNamespace(
    ascontiguousarray=_dev,
    empty=lambda shape, dtype: np.empty(shape, dtype).view(_Dev),
    empty_like=lambda a: np.empty_like(a).view(_Dev),
    zeros=lambda shape, dtype: np.zeros(shape, dtype).view(_Dev),
    uint8=np.uint8,
    cuda=types.SimpleNamespace(
        get_current_stream=lambda: types.SimpleNamespace(ptr=0, synchronize=lambda: None),
        Device=lambda i: types.SimpleNamespace(synchronize=lambda: None)),
)


class _HostProcessGroup(N.ProcessGroup):
    """ProcessGroup over the stand-ins, taking and giving plain NumPy arrays."""

    def __init__(self, rank, size, fake):
        super().__init__(N.Environment(rank, size, rank, "127.0.0.1", 1), fake.comm(rank), rank)
        self._fake = fake

    def check_arrays(self, xp, device_id):
        pass

    def all_to_all(self, send):
        self._fake.local.rank = self.rank
        return np.asarray(super().all_to_all(send)).view(np.ndarray)

    def all_to_all_v(self, arrays, send_counts, recv_counts):
        self._fake.local.rank = self.rank
        return [np.asarray(o).view(np.ndarray)
                for o in super().all_to_all_v(arrays, send_counts, recv_counts)]


def _run(monkeypatch, world, fn):
    fake = _FakeNccl(world)
    monkeypatch.setattr(N, "_nccl", lambda: (_fake_cupy, fake))
    groups = [_HostProcessGroup(r, world, fake) for r in range(world)]
    results, errors = [None] * world, []

    def body(g):
        try:
            results[g.rank] = fn(g)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
            fake.barrier.abort()

    threads = [threading.Thread(target=body, args=(g,), daemon=True) for g in groups]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    return results, fake


@pytest.mark.parametrize("world", [2, 3, 4])
def test_collectives_over_the_nccl_code(monkeypatch, world):
    results, fake = _run(monkeypatch, world, lambda g: C.collective_mismatches(g, np))
    assert not any(results), results
    assert fake.calls == [2] * world  # one grouped call per collective


@pytest.mark.parametrize("case", C.CASES)
@pytest.mark.parametrize("world", [2, 4])
def test_whole_model_over_the_nccl_code(monkeypatch, world, case):
    p = C.problem(world, case)
    ref = C.reference(np, p, "mxfp8")
    results, fake = _run(monkeypatch, world, lambda g: C.run_rank(g, np, p, "mxfp8"))
    bad = [m for r in range(world) for m in C.mismatches(r, world, results[r], ref, p)]
    assert not bad, "\n".join(bad)
    # dispatch: counts + rows; combine: rows back; combine_backward: dy rows; dispatch_backward
    assert fake.calls == [5] * world


def test_close_and_self_count_check(monkeypatch):
    fake = _FakeNccl(1)
    monkeypatch.setattr(N, "_nccl", lambda: (_fake_cupy, fake))
    g = _HostProcessGroup(0, 1, fake)
    with pytest.raises(ValueError, match="sends itself 2 rows but expects 1"):
        g.all_to_all_v([np.zeros((2, 3), np.uint8)], [2], [1])
    g.close()
    with pytest.raises(RuntimeError, match="closed"):
        g.all_to_all(np.zeros((1, 1), np.int64))
