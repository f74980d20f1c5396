"""Timing logic against an injected, seeded fake clock: warm-up, calibration, median and IQR."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from gpudiag.bench.timing import (
    Measurement,
    Rotation,
    copies_to_exceed_cache,
    host_timer,
    measure,
    quartiles,
)
from tests.fakes.clock import FakeClock


def _draws(seed: int, count: int) -> list[float]:
    rng = random.Random(seed)
    return [rng.choice((1, 2, 3, 5, 8)) * 1e-3 for _ in range(count)]


def test_warmup_calls_are_outside_the_samples() -> None:
    clock = FakeClock(seed=11)
    m = measure(clock.work, repeats=6, warmup=3, number=1, clock=clock, sync=clock.sync)
    durations = _draws(11, 9)
    assert m.samples_s == pytest.approx(tuple(durations[3:]), abs=1e-15)
    assert m.warmup_calls == 3
    assert m.number == 1


def test_exact_median_and_iqr_from_the_seeded_clock() -> None:
    clock = FakeClock(seed=3)
    m = measure(clock.work, repeats=7, warmup=1, number=1, clock=clock, sync=clock.sync)
    # random.Random(3) draws 2, 8, 8, 2, 3, 8, 5, 8 ms; the first is the warm-up.
    assert m.samples_s == pytest.approx((8e-3, 8e-3, 2e-3, 3e-3, 8e-3, 5e-3, 8e-3))
    assert m.median_s == pytest.approx(8e-3)
    assert m.q1_s == pytest.approx(4e-3)
    assert m.q3_s == pytest.approx(8e-3)
    assert m.iqr_s == pytest.approx(4e-3)
    assert m.relative_spread == pytest.approx(0.5)


def test_known_samples_give_known_quartiles() -> None:
    m = Measurement((0.003, 0.001, 0.004, 0.001, 0.005), "x")
    assert m.median_s == pytest.approx(0.003)
    assert m.q1_s == pytest.approx(0.001)
    assert m.q3_s == pytest.approx(0.004)
    assert m.iqr_s == pytest.approx(0.003)
    assert m.relative_spread == pytest.approx(1.0)
    assert m.has_large_spread
    assert "WARNING" in repr(m)
    assert quartiles([1.0, 2.0, 3.0, 4.0]) == pytest.approx((1.75, 2.5, 3.25))


def test_sync_comes_before_every_clock_reading() -> None:
    clock = FakeClock(seed=5)
    measure(clock.work, repeats=2, warmup=1, number=2, clock=clock, sync=clock.sync)
    timed = list(clock.log)
    # the first read is the budget clock; then each repetition: sync, read, 2 x work, sync, read.
    assert timed[:2] == ["read", "work"]
    rep = ["sync", "read", "work", "work", "sync", "read"]
    assert timed[2:] == rep + rep


def test_calibration_picks_calls_per_sample_and_is_not_a_sample() -> None:
    clock = FakeClock(seed=0)

    def quick() -> None:
        clock.now += 2e-4

    m = measure(quick, repeats=4, warmup=2, min_sample_s=1e-3, clock=clock, sync=clock.sync)
    assert m.number == 5  # 1 ms / 0.2 ms
    assert m.warmup_calls == 3  # 2 warm-up calls and the calibration call
    assert m.samples_s == pytest.approx((2e-4,) * 4)


def test_time_budget_stops_after_the_minimum_repeats() -> None:
    clock = FakeClock(seed=0)

    def slow() -> None:
        clock.now += 1.0

    m = measure(slow, repeats=50, warmup=0, number=1, max_time_s=2.5, min_repeats=3, clock=clock)
    assert m.n == 3


def test_a_device_timer_replaces_the_host_clock() -> None:
    recorded = iter([0.5, 0.25, 0.75])

    @contextmanager
    def event_timer() -> Iterator[list[float]]:
        out: list[float] = []
        yield out
        out.append(next(recorded))

    m = measure(lambda: None, repeats=3, warmup=0, number=1, timer=event_timer)
    assert m.samples_s == (0.5, 0.25, 0.75)
    assert m.median_s == 0.5


def test_host_timer_reads_after_sync() -> None:
    clock = FakeClock(seed=1)
    with host_timer(clock, clock.sync)() as elapsed:
        clock.work()
    assert clock.log == ["sync", "read", "work", "sync", "read"]
    assert elapsed[0] == pytest.approx(_draws(1, 1)[0])


def test_rates_and_json() -> None:
    m = Measurement((1.0, 2.0, 4.0), "r", number=3, warmup_calls=2)
    assert m.rate(8.0) == pytest.approx(4.0)
    assert m.rate_spread(8.0) == pytest.approx((8.0 / 3.0, 8.0 / 1.5))
    data = json.loads(json.dumps(m.to_dict()))
    assert data["number"] == 3
    assert data["warmup_calls"] == 2
    assert data["samples_s"] == [1.0, 2.0, 4.0]


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="repeats"):
        measure(lambda: None, repeats=0)


def test_rotation_cycles_and_copies_outgrow_the_cache() -> None:
    r = Rotation(["a", "b", "c"])
    assert [r.next() for _ in range(5)] == ["a", "b", "c", "a", "b"]
    assert copies_to_exceed_cache(1 << 20, 32 << 20) == 64
    assert copies_to_exceed_cache(256 << 20, 32 << 20) == 1
    assert copies_to_exceed_cache(1 << 20, 32 << 20, max_total_bytes=10 << 20) == 10
    with pytest.raises(ValueError, match="at least one item"):
        Rotation([])


def test_importing_bench_is_light() -> None:
    code = (
        "import gpudiag.bench, sys; "
        "print(sorted(m for m in ('torch','numpy','plotly','tqdm') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_noise_warning_reuses_the_spread_line_and_catches_a_swing() -> None:
    from gpudiag.analysis.measurement import Measurement as Plain
    from gpudiag.analysis.measurement import noise_warning

    calm = Plain((1.0, 1.01, 0.99, 1.0, 1.0))
    spread = Plain((1.0, 1.3, 0.8, 1.2, 0.9, 1.25))  # IQR well over 10 % of the median
    swing = Plain((1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 4.0))  # IQR 0, one stall 4x
    assert noise_warning([("a", calm), ("b", None), ("c", Plain((1.0, 9.0)))]) is None
    text = noise_warning([("a", calm), ("b", spread), ("c", swing)])
    assert text is not None
    assert text.startswith("WARNING: the timings swung in 2 of 3 cases")
    assert "4.0x the fastest in c" in text


def test_matmul_warns_when_its_repetitions_swing(monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses
    from typing import Any

    from gpudiag.bench import gemm

    real = gemm.measure

    def stalled(*args: Any, **kwargs: Any) -> Any:
        m = real(*args, **kwargs)
        fast = min(m.samples_s)
        return dataclasses.replace(m, samples_s=(fast,) * 5 + (4 * fast,))  # a busy host

    monkeypatch.setattr(gemm, "measure", stalled)
    result = gemm.matmul(["fp32"], [64], device="cpu", repeats=4, progress=False)
    assert "WARNING: the timings swung in 1 of 1 cases" in repr(result)
