"""Test doubles for comparisons: a hand-built GPU-less machine report."""

from __future__ import annotations

from gpudiag.probe.model import DriverInfo, HostInfo, TorchInfo
from gpudiag.probe.readings import ok
from gpudiag.probe.system import SystemReport


def cpu_system(*flags: str) -> SystemReport:
    """A GPU-less machine whose CPU has ``flags`` (e.g. avx512_bf16)."""
    host = HostInfo(
        hostname="fake",
        cpu_model=ok("Fake CPU", "host"),
        cpu_flags=tuple(flags),
        logical_cores=ok(2),
        memory_total_bytes=ok(16 << 30),
        memory_available_bytes=ok(8 << 30),
        torch=TorchInfo(version=ok("2.13.0+cpu"), cuda_available=ok(False)),
    )
    return SystemReport(host=host, gpus=(), driver=DriverInfo(), gpu_count=ok(0))
