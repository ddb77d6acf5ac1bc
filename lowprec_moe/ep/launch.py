"""Start one process per GPU on this host, as the expert-parallel process group expects.

    python -m lowprec_moe.ep.launch --nproc N script.py [args ...]
    python -m lowprec_moe.ep.launch --nproc N -m package.module [args ...]

Each process runs ``script.py args`` (or ``python -m package.module args``) with ``RANK`` and
``LOCAL_RANK`` set to its index, ``WORLD_SIZE=N``, and ``MASTER_ADDR`` / ``MASTER_PORT`` naming
where rank 0 serves NCCL's unique id (a free port of this host unless ``--master-port`` is
given); :func:`lowprec_moe.ep.init_process_group` reads them. The launcher forwards SIGINT,
SIGTERM and SIGHUP to every process; when a process fails, it stops the others (SIGTERM, then
SIGKILL after ``--grace`` seconds) and exits with that process's status, so that the failure of
one rank never leaves the others waiting in a collective. Exit status: 0 when every process
exited with 0; otherwise the first failure's exit code (128 + the signal number for a process
ended by a signal).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time

__all__ = ["free_port", "launch", "main"]

_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port of ``host`` that nobody listened on a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _status(code: int) -> int:
    """A child's return code as a shell exit status (128 + signal for a signal)."""
    return 128 - code if code < 0 else code


def _die_with_parent() -> None:
    """In the child, before exec: receive SIGTERM when the launcher dies (Linux), so that a
    launcher killed with SIGKILL leaves no rank behind holding its GPU."""
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG


def launch(command: list, nproc: int, *, master_addr: str = "127.0.0.1",
           master_port: int | None = None, grace: float = 10.0) -> int:
    """Run ``command`` in ``nproc`` processes with the process-group environment; wait for all.

    Parameters
    ----------
    command : list of str
        The program and its arguments (``[sys.executable, "script.py", ...]``).
    nproc : int
        Number of processes (one per GPU).
    master_addr : str
        Address rank 0 listens on (this host).
    master_port : int, optional
        Port rank 0 listens on; default: a free port of ``master_addr``.
    grace : float
        Seconds the other processes get to exit after a failure or a forwarded signal before
        they are killed.

    Returns
    -------
    int
        0 when every process exited with 0, else the exit status of the first failure.
    """
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc={nproc!r} must be a positive int")
    if not command:
        raise ValueError("command must name a program to run")
    if master_port is not None and not 0 < int(master_port) < 65536:
        raise ValueError(f"master_port={master_port!r} must be in [1, 65535]")
    if not grace >= 0:
        raise ValueError(f"grace={grace!r} must be >= 0 seconds")
    port = free_port(master_addr) if master_port is None else int(master_port)
    procs: list = []
    received: list = []

    def forward(signum, _frame):
        received.append(signum)
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in _FORWARDED}
    try:
        for rank in range(nproc):
            if received:  # interrupted while starting: start no more
                break
            env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc),
                       LOCAL_WORLD_SIZE=str(nproc), MASTER_ADDR=master_addr,
                       MASTER_PORT=str(port))
            # a session of their own: a terminal's Ctrl-C reaches the launcher only, which
            # forwards it once to each rank
            procs.append(subprocess.Popen(command, env=env, start_new_session=True,
                                          preexec_fn=_die_with_parent))
        return _wait(procs, received, grace)
    finally:
        _stop(procs, grace)
        for s, h in previous.items():
            signal.signal(s, h)


def _wait(procs: list, received: list, grace: float) -> int:
    failed = None
    signalled_at = None
    while True:
        codes = [p.poll() for p in procs]
        if failed is None and not received:
            for rank, code in enumerate(codes):
                if code not in (None, 0):
                    failed = (rank, code)
                    print(f"lowprec_moe.ep.launch: rank {rank} exited with status "
                          f"{_status(code)}; stopping the other ranks", file=sys.stderr)
                    for p in procs:
                        if p.poll() is None:
                            p.send_signal(signal.SIGTERM)
                    signalled_at = time.monotonic()
                    break
        if received and signalled_at is None:
            signalled_at = time.monotonic()
        if all(c is not None for c in codes):
            break
        if signalled_at is not None and time.monotonic() - signalled_at > grace:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        time.sleep(0.05)
    if failed is not None:
        return _status(failed[1])
    if received:
        bad = [c for c in codes if c != 0]
        return _status(bad[0]) if bad else 128 + int(received[0])
    return 0


def _stop(procs: list, grace: float) -> None:
    """Terminate what still runs (the launcher itself is failing), then kill after ``grace``."""
    live = [p for p in procs if p.poll() is None]
    for p in live:
        p.terminate()
    deadline = time.monotonic() + grace
    for p in live:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def main(argv: list | None = None) -> int:
    """Command line: ``python -m lowprec_moe.ep.launch --nproc N script.py [args ...]``."""
    ap = argparse.ArgumentParser(
        prog="python -m lowprec_moe.ep.launch",
        description="Start N processes of a script on this host with RANK, LOCAL_RANK, "
                    "WORLD_SIZE, MASTER_ADDR and MASTER_PORT set (one process per GPU).")
    ap.add_argument("--nproc", type=int, required=True, help="number of processes (GPUs)")
    ap.add_argument("--master-addr", default="127.0.0.1",
                    help="address rank 0 listens on (default 127.0.0.1)")
    ap.add_argument("--master-port", type=int, default=None,
                    help="port rank 0 listens on (default: a free port)")
    ap.add_argument("--grace", type=float, default=10.0,
                    help="seconds the other ranks get to exit after a failure (default 10)")
    ap.add_argument("-m", "--module", action="store_true",
                    help="run the target as a module (python -m target)")
    ap.add_argument("target", help="script path, or module name with -m")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="arguments of the script")
    ns = ap.parse_args(argv)
    if ns.nproc < 1:
        ap.error(f"--nproc={ns.nproc} must be >= 1")
    if ns.module:
        command = [sys.executable, "-m", ns.target, *ns.args]
    else:
        if not os.path.isfile(ns.target):
            ap.error(f"script {ns.target!r} does not exist")
        command = [sys.executable, ns.target, *ns.args]
    return launch(command, ns.nproc, master_addr=ns.master_addr, master_port=ns.master_port,
                  grace=ns.grace)


if __name__ == "__main__":
    sys.exit(main())
