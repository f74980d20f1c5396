"""gpudiag.probe.capture: nvidia-smi run as a program (a stand-in script on PATH plays the
recorded H200's output, a failure and a hang) and the CUDA memory snapshot without CUDA."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gpudiag.probe.capture import cuda_memory_snapshot, nvidia_smi
from gpudiag.probe.readings import Status
from gpudiag.probe.smi_text import parse_smi_text
from tests.conftest import FIXTURES


def _tool(folder: Path, body: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An `nvidia-smi` script first on PATH (the shell tools it calls stay reachable)."""
    script = folder / "nvidia-smi"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ.get('PATH', '')}")


def test_output_is_kept_as_printed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recorded = FIXTURES / "nvidia-smi-text" / "h200.nvidia-smi-q.txt"
    _tool(tmp_path, f'[ "$1" = "-q" ] && exec cat "{recorded}"\nexit 2\n', monkeypatch)
    reading = nvidia_smi("-q")
    assert reading.ok
    assert reading.value == recorded.read_text()
    assert parse_smi_text(reading.value).infos[0].name.value == "NVIDIA H200"


def test_a_failing_tool_is_na_with_its_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    message = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    _tool(tmp_path, f'echo "{message}" >&2\nexit 9\n', monkeypatch)
    reading = nvidia_smi("-q", "-x")
    assert reading.status is Status.UNKNOWN
    assert reading.reason == f"`nvidia-smi -q -x` failed: {message}"


def test_a_hanging_tool_times_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _tool(tmp_path, "exec sleep 30\n", monkeypatch)
    reading = nvidia_smi("topo", "-m", timeout_s=0.5)
    assert reading.status is Status.UNKNOWN
    assert "did not answer within 0.5 s" in reading.reason


def test_missing_tool_is_not_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    reading = nvidia_smi()
    assert reading.status is Status.NOT_FOUND
    assert "not on PATH" in reading.reason


def test_memory_snapshot_without_cuda_says_so(tmp_path: Path) -> None:
    from gpudiag.probe import cuda

    if cuda.available():
        pytest.skip("CUDA is available: tests/gpu covers the snapshot")
    calls: list[int] = []
    reading = cuda_memory_snapshot(tmp_path / "s.pickle", lambda: calls.append(1))
    assert reading.status is Status.NOT_FOUND
    assert "needs a CUDA GPU" in reading.reason
    assert calls == []  # the workload is not run for nothing
    assert not (tmp_path / "s.pickle").exists()
