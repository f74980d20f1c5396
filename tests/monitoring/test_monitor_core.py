"""The monitor core: ring buffer, ticks, summary, throttling, and every way sampling ends."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from gpudiag.errors import GpuDiagError
from gpudiag.monitoring import Monitor, active, stop
from gpudiag.monitoring import sampler as monitor_module
from gpudiag.monitoring.buffer import SeriesRing
from gpudiag.monitoring.sampler import format_value, next_slot
from gpudiag.probe.readings import Status
from tests.fakes.clock import FakeClock
from tests.fakes.monitor_feeds import ScriptedFeed


@pytest.fixture(autouse=True)
def no_monitor_left() -> Iterator[None]:
    yield
    stop()
    left = [t for t in threading.enumerate() if t.name == "gpudiag-monitor"]
    assert not left, f"sampler threads left running: {left}"


def wait_for(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.005)


# -- ring buffer ---------------------------------------------------------------------------------


def test_ring_keeps_the_newest_rows_and_numbers_them() -> None:
    ring = SeriesRing(capacity=4, width=1)
    for i in range(10):
        ring.append(float(i), np.array([i * 10.0]))
    assert (ring.count, ring.oldest, len(ring)) == (10, 6, 4)
    t, v = ring.last()
    assert t.tolist() == [6.0, 7.0, 8.0, 9.0]
    assert v[:, 0].tolist() == [60.0, 70.0, 80.0, 90.0]


def test_ring_since_returns_only_rows_not_yet_seen() -> None:
    ring = SeriesRing(capacity=8, width=2)
    for i in range(5):
        ring.append(float(i), np.array([i, -i], dtype=float))
    first, t, _ = ring.since(3)
    assert (first, t.tolist()) == (3, [3.0, 4.0])
    first, t, _ = ring.since(5)
    assert (first, t.size) == (5, 0)
    # Rows already overwritten are skipped: the answer starts at the oldest held row.
    for i in range(5, 20):
        ring.append(float(i), np.array([i, -i], dtype=float))
    first, t, _ = ring.since(0)
    assert (first, t[0], t.size) == (12, 12.0, 8)
    first, t, _ = ring.since(0, limit=3)
    assert (first, t.tolist()) == (17, [17.0, 18.0, 19.0])


def test_ring_memory_does_not_grow() -> None:
    ring = SeriesRing(capacity=100, width=3)
    before = ring.nbytes
    for i in range(10_000):
        ring.append(float(i), np.ones(3))
    assert ring.nbytes == before


# -- scheduling ------------------------------------------------------------------------------------


def test_next_slot_stays_on_the_grid() -> None:
    assert next_slot(10.0, 10.05, 0.25) == (10.25, 0)


def test_next_slot_skips_missed_slots_instead_of_bursting() -> None:
    # Due at 10.25; the read ended at 10.8: 10.25 and 10.5 and 10.75 are gone.
    assert next_slot(10.0, 10.8, 0.25) == (11.0, 3)


# -- ticks, samples, summary -----------------------------------------------------------------------


def test_tick_records_one_row_per_read_with_its_timestamp() -> None:
    clock = FakeClock(1_700_000_000.0)
    feed = ScriptedFeed(clock)
    m = Monitor(feed, interval=0.5, start=False, clock=clock)
    for _ in range(3):
        m.tick()
        clock.advance(0.5)
    df = m.samples()
    assert df[("gpu0", "gpu_util_pct")].tolist() == [1.0, 2.0, 3.0]
    expected = [1_700_000_000.0, 1_700_000_000.5, 1_700_000_001.0]
    assert [ts.timestamp() for ts in df.index] == expected
    assert str(df.index.tz) == "UTC"
    assert df.attrs["units"]["gpu0/gpu_util_pct"] == "%"


def test_samples_last_s_keeps_the_tail() -> None:
    clock = FakeClock(1000.0)
    m = Monitor(ScriptedFeed(clock), interval=1.0, start=False, clock=clock)
    for _ in range(10):
        m.tick()
        clock.advance(1.0)
    assert m.samples(last_s=2.0)[("gpu0", "gpu_util_pct")].tolist() == [8.0, 9.0, 10.0]


def test_history_bounds_the_rows_kept() -> None:
    clock = FakeClock(1000.0)
    m = Monitor(ScriptedFeed(clock), interval=1.0, history_s=20.0, start=False, clock=clock)
    for _ in range(100):
        m.tick()
        clock.advance(1.0)
    assert len(m.samples()) == m.ring.capacity == 21


def test_summary_percentiles_per_series() -> None:
    clock = FakeClock(1000.0)
    m = Monitor(ScriptedFeed(clock), interval=1.0, start=False, clock=clock)
    for _ in range(100):
        m.tick()
        clock.advance(1.0)
    row = m.summary().row("gpu0", "gpu_util_pct")
    # numpy's linear interpolation over 1..100.
    assert (row.p5, row.p50, row.p95, row.max, row.last) == (5.95, 50.5, 95.05, 100.0, 100.0)
    assert row.samples == 100
    assert row.na_samples == 0


def test_summary_explains_na_series() -> None:
    clock = FakeClock(1000.0)
    reason = "the NVIDIA driver lets only admin users read GPU performance counters"
    feed = ScriptedFeed(
        clock,
        values=lambda n: [float(n), math.nan],
        na=lambda n: {1: (Status.NO_PERMISSION, reason)},
    )
    m = Monitor(feed, interval=1.0, start=False, clock=clock)
    m.tick()
    summary = m.summary()
    row = summary.row("gpu0", "throttled")
    assert row.na_samples == 1
    assert row.reason == reason
    assert m.na_reasons()[m.series[1]] == (Status.NO_PERMISSION, reason)
    assert reason in repr(summary)
    assert "&lt;script&gt;" not in summary._repr_html_()  # escaped output, nothing injected
    with pytest.raises(GpuDiagError, match="no series"):
        summary.row("gpu9", "gpu_util_pct")


def test_summary_html_escapes_labels() -> None:
    clock = FakeClock(1000.0)
    feed = ScriptedFeed(clock)
    feed.label = "<script>alert(1)</script>"
    m = Monitor(feed, interval=1.0, start=False, clock=clock)
    m.tick()
    assert "<script>" not in m.summary()._repr_html_()
    assert "<script>" not in m._repr_html_()


def test_throttling_since_and_events() -> None:
    clock = FakeClock(100.0)
    feed = ScriptedFeed(
        clock,
        events=lambda n: {"gpu0": ("sw_power_cap",)} if 3 <= n <= 5 else {},
    )
    m = Monitor(feed, interval=1.0, start=False, clock=clock)
    for n in range(1, 8):
        m.tick()
        if n == 4:
            assert m.throttled_since()["gpu0"].since == 102.0
        clock.advance(1.0)
    (event,) = m.throttle_events()
    assert (event.reasons, event.since, event.until, event.duration_s) == (
        ("sw_power_cap",),
        102.0,
        105.0,
        3.0,
    )
    assert m.throttled_since() == {}


def test_invalid_interval_is_a_user_error() -> None:
    with pytest.raises(GpuDiagError, match="interval"):
        Monitor(ScriptedFeed(FakeClock(1000.0)), interval=0, start=False)


# -- every way sampling ends -----------------------------------------------------------------------


def test_stop_is_idempotent_and_closes_the_feed_once() -> None:
    feed = ScriptedFeed(time.time)
    m = Monitor(feed, interval=0.01)
    wait_for(lambda: feed.reads >= 3)
    m.stop()
    m.stop()
    assert feed.closed == 1
    assert m.state == "stopped"
    assert not m.running
    assert active() is None
    reads = feed.reads
    time.sleep(0.05)
    assert feed.reads == reads  # nothing samples after stop()


def test_starting_another_monitor_replaces_the_running_one() -> None:
    first_feed, second_feed = ScriptedFeed(time.time), ScriptedFeed(time.time)
    first = Monitor(first_feed, interval=0.01)
    second = Monitor(second_feed, interval=0.01)
    assert first.state == "stopped"
    assert first_feed.closed == 1
    assert active() is second
    assert second.running
    assert sum(t.name == "gpudiag-monitor" for t in threading.enumerate()) == 1


def test_an_exception_in_the_sampler_stops_it_and_says_why() -> None:
    feed = ScriptedFeed(time.time, fail_at=3)
    m = Monitor(feed, interval=0.01)
    wait_for(lambda: m.state == "error")
    assert m.error == "RuntimeError: sensor exploded at read 3"
    assert feed.closed == 1
    assert active() is None
    m.stop()  # still harmless
    assert feed.closed == 1


def test_a_recording_that_ends_finishes_the_monitor() -> None:
    feed = ScriptedFeed(time.time, finish_at=2)
    m = Monitor(feed, interval=0.01)
    wait_for(lambda: m.state == "finished")
    assert feed.closed == 1


def test_the_exit_hook_stops_the_running_monitor() -> None:
    feed = ScriptedFeed(time.time)
    m = Monitor(feed, interval=0.01)
    assert monitor_module._ATEXIT_REGISTERED
    monitor_module._stop_at_exit()
    assert m.state == "stopped"
    assert feed.closed == 1


def test_listeners_hear_ticks_and_the_stop() -> None:
    clock = FakeClock(1000.0)
    m = Monitor(ScriptedFeed(clock), interval=1.0, start=False, clock=clock)
    heard: list[str] = []
    unsubscribe = m.subscribe(lambda _m, event: heard.append(event))
    m.tick()
    m.tick()
    m.stop()
    unsubscribe()
    m.stop()
    assert heard == ["tick", "tick", "stopped"]


def test_a_failing_listener_does_not_stop_sampling() -> None:
    clock = FakeClock(1000.0)
    m = Monitor(ScriptedFeed(clock), interval=1.0, start=False, clock=clock)

    def broken(_m: Monitor, _event: str) -> None:
        raise ValueError("view gone")

    m.subscribe(broken)
    m.tick()
    m.tick()
    assert m.stats()["ticks"] == 2.0


def test_a_stopped_monitor_cannot_restart() -> None:
    m = Monitor(ScriptedFeed(FakeClock(1000.0)), interval=1.0, start=False)
    m.stop()
    with pytest.raises(GpuDiagError, match=r"gd\.monitor"):
        m.start()


def test_format_value_scales_units() -> None:
    assert format_value(1.5 * (1 << 30), "B") == "1.50 GiB"
    assert format_value(2.5e9, "B/s") == "2.50 GB/s"
    assert format_value(42.123, "%") == "42.1 %"
    assert format_value(math.nan, "W") == "N/A"
