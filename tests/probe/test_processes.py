"""gd.processes: which process holds which GPU, from the NVML fake fed by real recordings."""

from __future__ import annotations

import os
from collections.abc import Sequence

import pynvml

import gpudiag as gd
from gpudiag.probe.backend import default_backend
from gpudiag.probe.nvml import NvmlSession
from gpudiag.probe.processes import (
    CONTAINER_REASON,
    HostProcess,
    gpu_processes,
    psutil_lookup,
)
from gpudiag.probe.readings import Status
from tests.conftest import FIXTURES
from tests.fakes.fake_nvml import FakeNvml

DUAL = FIXTURES / "nvidia-smi-xml" / "dual_a5000-v13.xml"  # llama-server holds both GPUs
RTX3080 = FIXTURES / "nvidia-smi-xml" / "rtx-3080-v12.xml"  # Xorg and desktop programs
DSTACK = FIXTURES / "nvidia-smi-text" / "h100-sxm-x8-dstack-after-loading.nvidia-smi.txt"
MIB = 1 << 20


def nvml(fake: FakeNvml):
    session = NvmlSession(fake)
    return default_backend(session), session


def in_a_container(pids: Sequence[int]) -> dict[int, HostProcess]:
    """What psutil says inside a container: none of the host's pids exists here."""
    return psutil_lookup([], 0.0) | {pid: _gone() for pid in pids}


def _gone() -> HostProcess:
    from gpudiag.probe.readings import na

    gone = na(Status.NOT_FOUND, CONTAINER_REASON, "psutil")
    return HostProcess(gone, gone, gone, gone)


def test_each_process_with_its_gpu_memory_on_each_gpu() -> None:
    backend, session = nvml(FakeNvml(DUAL))
    report = gpu_processes(backend, session=session, lookup=in_a_container)
    rows = [(r.gpu, r.pid, r.gpu_memory_bytes.value) for r in report.rows]
    assert rows == [(0, 100477, 22430 * MIB), (1, 100477, 17246 * MIB)]  # the recorded values
    assert report.gpus[0].listed_bytes == 22430 * MIB
    # idle GPUs: NVML has no utilization samples, which means 0 %, not N/A
    assert report.rows[0].sm_util_pct.value == 0.0
    text = repr(report)
    assert "llama-server" in text
    assert "21.90 GiB" in text
    assert "not a process of this PID namespace" in text  # the container hides pid 100477


def test_per_process_utilization_comes_from_nvml_samples() -> None:
    def samples(handle: object, last_seen: int) -> list[object]:
        sample = pynvml.c_nvmlProcessUtilizationSample_t()
        sample.pid, sample.timeStamp, sample.smUtil, sample.memUtil = 100477, 5, 87, 41
        older = pynvml.c_nvmlProcessUtilizationSample_t()
        older.pid, older.timeStamp, older.smUtil, older.memUtil = 100477, 1, 3, 2
        return [older, sample]

    fake = FakeNvml(DUAL, overrides={"nvmlDeviceGetProcessUtilization": samples})
    backend, session = nvml(fake)
    report = gpu_processes(backend, session=session, lookup=in_a_container)
    assert (report.rows[0].sm_util_pct.value, report.rows[0].memory_util_pct.value) == (87, 41)


def test_a_driver_without_process_utilization_says_so() -> None:
    fake = FakeNvml(DUAL, driver_lacks=frozenset({"nvmlDeviceGetProcessUtilization"}))
    backend, session = nvml(fake)
    row = gpu_processes(backend, session=session, lookup=in_a_container).rows[0]
    assert row.sm_util_pct.status is Status.DRIVER_TOO_OLD
    assert row.gpu_memory_bytes.ok  # the rest of the row stands


def test_a_process_of_this_namespace_gets_its_host_side() -> None:
    backend, session = nvml(FakeNvml(RTX3080))
    me = os.getpid()
    first = gpu_processes(backend, session=session, lookup=in_a_container).rows[0].pid

    def here(pids: Sequence[int]) -> dict[int, HostProcess]:
        found = psutil_lookup([me], 0.05)[me]
        return {pid: found if pid == first else _gone() for pid in pids}

    row = gpu_processes(backend, session=session, lookup=here).rows[0]
    assert row.host.rss_bytes.ok
    assert (row.host.rss_bytes.value or 0) > 0
    assert "python" in str(row.host.command.value).lower()


def test_a_container_that_hides_every_process_says_why() -> None:
    # 8x H100 at 97 % with 69 GiB each and an empty process table (a dstack container).
    report = gd.processes(replay=str(DSTACK))
    assert report.rows == ()
    assert report.is_recording
    assert all("no process listed" in g.note for g in report.gpus)
    text = repr(report)
    assert "GPU 0, 1, 2, 3, 4, 5, 6, 7: memory in use but no process listed" in text
    assert "hostPID: true" in text
    assert report.to_dict()["gpus"][0]["listed_bytes"] == 0


def test_psutil_lookup_of_a_pid_that_does_not_exist() -> None:
    (gone,) = psutil_lookup([2**22 + 12345], 0.0).values()
    assert gone.command.status is Status.NOT_FOUND
    assert "PID namespace" in gone.command.reason


def test_no_gpu_here_is_a_report_with_the_reason() -> None:
    report = gd.processes()
    assert report.rows == ()
    assert "no GPU" in repr(report)
