"""Process start-up of expert parallelism on the CPU: the launcher (environment of each rank,
arguments, exit status of a failing rank, signal forwarding), reading the environment, and
the TCP exchange through which rank 0 hands NCCL's unique id to the other ranks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from lowprec_moe.ep import launch as L
from lowprec_moe.ep.nccl import Environment, ProcessGroup, read_environment, share_bytes

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict:
    """The test's environment, with this checkout importable in the children."""
    path = os.environ.get("PYTHONPATH")
    return dict(os.environ, PYTHONPATH=str(ROOT) + (os.pathsep + path if path else ""))


def _launch(tmp_path, body: str, *args, nproc=2, extra=(), timeout=120):
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(body))
    cmd = [sys.executable, "-m", "lowprec_moe.ep.launch", "--nproc", str(nproc), *extra,
           str(script), *args]
    return subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True,
                          timeout=timeout)


def test_each_rank_gets_its_environment_and_the_arguments(tmp_path):
    out = _launch(tmp_path, """
        import os, sys
        keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
        words = [os.environ[k] for k in keys] + sys.argv[1:]
        sys.stdout.write(" ".join(words) + "\\n")  # one write: lines of ranks do not mix
        """, "--flag", "value", nproc=3)
    assert out.returncode == 0, out.stderr
    lines = sorted(out.stdout.split("\n")[:3])
    ports = {line.split()[4] for line in lines}
    assert len(ports) == 1 and 0 < int(ports.pop()) < 65536
    for r, line in enumerate(lines):
        rank, local, world, addr, _, *rest = line.split()
        assert (rank, local, world, addr) == (str(r), str(r), "3", "127.0.0.1")
        assert rest == ["--flag", "value"]


def test_a_failing_rank_fails_the_launch_and_stops_the_others(tmp_path):
    t0 = time.monotonic()
    out = _launch(tmp_path, """
        import os, sys, time
        if os.environ["RANK"] == "1":
            sys.exit(7)
        time.sleep(120)  # a rank that would wait forever in a collective
        """, nproc=3, extra=("--grace", "5"))
    assert out.returncode == 7
    assert "rank 1 exited with status 7" in out.stderr
    assert time.monotonic() - t0 < 60


def test_exit_status_of_a_rank_killed_by_a_signal(tmp_path):
    out = _launch(tmp_path, """
        import os, signal
        if os.environ["RANK"] == "0":
            os.kill(os.getpid(), signal.SIGKILL)
        """)
    assert out.returncode == 128 + signal.SIGKILL


def test_signals_are_forwarded(tmp_path):
    script = tmp_path / "rank.py"
    pids = tmp_path / "pids"
    pids.mkdir()
    script.write_text(textwrap.dedent(f"""
        import os, time
        open(os.path.join({str(pids)!r}, os.environ["RANK"]), "w").write(str(os.getpid()))
        time.sleep(120)
        """))
    proc = subprocess.Popen([sys.executable, "-m", "lowprec_moe.ep.launch", "--nproc", "2",
                             str(script)], cwd=ROOT, env=_env())
    deadline = time.monotonic() + 60
    while len(list(pids.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    children = [int(p.read_text()) for p in pids.iterdir()]
    assert len(children) == 2
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    for pid in children:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_module_mode_and_refusals(tmp_path):
    pkg = tmp_path / "epmod.py"
    pkg.write_text("import os, sys\n"
                   "sys.stdout.write('module rank ' + os.environ['RANK'] + '\\n')\n")
    env = _env()
    env["PYTHONPATH"] = str(tmp_path) + os.pathsep + env["PYTHONPATH"]
    out = subprocess.run([sys.executable, "-m", "lowprec_moe.ep.launch", "--nproc", "2", "-m",
                          "epmod"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.split("\n")[:2]) == ["module rank 0", "module rank 1"]
    bad = subprocess.run([sys.executable, "-m", "lowprec_moe.ep.launch", "--nproc", "2",
                          str(tmp_path / "missing.py")], cwd=ROOT, env=_env(),
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "does not exist" in bad.stderr
    with pytest.raises(ValueError, match="nproc=0"):
        L.launch([sys.executable, "-c", "pass"], 0)
    with pytest.raises(ValueError, match="master_port=70000"):
        L.launch([sys.executable, "-c", "pass"], 1, master_port=70000)


def test_unique_id_exchange_over_tcp(tmp_path):
    """Rank 0 serves 128 bytes on MASTER_ADDR:MASTER_PORT; the other ranks fetch them."""
    out = _launch(tmp_path, """
        import sys
        from lowprec_moe.ep.nccl import read_environment, share_bytes
        env = read_environment()
        payload = bytes(range(128)) if env.rank == 0 else None
        got = share_bytes(payload, env, timeout=60)
        sys.stdout.write(f"{env.rank} {got.hex()}\\n")
        """, nproc=4)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split("\n")[:4]
    assert sorted(line.split()[0] for line in lines) == ["0", "1", "2", "3"]
    assert {line.split()[1] for line in lines} == {bytes(range(128)).hex()}


def test_unique_id_exchange_times_out():
    env = Environment(rank=1, world_size=2, local_rank=1, master_addr="127.0.0.1",
                      master_port=L.free_port())
    with pytest.raises(TimeoutError, match="rank 0 did not serve"):
        share_bytes(None, env, timeout=0.5)
    with pytest.raises(ValueError, match="payload must be None"):
        share_bytes(b"x", env)
    with pytest.raises(TypeError, match="payload must be bytes"):
        share_bytes(None, Environment(0, 2, 0, "127.0.0.1", env.master_port))


def test_read_environment():
    good = dict(RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", MASTER_ADDR="127.0.0.1",
                MASTER_PORT="29500")
    assert read_environment(good) == Environment(1, 2, 1, "127.0.0.1", 29500)
    with pytest.raises(ValueError, match="lacks MASTER_ADDR, MASTER_PORT"):
        read_environment(dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0"))
    with pytest.raises(ValueError, match="RANK=2 must be in"):
        read_environment(dict(good, RANK="2"))
    with pytest.raises(ValueError, match="WORLD_SIZE='two' must be an integer"):
        read_environment(dict(good, WORLD_SIZE="two"))
    with pytest.raises(ValueError, match="MASTER_PORT=0"):
        read_environment(dict(good, MASTER_PORT="0"))


def test_process_group_moves_cupy_arrays_only():
    import numpy as np

    from lowprec_moe import ep

    group = ProcessGroup(Environment(0, 2, 0, "127.0.0.1", 29500), None, 0)
    x = np.zeros((4, 32), np.float32)
    idx = np.zeros((4, 1), np.int64)
    with pytest.raises(TypeError, match="moves CuPy arrays"):
        ep.dispatch(x, idx, np.ones((4, 1), np.float32), 2, group=group)
    with pytest.raises(ValueError, match="GPU 1"):
        group.check_arrays(None, 1)


def test_init_process_group_without_cupy_says_so():
    import importlib.util

    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed here")
    from lowprec_moe import ep

    env = dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
               MASTER_PORT="29500")
    with pytest.raises(RuntimeError, match="needs CuPy"):
        ep.init_process_group(env)
