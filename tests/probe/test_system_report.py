"""SystemReport: text, escaped HTML, JSON snapshots that replay, and bad recordings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpudiag.errors import ReplayError
from gpudiag.probe.backend import NullBackend
from gpudiag.probe.model import HostInfo
from gpudiag.probe.readings import ok
from gpudiag.probe.replay import ReplayBackend
from gpudiag.probe.system import SystemReport, inspect
from tests.conftest import FIXTURES

A100 = FIXTURES / "nvidia-smi-xml" / "a100-sxm4-v12.xml"


def test_recording_is_labelled() -> None:
    report = inspect(replay=A100)
    assert report.is_recording
    assert "RECORDING" in str(report)
    assert "a100-sxm4-v12.xml" in str(report)
    assert "RECORDING" in report._repr_html_()
    assert report.to_dict()["source"] == "recording"


def test_snapshot_round_trip(tmp_path: Path) -> None:
    report = inspect(replay=A100)
    path = tmp_path / "machine.json"
    path.write_text(json.dumps(report.to_dict()))
    again = inspect(replay=path)
    assert again.is_recording
    assert again.gpus[0].info == report.gpus[0].info
    assert again.gpus[0].state.power_w == report.gpus[0].state.power_w
    assert again.gpus[0].state.gpu_util_pct == report.gpus[0].state.gpu_util_pct
    # a snapshot carries its host: the replayed host is the recorded one, not this machine
    assert again.host == report.host


def test_from_dict_round_trip() -> None:
    report = inspect(replay=FIXTURES / "nvidia-smi-xml" / "dual_a5000-v13.xml")
    again = SystemReport.from_dict(json.loads(json.dumps(report.to_dict())))
    assert [g.info for g in again.gpus] == [g.info for g in report.gpus]
    assert again.gpus[1].state.processes == report.gpus[1].state.processes


def test_html_escapes_every_string() -> None:
    evil = "<script>alert(1)</script>"
    host = HostInfo(cpu_model=ok(evil))
    report = inspect(backend=NullBackend(f"no NVIDIA GPU: {evil}"), host=host)
    html = report._repr_html_()
    assert "<script>" not in html
    assert "&lt;script&gt;" in html


def test_live_report_without_gpu_is_json_safe() -> None:
    report = inspect(backend=NullBackend("no NVIDIA GPU: NVML library not found"))
    data = json.loads(json.dumps(report.to_dict()))
    assert data["gpus"] == []
    assert data["gpu_count"]["status"] == "not_found"
    assert "NVML library not found" in report.no_gpu_reason


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"<nvidia_smi_log><gpu>", "not valid XML"),
        (b"<other/>", "not <nvidia_smi_log>"),
        (b"{not json", "not valid JSON"),
        (b'{"format": "something"}', "not a gpudiag snapshot"),
        (b'{"format": "gpudiag.snapshot", "version": 99}', "version 99"),
        (b'{"format": "gpudiag.snapshot", "version": 1, "gpus": [{"info": {}}]}', "malformed"),
        (b"hello", "neither"),
    ],
    ids=[
        "truncated_xml",
        "wrong_root",
        "bad_json",
        "not_snapshot",
        "future_version",
        "malformed",
        "text",
    ],
)
def test_bad_recordings_give_clear_errors(tmp_path: Path, content: bytes, words: str) -> None:
    path = tmp_path / "recording"
    path.write_bytes(content)
    with pytest.raises(ReplayError, match=words):
        ReplayBackend.from_file(path)


def test_missing_recording_file() -> None:
    with pytest.raises(ReplayError, match="cannot read"):
        inspect(replay="/nonexistent/machine.xml")


def test_replay_samples_are_stamped_now() -> None:
    backend = ReplayBackend.from_file(A100)
    first = backend.sample()[0].timestamp
    assert first > 1e9


def test_no_gpu_reason_is_said_once_in_html() -> None:
    reason = "no NVIDIA GPU: NVML library not found (libnvidia-ml.so.1)"
    report = inspect(backend=NullBackend(reason))
    html = report._repr_html_()
    assert html.count("NVML library not found") == 1
    assert "N/A: no GPU" in html


def test_a_recording_without_host_facts_does_not_show_this_machines() -> None:
    from gpudiag.probe.host import probe_host

    here = probe_host()
    report = inspect(replay=FIXTURES / "nvidia-smi-text" / "h200.nvidia-smi-q.txt")
    text = repr(report)
    assert "Host     not in the recording (nvidia-smi output holds only the GPUs)" in text
    assert "Torch" not in text
    assert here.cpu_model.get("unknown") not in text
    assert "not in the recording" in report._repr_html_()
    assert not report.host.logical_cores.ok
    # A table recording has no clocks: one N/A with its reason, not "?/? MHz".
    table = repr(inspect(replay=FIXTURES / "nvidia-smi-text" / "h200.nvidia-smi.txt"))
    assert "?/?" not in table
    assert "clocks N/A (not shown by the plain `nvidia-smi` table" in table
