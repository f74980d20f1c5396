"""Each way NVML fails on real machines, as its own named case: gd.inspect() never raises."""

from __future__ import annotations

import logging
import types

import pynvml
import pytest

from gpudiag.probe.backend import NullBackend, default_backend
from gpudiag.probe.nvml import FIX_BINDINGS, NvmlSession, check_bindings
from gpudiag.probe.nvml_backend import NvmlBackend
from gpudiag.probe.readings import Status
from gpudiag.probe.system import inspect
from tests.conftest import FIXTURES
from tests.fakes.fake_nvml import FakeNvml

A100 = FIXTURES / "nvidia-smi-xml" / "a100-sxm4-v12.xml"
DUAL = FIXTURES / "nvidia-smi-xml" / "dual_a5000-v13.xml"
T4 = FIXTURES / "nvidia-smi-xml" / "tesla-t4.xml"


def _inspect(fake: types.ModuleType):
    return inspect(backend=default_backend(NvmlSession(fake)), env={})


def test_nvidia_ml_py_missing() -> None:
    def importer(name: str) -> types.ModuleType:
        raise ModuleNotFoundError("No module named 'pynvml'")

    session = NvmlSession(importer=importer)
    count = session.device_count()
    assert count.status is Status.NOT_FOUND
    assert "pip install nvidia-ml-py" in count.reason


@pytest.mark.parametrize(
    ("code", "status", "words"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, Status.NOT_FOUND, "NVML library not found"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, Status.NOT_FOUND, "driver not loaded"),
        (pynvml.NVML_ERROR_NO_PERMISSION, Status.NO_PERMISSION, "permission"),
        (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, Status.UNKNOWN, "reboot"),
    ],
    ids=["library_not_found", "driver_not_loaded", "no_permission", "lib_rm_version_mismatch"],
)
def test_init_failures(code: int, status: Status, words: str) -> None:
    report = _inspect(FakeNvml(T4, init_error=code))
    assert report.gpus == ()
    assert report.gpu_count.status is status
    assert words.lower() in report.no_gpu_reason.lower()
    assert "no NVIDIA GPU" in str(report)


def test_real_bindings_without_a_driver_say_library_not_found() -> None:
    # This machine has nvidia-ml-py but no NVIDIA driver: the real path, not a fake.
    NvmlSession.reset_shared()
    backend = default_backend()
    assert isinstance(backend, NullBackend)
    assert "NVML library not found" in backend.reason
    report = inspect(backend=backend)
    assert "no NVIDIA GPU" in str(report)
    assert report.host.logical_cores.value >= 1


def test_gpu_lost_at_handle_time() -> None:
    report = _inspect(FakeNvml(DUAL, handle_errors={0: pynvml.NVML_ERROR_GPU_IS_LOST}))
    lost, fine = report.gpus
    assert lost.info.name.status is Status.GPU_LOST
    assert "Xid 79" in lost.info.name.reason
    assert lost.state.gpu_util_pct.status is Status.GPU_LOST
    assert fine.info.name.value == "NVIDIA RTX A5000"
    assert "GPU is lost" in str(report)


def test_function_not_found_falls_back_and_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeNvml(DUAL, driver_lacks=frozenset({"nvmlDeviceGetCurrentClocksEventReasons"}))
    session = NvmlSession(fake)
    backend = NvmlBackend(session)
    with caplog.at_level(logging.INFO, logger="gpudiag.probe.nvml"):
        for _ in range(3):
            states = backend.sample()
    # the older throttle-reasons call answers instead
    assert states[0].clock_event_reasons.value == ("gpu_idle",)
    assert session.missing_functions == ("nvmlDeviceGetCurrentClocksEventReasons",)
    logged = [r for r in caplog.records if "nvmlDeviceGetCurrentClocksEventReasons" in r.message]
    assert len(logged) == 1


def test_driver_older_than_bindings_reason() -> None:
    fake = FakeNvml(T4, driver_lacks=frozenset({"nvmlDeviceGetMemoryBusWidth"}))
    session = NvmlSession(fake)
    reading = session.call("nvmlDeviceGetMemoryBusWidth", session.handle(0).value)
    assert reading.status is Status.DRIVER_TOO_OLD
    assert "update the driver" in reading.reason


def test_every_query_raising() -> None:
    report = _inspect(FakeNvml(DUAL, every_query_raises=pynvml.NVML_ERROR_UNKNOWN))
    assert len(report.gpus) == 2
    for gpu in report.gpus:
        assert gpu.info.name.status is Status.UNKNOWN
        assert gpu.state.power_w.reason
    text = str(report)
    assert "GPU 0" in text
    assert "GPU 1" in text
    assert report._repr_html_()


def test_no_permission_on_processes() -> None:
    fake = FakeNvml(
        T4,
        function_errors={
            "nvmlDeviceGetComputeRunningProcesses": pynvml.NVML_ERROR_NO_PERMISSION,
            "nvmlDeviceGetGraphicsRunningProcesses": pynvml.NVML_ERROR_NO_PERMISSION,
        },
    )
    state = _inspect(fake).gpus[0].state
    assert state.processes.status is Status.NO_PERMISSION
    assert state.power_w.ok


@pytest.mark.parametrize("sentinel", [0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF], ids=["uint", "ulonglong"])
def test_value_not_available_sentinel(sentinel: int) -> None:
    fake = FakeNvml(T4, overrides={"nvmlDeviceGetPowerUsage": lambda h: sentinel})
    power = NvmlBackend(NvmlSession(fake)).sample()[0].power_w
    assert power.status is Status.NOT_AVAILABLE
    assert power.value is None


def test_process_memory_not_reported_is_na() -> None:
    # tesla_p4.xml: a Windows vGPU guest, where per-process memory is N/A.
    state = _inspect(FakeNvml(FIXTURES / "nvidia-smi-xml" / "tesla_p4.xml")).gpus[0].state
    procs = state.processes.value
    assert procs
    assert all(not p.used_memory_bytes.ok for p in procs)


def test_nvml_initialised_lazily_and_once() -> None:
    fake = FakeNvml(T4)
    session = NvmlSession(fake)
    assert fake.calls == []
    session.device_count()
    session.device_count()
    assert fake.calls.count("nvmlInitWithFlags") == 1


def test_bytes_from_old_bindings_are_decoded() -> None:
    fake = FakeNvml(T4, overrides={"nvmlDeviceGetName": lambda h: b"Tesla T4\x00"})
    assert _inspect(fake).gpus[0].info.name.value == "Tesla T4"


def test_shadowed_bindings_are_reported_with_the_fix() -> None:
    old = types.ModuleType("pynvml")  # nvidia-ml-py3 7.352: no nvmlInitWithFlags
    old.NVMLError = Exception  # type: ignore[attr-defined]
    old.nvmlInit = lambda: None  # type: ignore[attr-defined]
    old.__file__ = "/site-packages/pynvml.py"
    problem = check_bindings(old)
    assert problem is not None
    assert FIX_BINDINGS in problem
    session = NvmlSession(old)
    count = session.device_count()
    assert not count.ok
    assert FIX_BINDINGS in count.reason


def test_old_pynvml_package_directory_is_reported() -> None:
    pkg = types.ModuleType("pynvml")
    pkg.NVMLError = Exception  # type: ignore[attr-defined]
    pkg.nvmlInitWithFlags = lambda flags: None  # type: ignore[attr-defined]
    pkg.__file__ = "/site-packages/pynvml/__init__.py"
    assert "old `pynvml` project" in (check_bindings(pkg) or "")


def test_official_bindings_pass_the_check() -> None:
    assert check_bindings(pynvml) is None


def test_import_error_inside_bindings_is_reported() -> None:
    def importer(name: str) -> types.ModuleType:
        raise OSError("corrupt file")

    count = NvmlSession(importer=importer).device_count()
    assert count.status is Status.UNKNOWN
    assert FIX_BINDINGS in count.reason


def test_light_mode_skips_the_slow_calls() -> None:
    fake = FakeNvml(T4)
    state = NvmlBackend(NvmlSession(fake), light=True).sample()[0]
    assert "nvmlDeviceGetPcieThroughput" not in fake.calls
    assert "nvmlDeviceGetComputeRunningProcesses" not in fake.calls
    assert state.processes.status is Status.NOT_AVAILABLE
    assert "light mode" in state.processes.reason
    assert state.power_w.ok
    assert state.gpu_util_pct.ok
