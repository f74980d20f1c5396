"""Peak memory of one training step: CUDA allocator peak on a GPU, profiler memory events on a CPU.

On a GPU the number is ``torch.cuda.max_memory_allocated`` (through gpudiag.probe.cuda): the
caching allocator's high-water mark of live tensor bytes during the step.

On the CPU there is no allocator counter, so the step runs once under ``torch.profiler`` with
``profile_memory=True``: every allocation and free of torch's CPU allocator is an event with a
signed byte count, and the running sum's maximum is the step's peak of live tensor bytes above
what was allocated when it began. This measures exactly what the fixes change (activations,
gradients, autocast copies, optimizer state created in the step) in-process. A child process's
RSS high-water mark was the alternative: it would also count the Python heap, the allocator's
cached pages and the libraries, but it needs the workload to be rebuilt in another process,
which a notebook's closures and models usually cannot be.

The CUDA path is tested against a fake of gpudiag.probe.cuda only: untested on a real GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from gpudiag._report import FieldsDict
from gpudiag.probe import cuda
from gpudiag.profiling.memory import allocator_events

CPU_METHOD = "torch.profiler memory events (CPU allocator), peak above the step's start"
CUDA_METHOD = "torch.cuda.max_memory_allocated (caching allocator peak)"


@dataclass(frozen=True)
class PeakMemory(FieldsDict):
    """Peak bytes of live tensors during one step; ``None`` with the reason when not measured."""

    peak_bytes: int | None  # GPU: allocator peak; CPU: peak above the start of the step
    above_start_bytes: int | None  # peak minus what was allocated when the step began
    method: str
    note: str = ""

    @property
    def peak_mib(self) -> float | None:
        return None if self.peak_bytes is None else self.peak_bytes / 2**20

    def __str__(self) -> str:
        if self.peak_bytes is None:
            return f"not measured ({self.note or self.method})"
        return f"{self.peak_bytes / 2**20:,.1f} MiB"


def peak_of_running_sum(deltas: Iterable[tuple[float, int]]) -> int:
    """Max of the running sum of (time, signed bytes) events, taken in time order (>= 0)."""
    level = peak = 0
    for _, nbytes in sorted(deltas, key=lambda e: e[0]):
        level += nbytes
        peak = max(peak, level)
    return peak


def _kineto_memory_events(prof: Any) -> list[tuple[float, int]] | None:
    results = getattr(getattr(prof, "profiler", None), "kineto_results", None)
    if results is None:
        return None
    try:
        return [
            (float(e.start_ns()), int(e.nbytes()))
            for e in results.events()
            if e.name() == "[memory]"
        ]
    except (AttributeError, RuntimeError):
        return None


def _trace_memory_events(prof: Any) -> list[tuple[float, int]]:
    # Public fallback: the exported Chrome trace carries the same events ("Bytes" per event).
    return [(t, nbytes) for t, _, nbytes in allocator_events(prof)]


def measure_peak_memory(step: Callable[[], Any], *, device_type: str) -> PeakMemory:
    """Run ``step`` once and measure its peak tensor memory on ``device_type``."""
    if device_type == "cuda":
        if not cuda.available():
            return PeakMemory(None, None, CUDA_METHOD, "CUDA is not available")
        cuda.synchronize()
        start = cuda.memory_allocated()
        cuda.reset_peak_memory_stats()
        step()
        cuda.synchronize()
        peak = cuda.max_memory_allocated()
        return PeakMemory(peak, None if peak is None else peak - start, CUDA_METHOD)
    from torch.profiler import ProfilerActivity, profile

    from gpudiag._native_stderr import quiet_profiler_stderr

    with (
        quiet_profiler_stderr(),
        profile(
            activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False
        ) as prof,
    ):
        step()
    events = _kineto_memory_events(prof)
    if events is None:
        events = _trace_memory_events(prof)
    if not events:
        return PeakMemory(None, None, CPU_METHOD, "the profiler recorded no memory events")
    peak = peak_of_running_sum(events)
    return PeakMemory(peak, peak, CPU_METHOD)
