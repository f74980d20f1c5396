"""NVML GPM (GPU Performance Monitoring, Hopper+): SM, tensor and DRAM activity without DCGM.

GPM metrics are computed between two samples taken by ``nvmlGpmSampleGet``; a reader keeps
the previous sample and, on each ``read()``, takes a new one and asks ``nvmlGpmMetricsGet``
for the metrics over the interval between them. Every call goes through the NVML
chokepoint (``NvmlSession.call``).

Written against nvidia-ml-py's GPM API (``nvmlGpmQueryDeviceSupport``, ``nvmlGpmSampleAlloc``,
``nvmlGpmSampleGet``, ``nvmlGpmMetricsGet`` with ``c_nvmlGpmMetricsGet_t``) and tested with a
fake that follows it: untested on a real GPU.
"""

from __future__ import annotations

import contextlib
from typing import Any, Protocol

from gpudiag.probe.dcgm import PROFILING_PERMISSION_FIX, ActivityCounters
from gpudiag.probe.readings import Reading, Status, na, ok

SOURCE = "nvml gpm"
_MIB = float(1 << 20)

# NVML_GPM_METRIC_* constant -> (ActivityCounters attribute, scale). The GPM utilizations
# are percentages already; the NVLink rates are MiB/s.
GPM_METRICS: tuple[tuple[str, str, float], ...] = (
    ("NVML_GPM_METRIC_GRAPHICS_UTIL", "gr_engine_active_pct", 1.0),
    ("NVML_GPM_METRIC_SM_UTIL", "sm_active_pct", 1.0),
    ("NVML_GPM_METRIC_SM_OCCUPANCY", "sm_occupancy_pct", 1.0),
    ("NVML_GPM_METRIC_ANY_TENSOR_UTIL", "tensor_active_pct", 1.0),
    ("NVML_GPM_METRIC_DRAM_BW_UTIL", "dram_active_pct", 1.0),
    ("NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC", "nvlink_rx_bytes_per_s", _MIB),
    ("NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC", "nvlink_tx_bytes_per_s", _MIB),
)


class NvmlCaller(Protocol):
    """What the reader needs of ``gpudiag.probe.nvml.NvmlSession``."""

    def call(self, function: str, *args: Any, **kwargs: Any) -> Reading[Any]: ...

    def handle(self, index: int) -> Reading[Any]: ...

    def const(self, name: str, default: Any = None) -> Any: ...

    @property
    def nvml(self) -> Any: ...


def _with_fix(reading: Reading[Any]) -> Reading[Any]:
    if reading.status is Status.NO_PERMISSION:
        return na(Status.NO_PERMISSION, PROFILING_PERMISSION_FIX, SOURCE)
    if reading.status is Status.NOT_SUPPORTED:
        return na(
            Status.NOT_SUPPORTED,
            "NVML GPM is not supported on this GPU (it needs Hopper or newer and a driver "
            "from R520 on); use DCGM profiling fields instead",
            SOURCE,
        )
    return na(reading.status, reading.reason, SOURCE)


class GpmReader:
    """Reads GPM activity metrics of one GPU. ``open`` checks support first.

    The first ``read()`` has no earlier sample to compare with, so its counters are N/A
    ("needs two samples"); every later read covers the time since the previous one.
    """

    def __init__(self, session: NvmlCaller, handle: Any, index: int) -> None:
        self._session = session
        self._handle = handle
        self.index = index
        self._samples: list[Any] = []
        self._previous: Any | None = None
        self._closed = False

    @classmethod
    def open(cls, session: NvmlCaller, index: int) -> Reading[GpmReader]:
        """A reader for NVML device ``index``, or N/A with the reason GPM cannot be used."""
        handle = session.handle(index)
        if not handle.ok:
            return na(handle.status, handle.reason, SOURCE)
        support = session.call("nvmlGpmQueryDeviceSupport", handle.value)
        if not support.ok:
            return _with_fix(support)
        if not getattr(support.value, "isSupportedDevice", 0):
            return na(
                Status.NOT_SUPPORTED,
                "NVML GPM is not supported on this GPU (it needs Hopper or newer); "
                "use DCGM profiling fields instead",
                SOURCE,
            )
        reader = cls(session, handle.value, index)
        for _ in range(2):
            sample = session.call("nvmlGpmSampleAlloc")
            if not sample.ok:
                reader.close()
                return _with_fix(sample)
            reader._samples.append(sample.value)
        return ok(reader, SOURCE)

    def read(self) -> ActivityCounters:
        """Take a sample and return the metrics since the previous one."""
        if self._closed:
            return ActivityCounters.unavailable(Status.NOT_AVAILABLE, "GPM reader closed", SOURCE)
        current = self._samples[1] if self._previous is self._samples[0] else self._samples[0]
        got = self._session.call("nvmlGpmSampleGet", self._handle, current)
        if not got.ok:
            self._previous = None
            reading = _with_fix(got)
            return ActivityCounters.unavailable(reading.status, reading.reason, SOURCE)
        previous, self._previous = self._previous, current
        if previous is None:
            return ActivityCounters.unavailable(
                Status.NOT_AVAILABLE,
                "GPM needs two samples: the first value comes next tick",
                SOURCE,
            )
        return self._metrics(previous, current)

    def _metrics(self, sample1: Any, sample2: Any) -> ActivityCounters:
        nvml = self._session.nvml
        wanted = [
            (int(getattr(nvml, const)), attr, scale)
            for const, attr, scale in GPM_METRICS
            if hasattr(nvml, const)
        ]
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(wanted)
        request.sample1 = sample1
        request.sample2 = sample2
        for i, (metric_id, _, _) in enumerate(wanted):
            request.metrics[i].metricId = metric_id
        result = self._session.call("nvmlGpmMetricsGet", request)
        if not result.ok or result.value is None:
            reading = _with_fix(result)
            return ActivityCounters.unavailable(reading.status, reading.reason, SOURCE)
        success = self._session.const("NVML_SUCCESS", 0)
        no_permission = self._session.const("NVML_ERROR_NO_PERMISSION", 4)
        not_supported = self._session.const("NVML_ERROR_NOT_SUPPORTED", 3)
        readings: dict[str, Reading[float]] = {}
        for i, (_, attr, scale) in enumerate(wanted):
            metric = result.value.metrics[i]
            code = int(metric.nvmlReturn)
            if code == success:
                readings[attr] = ok(float(metric.value) * scale, SOURCE)
            elif code == no_permission:
                readings[attr] = na(Status.NO_PERMISSION, PROFILING_PERMISSION_FIX, SOURCE)
            elif code == not_supported:
                readings[attr] = na(Status.NOT_SUPPORTED, "this GPU has no such GPM metric", SOURCE)
            else:
                readings[attr] = na(
                    Status.UNKNOWN, f"GPM metric failed (NVML error {code})", SOURCE
                )
        return ActivityCounters(**readings)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for sample in self._samples:
            with contextlib.suppress(Exception):
                self._session.call("nvmlGpmSampleFree", sample)
        self._samples.clear()


__all__ = ["GPM_METRICS", "GpmReader", "NvmlCaller"]
