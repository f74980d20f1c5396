"""Small questions the rules ask of a GPU's readings (busy or idle, memory used, labels)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from gpudiag.probe.model import Gpu
from gpudiag.probe.readings import Reading

if TYPE_CHECKING:
    from gpudiag.analysis.trace.report import TraceReport
    from gpudiag.rules.evidence import EvidenceBundle

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


# What fixes a copy that blocks on pageable host memory depends on its direction. A
# host-to-device copy from pageable memory is staged through a pinned buffer and blocks the
# host; from pinned memory with non_blocking=True it is queued and the host goes on. A
# device-to-host copy into pageable memory returns only once it is done; into pinned memory
# with non_blocking=True it is queued, and the value is read after an event.
PIN_SOURCE_ADVICE = (
    "pin the source: DataLoader(pin_memory=True) for batches (or t.pin_memory() once for a "
    "tensor you reuse), then .to(device, non_blocking=True)"
)
PINNED_DESTINATION_ADVICE = (
    "copy into a pinned destination: dst = torch.empty(t.shape, dtype=t.dtype, "
    "pin_memory=True); dst.copy_(t, non_blocking=True); read dst after an event (or every N "
    "steps), or drop the .cpu()/.tolist()/.item() from the step"
)


def trace_source(trace: TraceReport | None) -> str:
    """Where trace evidence came from: "trace: rank0.json.gz" (one file) or "trace (N ranks)"."""
    ranks = trace.ranks if trace is not None else ()
    if len(ranks) == 1:
        return f"trace: {os.path.basename(ranks[0].path)}"
    return f"trace ({len(ranks)} ranks)" if ranks else "trace"


def trace_device(evidence: EvidenceBundle) -> tuple[tuple[int, int] | None, str]:
    """Compute capability and name of the traced GPU (the trace's deviceProperties first,
    then the system report's primary GPU); (None, "") when neither tells."""
    trace = evidence.trace
    for dev in trace.device_properties if trace is not None else ():
        cc = dev.compute_capability
        if cc is not None:
            return (int(cc[0]), int(cc[1])), str(dev.name)
    system = evidence.system
    gpu = system.primary_gpu if system is not None else None
    gpu_cc = gpu.compute_capability if gpu is not None else None
    if gpu is not None and gpu_cc is not None:
        return (int(gpu_cc[0]), int(gpu_cc[1])), gpu.name
    return None, ""


def span_us(trace: TraceReport) -> float | None:
    span = trace.time_breakdown().get("span_us")
    return float(span) if span else None


# Below this much kernel time a trace holds too little GPU work for a claim about a run: a
# launch-bound or precision share of 300 us of kernels says nothing about the job they came
# from. Time decides, not the number of kernels: five GEMMs of 78.6 ms are plenty.
MIN_KERNEL_US = 500.0


def trace_too_small(trace: TraceReport | None) -> str | None:
    """Why a trace with GPU events is too small to judge a run by (None: big enough)."""
    if trace is None or not trace.has_gpu_events:
        return None
    kernels = sum(k.count for k in trace.kernels() if k.category in ("compute", "communication"))
    b = trace.time_breakdown()
    busy_us = float(b.get("compute_us") or 0.0) + float(b.get("communication_us") or 0.0)
    if busy_us >= MIN_KERNEL_US:
        return None
    return (
        f"{busy_us:.0f} us of kernel time ({kernels} kernels) in the analysed window (a claim "
        f"about a run needs at least {MIN_KERNEL_US / 1e3:g} ms of kernel time)"
    )
