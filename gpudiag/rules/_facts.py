"""Small questions the rules ask of a GPU's readings (busy or idle, memory used, labels)."""

from __future__ import annotations

import os
from typing import Any

from gpudiag.probe.model import Gpu
from gpudiag.probe.readings import Reading

# nvidia-smi's utilization.gpu at or above this means the GPU was running work when read:
# below it, downclocked links and power caps are the idle power saving, not a problem.
BUSY_UTIL_PCT = 10.0


def source_of(reading: Reading[Any], default: str = "nvml") -> str:
    return reading.source or default


def gpu_label(gpu: Gpu) -> str:
    return f"GPU {gpu.info.index} ({gpu.name})"


def is_busy(gpu: Gpu) -> bool | None:
    """True when the GPU was running work at the reading; None when utilization is N/A."""
    util = gpu.state.gpu_util_pct
    if not util.ok:
        return None
    return float(util.get(0.0)) >= BUSY_UTIL_PCT


def memory_used_fraction(gpu: Gpu) -> float | None:
    used = gpu.state.memory_used_bytes.get()
    total = gpu.info.memory_total_bytes.get()
    if used is None or not total:
        return None
    return float(used) / float(total)


def gib(nbytes: float) -> float:
    return float(nbytes) / 2**30


def trace_source(trace: Any) -> str:
    """Where trace evidence came from: "trace: rank0.json.gz" (one file) or "trace (N ranks)"."""
    ranks: tuple[Any, ...] = tuple(getattr(trace, "ranks", ()))
    if len(ranks) == 1:
        return f"trace: {os.path.basename(ranks[0].path)}"
    return f"trace ({len(ranks)} ranks)" if ranks else "trace"


def trace_device(evidence: Any) -> tuple[tuple[int, int] | None, str]:
    """Compute capability and name of the traced GPU (the trace's deviceProperties first,
    then the system report's primary GPU); (None, "") when neither tells."""
    trace = evidence.trace
    for dev in getattr(trace, "device_properties", ()) if trace is not None else ():
        cc = dev.compute_capability
        if cc is not None:
            return (int(cc[0]), int(cc[1])), str(dev.name)
    system = evidence.system
    gpu = system.primary_gpu if system is not None else None
    gpu_cc = gpu.compute_capability if gpu is not None else None
    if gpu is not None and gpu_cc is not None:
        return (int(gpu_cc[0]), int(gpu_cc[1])), gpu.name
    return None, ""


def span_us(trace: Any) -> float | None:
    span = trace.time_breakdown().get("span_us")
    return float(span) if span else None
