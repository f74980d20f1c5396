"""The monitor widget against a mock comm that records every message the kernel would send."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import comm
import numpy as np
import pytest
from comm.base_comm import BaseComm

from gpudiag.monitoring import Monitor, stop
from gpudiag.monitoring.metrics import DeviceSpec, SeriesKey
from gpudiag.probe.readings import Status
from gpudiag.ui import monitor as ui
from gpudiag.ui.monitor import MonitorChart, MonitorView, widget_asset
from tests.fakes.clock import FakeClock
from tests.fakes.monitor_feeds import ScriptedFeed


class RecordingComm(BaseComm):
    """A comm that keeps what it would publish: (msg_type, data, buffers)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.messages: list[tuple[str, Any, list[bytes]]] = []
        super().__init__(*args, **kwargs)

    def publish_msg(
        self,
        msg_type: str,
        data: Any = None,
        metadata: Any = None,
        buffers: Any = None,
        **keys: Any,
    ) -> None:
        self.messages.append((msg_type, data, [bytes(b) for b in buffers or []]))


@pytest.fixture
def comms(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[RecordingComm]]:
    """Every comm the test opens; fails the test if one is still open at the end."""
    opened: list[RecordingComm] = []

    def create(*args: Any, **kwargs: Any) -> RecordingComm:
        c = RecordingComm(*args, **kwargs)
        opened.append(c)
        return c

    monkeypatch.setattr(comm, "create_comm", create)
    yield opened
    stop()
    leaked = [c for c in opened if not c._closed]
    names = [c.messages[0][1]["state"].get("_model_name") for c in leaked if c.messages]
    assert not leaked, f"{len(leaked)} comm(s) left open: {names}"
    assert not [t for t in threading.enumerate() if t.name == "gpudiag-monitor"]


def rows_messages(c: RecordingComm) -> list[tuple[dict[str, Any], np.ndarray, np.ndarray]]:
    out = []
    for msg_type, data, buffers in c.messages:
        if msg_type != "comm_msg" or data.get("method") != "custom":
            continue
        content = data["content"]
        if content.get("type") not in {"rows", "reset"}:
            continue
        t = np.frombuffer(buffers[0], dtype="<f8")
        v = np.frombuffer(buffers[1], dtype="<f4").reshape(content["n"], content["width"])
        out.append((content, t, v))
    return out


def chart_comm(chart: MonitorChart, comms: list[RecordingComm]) -> RecordingComm:
    return next(c for c in comms if c is chart.comm)


def make_monitor(clock: FakeClock, **feed_kwargs: Any) -> Monitor:
    return Monitor(ScriptedFeed(clock, **feed_kwargs), interval=1.0, start=False, clock=clock)


def test_each_update_sends_only_the_new_rows(comms: list[RecordingComm]) -> None:
    clock = FakeClock(1_700_000_000.0)
    m = make_monitor(clock)
    chart = MonitorChart(m, push_interval_s=0.0)
    c = chart_comm(chart, comms)
    for _ in range(5):
        m.tick()
        clock.advance(1.0)
    sent = rows_messages(c)
    assert [(msg["seq"], msg["n"]) for msg, _, _ in sent] == [(i, 1) for i in range(5)]
    assert [float(v[0, 0]) for _, _, v in sent] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert [float(t[0]) for _, t, _ in sent] == [1_700_000_000.0 + i for i in range(5)]
    chart.close()


def test_throttled_pushes_batch_the_rows_in_between(comms: list[RecordingComm]) -> None:
    clock = FakeClock(1000.0)
    m = make_monitor(clock)
    chart = MonitorChart(m, push_interval_s=3600.0)
    c = chart_comm(chart, comms)
    m.tick()  # the first row goes out at once
    for _ in range(6):
        m.tick()  # the next ones wait for the push interval
    assert len(rows_messages(c)) == 1
    chart.push(force=True)
    first, (msg, _t, v) = rows_messages(c)
    assert (first[0]["seq"], first[0]["n"]) == (0, 1)
    assert (msg["seq"], msg["n"]) == (1, 6)
    assert v[:, 0].tolist() == [2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    assert chart.push(force=True) == 0  # nothing new, nothing sent
    chart.close()


def test_bytes_per_update_do_not_grow_with_the_window(comms: list[RecordingComm]) -> None:
    clock = FakeClock(1000.0)
    m = make_monitor(clock)
    chart = MonitorChart(m, push_interval_s=3600.0)
    c = chart_comm(chart, comms)
    payloads, sizes = [], []
    for _ in range(3):
        for _ in range(500):
            m.tick()
        chart.push(force=True)  # flush the 500
        m.tick()
        sizes.append(chart.push(force=True))  # then one new row
        _, t, v = rows_messages(c)[-1]
        payloads.append(t.nbytes + v.nbytes)
    assert payloads == [8 + 2 * 4] * 3  # one float64 time, two float32 values
    # Only the sequence number in the header gains digits (500 -> 1502).
    assert max(sizes) - min(sizes) <= 1
    chart.close()


def test_hello_from_a_new_browser_gets_the_window_once(comms: list[RecordingComm]) -> None:
    clock = FakeClock(1000.0)
    m = make_monitor(clock)
    chart = MonitorChart(m, push_interval_s=0.0)
    chart.window_s = 30.0
    c = chart_comm(chart, comms)
    for _ in range(100):
        m.tick()
    before = len(rows_messages(c))
    chart._on_browser_msg(chart, {"type": "hello"}, [])
    msg, _, _ = rows_messages(c)[before]
    assert msg["type"] == "reset"
    assert msg["n"] == 32  # the 30 s window at 1 s, plus two rows of margin
    assert msg["seq"] == 68
    m.tick()
    assert rows_messages(c)[-1][0]["seq"] == 100  # live rows carry on after the backfill
    chart._on_browser_msg(chart, {"kind": "anywidget-command"}, [])  # not ours: ignored
    assert len(rows_messages(c)) == before + 2
    chart.close()


def test_pause_holds_rows_and_resume_sends_only_the_missed_ones(
    comms: list[RecordingComm],
) -> None:
    clock = FakeClock(1000.0)
    m = make_monitor(clock)
    chart = MonitorChart(m, push_interval_s=0.0)
    c = chart_comm(chart, comms)
    m.tick()
    chart.paused = True
    for _ in range(3):
        m.tick()
    assert len(rows_messages(c)) == 1
    chart.paused = False
    msg, _, v = rows_messages(c)[-1]
    assert (msg["seq"], msg["n"]) == (1, 3)
    assert v[:, 0].tolist() == [2.0, 3.0, 4.0]
    chart.close()


def test_status_carries_na_reasons_throttling_and_state(comms: list[RecordingComm]) -> None:
    clock = FakeClock(50.0)
    m = make_monitor(
        clock,
        values=lambda n: [float(n), float("nan")],
        na=lambda n: {1: (Status.NO_PERMISSION, "needs root")},
        events=lambda n: {"gpu0": ("hw_thermal_slowdown",)},
    )
    chart = MonitorChart(m, push_interval_s=0.0)
    m.tick()
    assert chart.status["na"] == {"1": "needs root"}
    assert chart.status["throttled"] == {
        "gpu0": {"since": 50.0, "reasons": ["hw_thermal_slowdown"]}
    }
    m.stop()
    assert chart.state == "stopped"
    assert chart.status["throttled"] == {}
    chart.close()


def test_tiles_group_lanes_of_one_metric() -> None:
    class Cores(ScriptedFeed):
        def __init__(self) -> None:
            super().__init__(FakeClock(1000.0), width=2)
            self.devices = (DeviceSpec("host", "host", kind="host"),)
            self.series = (
                SeriesKey("host", "cpu_core_util_pct", "0"),
                SeriesKey("host", "cpu_core_util_pct", "1"),
            )

    m = Monitor(Cores(), interval=1.0, start=False)
    (tile,) = ui._tiles(ui.projection_for(m))
    assert (tile["metric"], tile["series"], tile["lanes"]) == (
        "cpu_core_util_pct",
        [0, 1],
        ["0", "1"],
    )
    assert tile["scale_max"] == 100.0
    assert ui._default_metrics(m) == ["cpu_core_util_pct"]


def test_closing_the_view_stops_the_monitor_and_every_comm(comms: list[RecordingComm]) -> None:
    m = Monitor(ScriptedFeed(FakeClock(1000.0)), interval=0.01)
    view = m.view()
    assert isinstance(view, MonitorView)
    assert len(comms) > 5  # the chart, the bar's controls, boxes and their layouts
    m.close()
    assert m.state == "stopped"
    # The fixture asserts that none of the comms is still open.


def test_the_stop_button_stops_sampling_but_keeps_the_chart(comms: list[RecordingComm]) -> None:
    m = Monitor(ScriptedFeed(FakeClock(1000.0)), interval=0.01)
    view = MonitorView(m)
    view.stop_button.click()
    assert m.state == "stopped"
    assert view.stop_button.disabled
    assert view.chart.comm is not None  # still on screen with its data
    view.close()


def test_controls_drive_the_chart(comms: list[RecordingComm]) -> None:
    clock = FakeClock(1000.0)
    m = Monitor(ScriptedFeed(clock, width=4), interval=1.0, start=False, clock=clock)
    view = MonitorView(m)
    view.metrics.value = ("power_w",)
    assert view.chart.selected == ["power_w"]
    view.window.value = 300.0
    assert view.chart.window_s == 300.0
    view.pause.value = True
    assert view.chart.paused
    assert view.pause.description == "resume"
    view.close()


def test_assets_come_from_the_wheel_first(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert "export default" in widget_asset("monitor.js")
    assert ".gpudiag-monitor" in widget_asset("monitor.css")
    packaged = tmp_path / "gpudiag"
    (packaged / "_widgets").mkdir(parents=True)
    (packaged / "_widgets" / "monitor.js").write_text("// packaged copy")
    monkeypatch.setattr(ui.resources, "files", lambda _pkg: packaged)
    assert widget_asset("monitor.js") == "// packaged copy"
    with pytest.raises(ui.GpuDiagError, match="reinstall gpudiag"):
        widget_asset("absent.js")
