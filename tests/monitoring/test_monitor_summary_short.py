"""The monitor summary on the shipped demo recording is short: values only, N/A grouped once,
people's labels, flags as yes/no."""

from __future__ import annotations

import re

from gpudiag.data import recording
from gpudiag.monitoring import Monitor, MonitorSummary
from gpudiag.monitoring.feeds import DEMO_SESSION, ReplayFeed
from gpudiag.monitoring.metrics import metric_label
from gpudiag.probe.session_replay import SessionReplay
from tests.fakes.clock import FakeClock


def _demo_summary(devices: list[str] | None = None, ticks: int = 3) -> MonitorSummary:
    clock = FakeClock(0.0)
    replay = SessionReplay.from_file(recording(DEMO_SESSION), clock=clock)
    feed = ReplayFeed(replay, devices=devices)
    m = Monitor(feed, interval=1.0, start=False)
    for _ in range(ticks):
        m.tick()
        clock.advance(1.0)
    return m.summary()


def test_labels_are_for_people() -> None:
    assert metric_label("cpu_util_pct") == "CPU utilization (%)"
    assert metric_label("memory_used_bytes", "B") == "Memory used"  # values carry GiB/MiB
    assert metric_label("cpu_core_util_pct", "%", "cpu3") == "CPU per core (%) [cpu3]"
    assert metric_label("throttled") == "Clocks throttled"


def test_the_demo_summary_is_one_row_per_metric_with_na_grouped_once() -> None:
    summary = _demo_summary()
    text = repr(summary)
    lines = text.splitlines()
    # Five recorded GPUs x 21 metrics used to be 105 rows, mostly N/A.
    assert len(summary.rows) > 100
    assert len(lines) < 35
    table = lines[1 : 1 + len({r.metric for r in summary.valued_rows()}) + 1]
    assert all("N/A" not in line for line in table)
    # No metric ids, people's labels instead.
    assert not re.search(r"\b[a-z]+_[a-z_]+_(pct|bytes|mhz|w|c)\b", text)
    assert "GPU utilization (%)" in text
    # Each N/A reason once (five devices share two reasons of nvidia-smi -q -x and DCGM).
    assert text.count("nvidia-smi -q -x has no activity counters") == 1
    assert text.count("default counter list leaves it out") == 1
    group = next(g for g in summary.not_recorded() if "nvidia-smi -q -x" in g[0])
    assert "SM active" in group[1]
    assert set(group[2]) == {"rtx-3080 box/gpu0", "rtx-3090 box/gpu0"}
    # The 3090 was throttled (sw_power_cap) in its recording, the 3080 was not: yes / no.
    throttled = next(line for line in lines if line.startswith("Clocks throttled"))
    assert throttled.split()[2:4] == ["no", "yes"]


def test_one_device_shows_percentiles_and_html_matches() -> None:
    summary = _demo_summary(devices=["rtx-3090 box/gpu0"])
    text = repr(summary)
    assert text.splitlines()[1].split() == ["metric", "p5", "p50", "p95", "max", "last", "note"]
    throttled = next(line for line in text.splitlines() if line.startswith("Clocks throttled"))
    assert throttled.split()[2:] == ["yes"] * 5
    html = summary._repr_html_()
    assert "Power (W)" in html
    assert "power_w" not in html
    assert html.count("has no activity counters") == 1
