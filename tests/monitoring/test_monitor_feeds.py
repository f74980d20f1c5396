"""Feeds: GPU metrics and derived ones from a backend, the host mode, and choosing a feed."""

from __future__ import annotations

import math
from pathlib import Path

import psutil
import pytest

from gpudiag.errors import GpuDiagError
from gpudiag.monitoring import Monitor
from gpudiag.monitoring.derived import normalize_reason, peak_memory_bandwidth, throttle_reasons
from gpudiag.monitoring.feeds import (
    GPU_METRICS,
    GpuFeed,
    HostFeed,
    NoCounters,
    ReplayFeed,
    build_feed,
    select_devices,
)
from gpudiag.probe.backend import NullBackend
from gpudiag.probe.dcgm import PROFILING_PERMISSION_FIX, ActivityCounters
from gpudiag.probe.model import GpuInfo, GpuState
from gpudiag.probe.readings import Status, na, ok
from tests.fakes.clock import FakeClock
from tests.fakes.monitor_feeds import ScriptedBackend, a100_info

GIB = 1 << 30


class FixedCounters:
    label = "fixed"

    def __init__(self, *counters: ActivityCounters) -> None:
        self.counters = counters
        self.closed = 0

    def read(self) -> tuple[ActivityCounters, ...]:
        return self.counters

    def close(self) -> None:
        self.closed += 1


def busy_state(**overrides: object) -> GpuState:
    fields: dict[str, object] = {
        "gpu_util_pct": ok(97.0),
        "memory_util_pct": ok(40.0),
        "memory_used_bytes": ok(60 * GIB),
        "sm_clock_mhz": ok(1410),
        "memory_clock_mhz": ok(1593),
        "power_w": ok(300.0),
        "temperature_c": ok(65.0),
        "clock_event_reasons": ok(("gpu_idle",)),
        "pcie_rx_bytes_per_s": ok(1.0e9),
        "pcie_tx_bytes_per_s": ok(2.0e8),
    }
    fields.update(overrides)
    return GpuState(**fields)  # type: ignore[arg-type]


def read_one(feed: GpuFeed) -> dict[str, float]:
    frame = feed.read()
    return {s.metric: float(v) for s, v in zip(feed.series, frame.values, strict=True)}


def test_peak_bandwidth_from_nvml_facts_when_not_in_the_spec_table() -> None:
    gbps, source = peak_memory_bandwidth(a100_info())
    # 1593 MHz x 5120 bit x 2 (double data rate) / 8 = 2039.04 GB/s, the A100 80GB figure.
    assert gbps == pytest.approx(2039.04)
    assert "bus width" in source


def test_peak_bandwidth_unknown_is_said() -> None:
    gbps, source = peak_memory_bandwidth(GpuInfo(index=0, name=ok("Mystery board")))
    assert gbps is None
    assert "unknown" in source


def test_gpu_metrics_and_derived_values() -> None:
    backend = ScriptedBackend(infos=(a100_info(),), states=[(busy_state(),)])
    feed = GpuFeed(backend, counters=NoCounters(1, "no counters here"), clock=FakeClock(1000.0))
    values = read_one(feed)
    assert values["gpu_util_pct"] == 97.0
    assert values["memory_used_bytes"] == 60 * GIB
    assert values["memory_used_pct"] == 75.0
    assert values["power_pct_of_limit"] == 75.0
    assert values["throttled"] == 0.0
    # Without DRAM-active, the estimate is memory-controller utilization x peak: labelled rough.
    assert values["memory_bandwidth_pct_of_peak"] == 40.0
    assert values["memory_bandwidth_gbps"] == pytest.approx(0.4 * 2039.04)
    frame = feed.read()
    note = frame.notes[GPU_METRICS.index("memory_bandwidth_gbps")]
    assert "rough" in note
    assert frame.na[GPU_METRICS.index("sm_active_pct")] == (
        Status.NOT_AVAILABLE,
        "no counters here",
    )


def test_dram_active_gives_the_bandwidth_estimate() -> None:
    backend = ScriptedBackend(infos=(a100_info(),), states=[(busy_state(),)])
    counters = FixedCounters(
        ActivityCounters(
            sm_active_pct=ok(88.0),
            sm_occupancy_pct=ok(41.0),
            tensor_active_pct=ok(55.0),
            dram_active_pct=ok(50.0),
        )
    )
    feed = GpuFeed(backend, counters=counters, clock=FakeClock(1000.0))
    frame = feed.read()
    values = {s.metric: float(v) for s, v in zip(feed.series, frame.values, strict=True)}
    assert values["tensor_active_pct"] == 55.0
    assert values["memory_bandwidth_gbps"] == pytest.approx(1019.52)
    assert frame.notes[GPU_METRICS.index("memory_bandwidth_gbps")] == "DRAM active x peak"


def test_counters_without_permission_are_na_with_the_fix_and_the_rest_carries_on() -> None:
    backend = ScriptedBackend(infos=(a100_info(),), states=[(busy_state(),)])
    denied = ActivityCounters.unavailable(Status.NO_PERMISSION, PROFILING_PERMISSION_FIX, "dcgm")
    feed = GpuFeed(backend, counters=FixedCounters(denied), clock=FakeClock(1000.0))
    m = Monitor(feed, interval=1.0, start=False)
    m.tick()
    reasons = {s.metric: r for s, r in m.na_reasons().items()}
    status, reason = reasons["sm_active_pct"]
    assert status is Status.NO_PERMISSION
    assert "NVreg_RestrictProfilingToAdminUsers" in reason
    assert "ERR_NVGPUCTRPERM" in reason
    assert m.samples()[("gpu0", "gpu_util_pct")].iloc[-1] == 97.0


def test_nvlink_rate_from_cumulative_counters() -> None:
    clock = FakeClock(0.0)
    states = [
        (busy_state(nvlink_rx_bytes=ok(1000), nvlink_tx_bytes=ok(500)),),
        (busy_state(nvlink_rx_bytes=ok(3000), nvlink_tx_bytes=ok(900)),),
        (busy_state(nvlink_rx_bytes=ok(100), nvlink_tx_bytes=ok(1000)),),  # rx counter reset
    ]
    feed = GpuFeed(
        ScriptedBackend(infos=(a100_info(),), states=states),
        counters=NoCounters(1, "none"),
        clock=clock,
    )
    rx = GPU_METRICS.index("nvlink_rx_bytes_per_s")
    tx = GPU_METRICS.index("nvlink_tx_bytes_per_s")
    first = feed.read()
    assert first.na[rx] == (Status.NOT_AVAILABLE, "a rate needs two samples")
    clock.advance(2.0)
    second = feed.read()
    assert (second.values[rx], second.values[tx]) == (1000.0, 200.0)
    clock.advance(1.0)
    third = feed.read()
    assert third.na[rx] == (Status.NOT_AVAILABLE, "NVLink counters were reset")
    assert third.values[tx] == 100.0


def test_throttling_is_flagged_with_its_reasons() -> None:
    state = busy_state(clock_event_reasons=ok(("sw_power_cap", "hw_thermal_slowdown")))
    feed = GpuFeed(
        ScriptedBackend(infos=(a100_info(),), states=[(state,)]),
        counters=NoCounters(1, "none"),
        clock=FakeClock(1000.0),
    )
    frame = feed.read()
    assert frame.values[GPU_METRICS.index("throttled")] == 1.0
    assert frame.events == {"gpu0": ("sw_power_cap", "hw_thermal_slowdown")}


def test_reason_names_are_normalised() -> None:
    assert normalize_reason("clocks_event_reason_sw_power_cap") == "sw_power_cap"
    assert throttle_reasons(["gpu_idle", "applications_clocks_setting"]) == ()
    assert throttle_reasons(["SW Power Cap"]) == ("sw_power_cap",)


def test_a_missing_reading_keeps_its_reason() -> None:
    lost = na(Status.GPU_LOST, "GPU is lost: check dmesg for Xid 79", "nvml")
    state = busy_state(power_w=lost)
    feed = GpuFeed(
        ScriptedBackend(infos=(a100_info(),), states=[(state,)]),
        counters=NoCounters(1, "none"),
        clock=FakeClock(1000.0),
    )
    frame = feed.read()
    assert frame.na[GPU_METRICS.index("power_w")] == (Status.GPU_LOST, lost.reason)
    # The derived ratio says why too, rather than a bare N/A.
    assert frame.na[GPU_METRICS.index("power_pct_of_limit")] == (Status.GPU_LOST, lost.reason)


def test_select_devices_by_index_and_uuid_prefix() -> None:
    infos = (a100_info(0, "GPU-aaaa-1"), a100_info(1, "GPU-bbbb-2"), a100_info(2, "GPU-cccc-3"))
    assert select_devices(infos, None) == [0, 1, 2]
    assert select_devices(infos, [2, "GPU-bbbb"]) == [2, 1]
    with pytest.raises(GpuDiagError, match="pass NVML indices or UUIDs"):
        select_devices(infos, [7])


def test_only_the_chosen_devices_are_recorded() -> None:
    infos = (a100_info(0, "GPU-aaaa-1"), a100_info(1, "GPU-bbbb-2"))
    states = [(busy_state(gpu_util_pct=ok(10.0)), busy_state(gpu_util_pct=ok(90.0)))]
    feed = GpuFeed(
        ScriptedBackend(infos=infos, states=states),
        counters=NoCounters(2, "none"),
        devices=[1],
        clock=FakeClock(1000.0),
    )
    assert [d.id for d in feed.devices] == ["gpu1"]
    assert read_one(feed)["gpu_util_pct"] == 90.0


def test_host_feed_has_one_lane_per_core() -> None:
    feed = HostFeed()
    lanes = [s for s in feed.series if s.metric == "cpu_core_util_pct"]
    assert len(lanes) == psutil.cpu_count(logical=True)
    frame = feed.read()
    assert not frame.na
    assert all(math.isfinite(v) for v in frame.values)
    rss = frame.values[[s.metric for s in feed.series].index("process_rss_bytes")]
    assert rss == pytest.approx(psutil.Process().memory_info().rss, rel=0.5)


def test_no_gpu_means_the_host_with_the_reason() -> None:
    feed = build_feed(backend=NullBackend("no NVIDIA GPU: NVML library not found"))
    assert isinstance(feed, HostFeed)
    assert feed.notes[0].startswith("no NVIDIA GPU: NVML library not found")
    feed.close()


def test_replay_demo_and_nvidia_smi_dumps(fixtures_dir: Path) -> None:
    demo = build_feed(replay="demo")
    assert isinstance(demo, ReplayFeed)
    assert demo.is_recording
    xml = fixtures_dir / "nvidia-smi-xml" / "tesla-t4.xml"
    smi = build_feed(replay=xml)
    assert isinstance(smi, GpuFeed)
    assert smi.is_recording
    frame = smi.read()
    sm_active = GPU_METRICS.index("sm_active_pct")
    assert "no activity counters" in frame.na[sm_active][1]


def test_unknown_replay_name_is_a_user_error() -> None:
    with pytest.raises(GpuDiagError, match="no recording 'nope'"):
        build_feed(replay="nope")


def test_closing_the_feed_closes_backend_and_counters() -> None:
    backend = ScriptedBackend(infos=(a100_info(),), states=[(busy_state(),)])
    counters = FixedCounters(ActivityCounters())
    GpuFeed(backend, counters=counters, clock=FakeClock(1000.0)).close()
    assert (backend.closed, counters.closed) == (1, 1)


def test_host_without_psutil_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from gpudiag.probe.host_sampler import HostSampler

    monkeypatch.setitem(sys.modules, "psutil", None)
    sample = HostSampler().sample()
    assert sample.cpu_util_pct.status is Status.NOT_FOUND
    assert "pip install psutil" in sample.process_rss_bytes.reason
