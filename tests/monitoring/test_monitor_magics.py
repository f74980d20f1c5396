"""`%gpudiag monitor` and `%gpudiag stop` in a real in-process IPython shell."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from gpudiag.monitoring import Monitor, MonitorSummary, active, stop


@pytest.fixture
def ip(ipython_shell: Any) -> Any:
    return ipython_shell


@pytest.fixture(autouse=True)
def no_sampler_left() -> Iterator[None]:
    yield
    stop()
    assert not [t for t in threading.enumerate() if t.name == "gpudiag-monitor"]


def test_monitor_replay_then_stop_shows_the_summary(ip: Any) -> None:
    m = ip.run_line_magic("gpudiag", "monitor --replay demo --interval 0.05")
    assert isinstance(m, Monitor)
    assert m.running
    assert m.is_recording
    assert active() is m
    summary = ip.run_line_magic("gpudiag", "stop")
    assert isinstance(summary, MonitorSummary)
    assert m.state == "stopped"
    assert active() is None
    # Short: one row per metric that had a value (not 5 GPUs x every metric), N/A grouped.
    text = repr(summary)
    assert len(text.splitlines()) < 35
    assert "gpu_util_pct" not in text
    assert "GPU utilization (%)" in text


def test_rerunning_the_magic_replaces_the_monitor(ip: Any) -> None:
    first = ip.run_line_magic("gpudiag", "monitor --replay demo --interval 0.05")
    second = ip.run_line_magic("gpudiag", "monitor --replay demo --interval 0.05")
    assert first.state == "stopped"
    assert active() is second


def test_stop_without_a_monitor_says_so(ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert ip.run_line_magic("gpudiag", "stop") is None
    assert "no monitor is running" in capsys.readouterr().out


def test_help_explains_monitor_and_stop(ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_line_magic("gpudiag", "help")
    out = capsys.readouterr().out
    assert "monitor" in out
    assert "stop" in out
    ip.run_line_magic("gpudiag", "help monitor")
    assert "--replay" in capsys.readouterr().out


def test_bad_interval_is_printed_not_raised(ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert ip.run_line_magic("gpudiag", "monitor --replay demo --interval -1") is None
    assert "interval must be a positive number" in capsys.readouterr().out


def test_unknown_device_is_explained(ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.conftest import FIXTURES

    xml = FIXTURES / "nvidia-smi-xml" / "tesla-t4.xml"
    assert ip.run_line_magic("gpudiag", f"monitor --replay {xml} --devices 5") is None
    assert "no GPU 5 to monitor" in capsys.readouterr().out
