"""gpudiag.probe.runtime on the real torch of this machine, and on fake driver parameter files."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from gpudiag.probe.runtime import profiling_permission, runtime_state, torch_switches

# The shape of /proc/driver/nvidia/params (one "Name: value" per line, many parameters).
PARAMS = """ResmanDebugLevel: 4294967295
RmLogonRC: 1
ModifyDeviceFiles: 1
DeviceFileUID: 0
EnableMSI: 1
RmProfilingAdminOnly: {value}
EnableStreamMemOPs: 0
"""


@pytest.fixture
def restore_switches() -> Iterator[None]:
    """Put every switch a test flips back the way it was, whatever the test did."""
    backends = torch.backends
    saved = (
        torch.is_anomaly_enabled(),
        backends.cudnn.benchmark,
        backends.cudnn.deterministic,
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        backends.cuda.flash_sdp_enabled(),
        backends.cuda.mem_efficient_sdp_enabled(),
        torch.get_float32_matmul_precision(),
        backends.cuda.matmul.fp32_precision,
        torch.get_num_threads(),
    )
    try:
        yield
    finally:
        torch.autograd.set_detect_anomaly(saved[0])
        backends.cudnn.benchmark = saved[1]
        backends.cudnn.deterministic = saved[2]
        torch.use_deterministic_algorithms(saved[3], warn_only=saved[4])
        backends.cuda.enable_flash_sdp(saved[5])
        backends.cuda.enable_mem_efficient_sdp(saved[6])
        # The legacy precision first: it also sets the newer per-backend value, which follows.
        torch.set_float32_matmul_precision(saved[7])
        backends.cuda.matmul.fp32_precision = saved[8]
        torch.set_num_threads(saved[9])


def test_defaults_are_read_and_json_safe() -> None:
    switches = torch_switches()
    json.dumps(switches)
    assert switches["pid"] == os.getpid()
    assert switches["torch_version"] == torch.__version__
    assert switches["num_threads"] == torch.get_num_threads()
    assert switches["cpu_affinity"] == len(os.sched_getaffinity(0))
    assert switches["anomaly_detection"] is torch.is_anomaly_enabled()
    assert switches["float32_matmul_precision"] == torch.get_float32_matmul_precision()
    assert "unreadable" not in switches


def test_flipped_switches_show_up(restore_switches: None) -> None:
    backends = torch.backends
    torch.autograd.set_detect_anomaly(True)
    backends.cudnn.benchmark = not backends.cudnn.benchmark
    backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True, warn_only=True)
    backends.cuda.enable_flash_sdp(False)
    backends.cuda.enable_mem_efficient_sdp(False)
    torch.set_float32_matmul_precision("high")
    torch.set_num_threads(1)
    switches = torch_switches()
    assert switches["anomaly_detection"] is True
    assert switches["cudnn_benchmark"] is backends.cudnn.benchmark
    assert switches["cudnn_deterministic"] is True
    assert switches["deterministic_algorithms"] is True
    assert switches["deterministic_warn_only"] is True
    assert (switches["sdp_flash"], switches["sdp_mem_efficient"]) == (False, False)
    assert switches["sdp_math"] is True
    assert switches["float32_matmul_precision"] == "high"
    assert switches["matmul_allow_tf32"] is True  # the legacy flag follows the precision
    assert switches["matmul_fp32_precision"] == "tf32"
    assert switches["num_threads"] == 1


def test_mixed_tf32_apis_leave_the_key_out_with_a_reason(restore_switches: None) -> None:
    # torch refuses to answer the legacy questions once the newer per-backend API was used.
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    switches = torch_switches()
    assert switches["matmul_fp32_precision"] == "tf32"
    assert "float32_matmul_precision" not in switches
    assert "matmul_allow_tf32" not in switches
    assert switches["unreadable"]["float32_matmul_precision"].startswith("RuntimeError")
    json.dumps(switches)


def test_missing_api_is_absent_not_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(torch, "is_anomaly_enabled")
    monkeypatch.delattr(torch.backends.cuda, "cudnn_sdp_enabled")
    switches = torch_switches()
    assert "anomaly_detection" not in switches
    assert "sdp_cudnn" not in switches
    assert "unreadable" not in switches
    assert switches["sdp_flash"] is torch.backends.cuda.flash_sdp_enabled()


def test_without_torch_switches_are_empty(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    assert torch_switches() == {}
    params = tmp_path / "params"
    params.write_text(PARAMS.format(value=1))
    state = runtime_state(params)
    assert state["profiling_admin_only"] is True
    assert "num_threads" not in state


@pytest.mark.parametrize(("value", "admin_only"), [("1", True), ("0", False)])
def test_profiling_admin_only_from_params(tmp_path: Path, value: str, admin_only: bool) -> None:
    params = tmp_path / "params"
    params.write_text(PARAMS.format(value=value))
    found = profiling_permission(params)
    assert found["profiling_admin_only"] is admin_only
    assert found["euid"] == os.geteuid()
    assert found["profiling_params_path"] == str(params)
    assert "profiling_unknown" not in found


def test_profiling_unknown_says_why(tmp_path: Path) -> None:
    missing = profiling_permission(tmp_path / "nope")
    assert "profiling_admin_only" not in missing
    assert "does not exist" in missing["profiling_unknown"]
    params = tmp_path / "params"
    params.write_text("RmLogonRC: 1\nEnableMSI: 1\n")
    no_entry = profiling_permission(params)
    assert "profiling_admin_only" not in no_entry
    assert "no RmProfilingAdminOnly entry" in no_entry["profiling_unknown"]
    unreadable = profiling_permission(tmp_path)  # a folder, not a file
    assert "cannot read" in unreadable["profiling_unknown"]


def test_runtime_state_merges_both(tmp_path: Path) -> None:
    params = tmp_path / "params"
    params.write_text(PARAMS.format(value=0))
    state = runtime_state(params)
    assert state["profiling_admin_only"] is False
    assert state["num_threads"] == torch.get_num_threads()
    json.dumps(state)
