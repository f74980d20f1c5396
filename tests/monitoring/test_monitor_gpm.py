"""NVML GPM through the NVML chokepoint, against a fake pynvml that follows nvidia-ml-py's GPM API
(real ctypes structs and constants, real NVMLError classes). Untested on a real GPU."""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml as real
import pytest

from gpudiag.monitoring.feeds import GpmCounters, NoCounters, auto_counters
from gpudiag.probe.dcgm import DcgmReader
from gpudiag.probe.gpm import GpmReader
from gpudiag.probe.nvml import NvmlSession
from gpudiag.probe.nvml_backend import NvmlBackend
from gpudiag.probe.readings import Status, na
from tests.conftest import FIXTURES
from tests.fakes.fake_nvml import FakeNvml

BLACKWELL = FIXTURES / "nvidia-smi-xml" / "pro-6000-maxq-blackwell-v13.xml"
MIB = float(1 << 20)


class GpmFakeNvml(FakeNvml):
    """FakeNvml plus the GPM calls. Samples are opaque pointers; metrics come from ``rates``."""

    def __init__(self, *args: Any, supported: bool = True, **kwargs: Any) -> None:
        self.supported = supported
        self.rates: dict[int, float] = {}
        self.metric_errors: dict[int, int] = {}
        self.sample_order: dict[int, int] = {}
        self.allocated: list[Any] = []
        self.freed: list[int] = []
        self.requests: list[tuple[int, int, int]] = []
        super().__init__(*args, **kwargs)

    @staticmethod
    def _address(sample: Any) -> int:
        return ctypes.addressof(sample.contents)

    def _nvmlGpmQueryDeviceSupport(self, handle: Any) -> Any:
        support = real.c_nvmlGpmSupport_t()
        support.version = real.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = 1 if self.supported else 0
        return support

    def _nvmlGpmSampleAlloc(self) -> Any:
        sample = ctypes.pointer(real.struct_c_nvmlGpmSample_t())
        self.allocated.append(sample)
        return sample

    def _nvmlGpmSampleFree(self, sample: Any) -> None:
        self.freed.append(self._address(sample))

    def _nvmlGpmSampleGet(self, handle: Any, sample: Any) -> Any:
        self.sample_order[self._address(sample)] = len(self.sample_order) + len(self.requests)
        return sample

    def _nvmlGpmMetricsGet(self, request: Any) -> Any:
        first, second = self._address(request.sample1), self._address(request.sample2)
        assert request.version == real.NVML_GPM_METRICS_GET_VERSION
        assert first != second
        assert self.sample_order[first] < self.sample_order[second]  # older sample first
        self.requests.append((first, second, request.numMetrics))
        for i in range(request.numMetrics):
            metric = request.metrics[i]
            code = self.metric_errors.get(metric.metricId, real.NVML_SUCCESS)
            metric.nvmlReturn = code
            metric.value = self.rates.get(metric.metricId, 0.0) if code == real.NVML_SUCCESS else 0
        return request


def session_with(fake: GpmFakeNvml) -> NvmlSession:
    return NvmlSession(module=fake)


def test_gpm_reads_activity_between_two_samples() -> None:
    fake = GpmFakeNvml(BLACKWELL)
    fake.rates = {
        real.NVML_GPM_METRIC_SM_UTIL: 91.5,
        real.NVML_GPM_METRIC_SM_OCCUPANCY: 38.0,
        real.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 64.0,
        real.NVML_GPM_METRIC_DRAM_BW_UTIL: 72.25,
        real.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: 1024.0,
    }
    opened = GpmReader.open(session_with(fake), 0)
    assert opened.ok
    reader = opened.value
    assert reader is not None
    first = reader.read()
    assert first.sm_active_pct.status is Status.NOT_AVAILABLE
    assert "two samples" in first.sm_active_pct.reason
    second = reader.read()
    assert second.sm_active_pct.value == 91.5
    assert second.sm_occupancy_pct.value == 38.0
    assert second.tensor_active_pct.value == 64.0
    assert second.dram_active_pct.value == 72.25
    assert second.nvlink_rx_bytes_per_s.value == 1024.0 * MIB
    third = reader.read()
    assert third.sm_active_pct.value == 91.5
    # The two allocated samples take turns: each request compares the last two taken.
    a, b = (GpmFakeNvml._address(s) for s in fake.allocated)
    assert [r[:2] for r in fake.requests] == [(a, b), (b, a)]
    reader.close()
    reader.close()
    assert sorted(fake.freed) == sorted([a, b])


def test_gpm_unsupported_gpu_is_na_and_says_what_to_use() -> None:
    reading = GpmReader.open(session_with(GpmFakeNvml(BLACKWELL, supported=False)), 0)
    assert reading.status is Status.NOT_SUPPORTED
    assert "Hopper" in reading.reason
    assert "DCGM" in reading.reason


def test_gpm_without_permission_gives_the_fix() -> None:
    fake = GpmFakeNvml(
        BLACKWELL, function_errors={"nvmlGpmSampleGet": real.NVML_ERROR_NO_PERMISSION}
    )
    reader = GpmReader.open(session_with(fake), 0).value
    assert reader is not None
    counters = reader.read()
    assert counters.sm_active_pct.status is Status.NO_PERMISSION
    assert "NVreg_RestrictProfilingToAdminUsers" in counters.sm_active_pct.reason


def test_one_metric_refused_the_others_still_read() -> None:
    fake = GpmFakeNvml(BLACKWELL)
    fake.rates = {real.NVML_GPM_METRIC_SM_UTIL: 50.0}
    fake.metric_errors = {real.NVML_GPM_METRIC_ANY_TENSOR_UTIL: real.NVML_ERROR_NO_PERMISSION}
    reader = GpmReader.open(session_with(fake), 0).value
    assert reader is not None
    reader.read()
    counters = reader.read()
    assert counters.sm_active_pct.value == 50.0
    assert counters.tensor_active_pct.status is Status.NO_PERMISSION


def test_driver_without_gpm_is_driver_too_old() -> None:
    fake = GpmFakeNvml(BLACKWELL, driver_lacks=frozenset({"nvmlGpmQueryDeviceSupport"}))
    reading = GpmReader.open(session_with(fake), 0)
    assert reading.status is Status.DRIVER_TOO_OLD


def test_auto_counters_falls_back_to_gpm_when_no_dcgm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        DcgmReader,
        "connect",
        classmethod(lambda cls, *a, **k: na(Status.NOT_FOUND, "no DCGM host engine answers")),
    )
    fake = GpmFakeNvml(BLACKWELL)
    backend = NvmlBackend(session_with(fake))
    counters = auto_counters(backend, backend.gpu_infos())
    assert isinstance(counters, GpmCounters)
    counters.close()
    unsupported = NvmlBackend(session_with(GpmFakeNvml(BLACKWELL, supported=False)))
    none = auto_counters(unsupported, unsupported.gpu_infos())
    assert isinstance(none, NoCounters)
    assert "DCGM: no DCGM host engine answers" in none.reason
    assert "NVML GPM" in none.reason
