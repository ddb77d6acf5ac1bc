"""CPU tests of the timing helpers of benchmarks/bench_gemm.py, with a simulated clock."""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_gemm.py"


def _load(path: Path, name: str):
    """The benchmark script at `path` as a fresh module (scripts are not importable)."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def bench():
    return _load(_PATH, "bench_gemm_under_test")


class _Clock:
    """A device clock that every simulated call advances; events read it when recorded."""

    def __init__(self):
        self.now = 0.0
        self.log: list[str] = []

    def event(self):
        clock = self

        class _Event:
            t = None

            def record(self):
                self.t = clock.now

            def synchronize(self):
                pass

        return _Event()

    @staticmethod
    def elapsed(start, end):
        return end.t - start.t

    def sync(self):
        pass

    def call(self, name, ms_seq):
        """A function that costs the next duration of ms_seq (cycled) per call."""
        durations = itertools.cycle(ms_seq)

        def fn():
            self.now += next(durations)
            self.log.append(name)

        return fn


def test_reps_aim_at_two_ms(bench):
    assert bench._reps(0.1) == 20
    assert bench._reps(5.0) == 1
    assert bench._reps(1e-6) == 50


def test_burst_median_ms_per_call(bench):
    c = _Clock()
    ms, host = bench._burst_median_ms(c.event, c.sync, c.elapsed, c.call("a", [0.25]), 2, 5)
    assert ms == pytest.approx(0.25)
    assert host >= 0.0
    # 2 warm-up calls, 1 calibration call, then 5 samples of 2 ms / 0.25 ms = 8 calls
    assert len(c.log) == 2 + 1 + 5 * 8


def test_hold_precedes_each_timed_sample(bench, monkeypatch):
    """With a GPU hold, every sample after the first (which measures the host time) starts
    with a hold of 1.5x the calls' host time plus 50 us, enqueued before the first event, so
    the sample itself still times only the calls."""
    c = _Clock()
    holds = []

    def hold(us):
        holds.append(us)
        c.now += us * 1e-3  # the device spins before the start event is recorded

    monkeypatch.setattr(bench, "_HOLD", hold)
    monkeypatch.setattr(bench, "_HOST_US", {})
    fn = c.call("a", [0.25])
    ms, host = bench._burst_median_ms(c.event, c.sync, c.elapsed, fn, 2, 5)
    assert ms == pytest.approx(0.25)
    assert len(holds) == 5  # not before the calibration sample: no host time known yet
    assert holds[-1] == pytest.approx(1.5 * 8 * bench._HOST_US[fn] + 50.0)


def test_paired_alternates_and_takes_median_ratio(bench):
    c = _Clock()
    # the device slows down by 20 % halfway: per-round ratios stay 0.5
    ours = c.call("ours", [1.0] * 20 + [1.2] * 100)
    peer = c.call("peer", [0.5] * 20 + [0.6] * 100)
    timer = (c.event, c.sync, c.elapsed)
    o_ms, _, p_ms, ratio = bench._paired_median_ms((*timer, ours), (*timer, peer), 1, 6)
    assert ratio == pytest.approx(0.5)
    assert p_ms / o_ms == pytest.approx(0.5, rel=0.25)
    # after warm-up / calibration the rounds alternate: a burst of peer calls, then of ours
    rounds = c.log[4:]
    runs = [rounds[0]]
    for name in rounds[1:]:
        if name != runs[-1]:
            runs.append(name)
    assert runs == ["peer", "ours"] * 6


def test_median_ms_returns_ms_per_call(bench):
    """The probes format _median_ms's result as a number (ms per call)."""
    c = _Clock()

    class _Cuda:
        Event = staticmethod(c.event)
        get_elapsed_time = staticmethod(c.elapsed)

        class Device:
            def synchronize(self):
                c.sync()

    class _Cp:
        cuda = _Cuda

    ms = bench._median_ms(_Cp, c.call("a", [0.5]), 1, 3)
    assert isinstance(ms, float)
    assert f"{ms:9.3f}" == "    0.500"


_AB_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "ab_gemm.py"


@pytest.fixture(scope="module")
def ab():
    return _load(_AB_PATH, "ab_gemm_under_test")


def test_ab_variant_parsing(ab):
    """``name:KEY=V,KEY2=V2`` variants of benchmarks/ab_gemm.py; malformed ones and unknown keys
    are ValueErrors naming the variant."""
    assert ab.parse_variant("base:") == ("base", {})
    assert ab.parse_variant("base") == ("base", {})
    assert ab.parse_variant("old:kernel=grouped_gemm_simt_64x64,kernel_dir=exp/v0") == (
        "old", {"kernel": "grouped_gemm_simt_64x64", "kernel_dir": "exp/v0"})
    for bad in (":kernel=1", "a:kernel", "a:=1", "a:LOWPREC_MOE_GEMM_TMA=off"):
        with pytest.raises(ValueError, match="variant"):
            ab.parse_variant(bad)


def test_ab_options_scoped(ab):
    """A variant's options hold during the call only, also when the call raises."""
    from lowprec_moe import config

    seen = ab._with_options({"kernel": "grouped_gemm_simt_64x64", "mxfp8_mma": "bf16",
                             "kernel_dir": "exp/v0"},
                            lambda: (config.gemm_options(), config.kernel_source_dir()))
    assert seen == (config.GemmOptions("grouped_gemm_simt_64x64", "bf16"), "exp/v0")
    assert config.gemm_options() == config.GemmOptions() and config.kernel_source_dir() is None
    with pytest.raises(RuntimeError):
        ab._with_options({"mxfp8_mma": "bf16"},
                         lambda: (_ for _ in ()).throw(RuntimeError("boom")))
    assert config.gemm_options() == config.GemmOptions()
