"""What the rules look at: the evidence bundle, its memory part, and what each need means.

This module imports nothing else from ``gpudiag.rules``, so the engine and every family of
rules can import it without a cycle.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpudiag.errors import GpuDiagError

if TYPE_CHECKING:
    from typing import TypeAlias

    import pandas as pd

    from gpudiag.analysis.memory_estimate import MemoryEstimate
    from gpudiag.analysis.memory_snapshot import MemorySnapshot
    from gpudiag.analysis.nccl import CollectiveResult
    from gpudiag.analysis.trace.report import TraceReport
    from gpudiag.experiment.batch_scaling import BatchScaling
    from gpudiag.experiment.fit import FitResult
    from gpudiag.experiment.memory_report import MemoryReport
    from gpudiag.monitoring.sampler import Monitor
    from gpudiag.probe.cuda_memory import AllocatorStats
    from gpudiag.probe.system import SystemReport
    from gpudiag.step import Workload

    # Monitor samples: a Monitor (read through samples() / na_reasons()), its to_dict(), or
    # its samples() DataFrame (whose attrs hold the same "na" map).
    Samples: TypeAlias = Monitor | Mapping[str, Any] | pd.DataFrame
    # Measured collective bandwidth: one result (gd.bench.allreduce, parse_nccl_tests) or
    # several (parse_nccl_tests_all).
    Collectives: TypeAlias = (
        CollectiveResult | list[CollectiveResult] | tuple[CollectiveResult, ...]
    )

# What each kind of evidence is, in words (for "not evaluated: missing ...").
NEEDS: dict[str, str] = {
    "system": "a system report (gd.inspect())",
    "gpu": "an NVIDIA GPU (live or recorded)",
    "trace": "a profiler trace (gd.profile / gd.analyze_trace)",
    "gpu_trace": "a profiler trace with GPU kernels",
    "samples": "monitor samples (gd.monitor)",
    "code": "the workload's source code",
    "runtime": "the process's torch settings (gpudiag.probe.runtime)",
    "workload": "a workload (gd.Workload or a demo name)",
    "memory": "memory evidence (gd.memory / gd.fit / gd.estimate_memory / a snapshot)",
    "batch_scaling": "step times at two batch sizes (gd.diagnose(workload) with a "
    "batch=(batch_size -> batch) workload)",
    "env": "the environment variables of the process that ran the job (a recording or a "
    "trace file does not hold them)",
}


@dataclass(frozen=True)
class MemoryEvidence:
    """What the memory rules look at; any part may be missing."""

    report: MemoryReport | None = None  # gd.memory
    fit: FitResult | None = None  # gd.fit
    estimate: MemoryEstimate | None = None  # gd.estimate_memory
    snapshot: MemorySnapshot | None = None  # gd.analyze_memory_snapshot
    budget_bytes: int | None = None
    allocator: AllocatorStats | None = None  # gpudiag.probe.cuda_memory
    pid: int | None = None  # this process (to tell other processes on the GPU apart)

    def peak(self) -> tuple[int, str] | None:
        if self.report is not None and self.report.oom is None and self.report.peak_bytes:
            return int(self.report.peak_bytes), "gd.memory (measured)"
        if self.fit is not None:
            return int(self.fit.estimate.peak_bytes), "gd.estimate_memory (traced)"
        if self.estimate is not None:
            return int(self.estimate.peak_bytes), f"gd.estimate_memory ({self.estimate.route})"
        return None

    def budget(self) -> int | None:
        if self.budget_bytes:
            return int(self.budget_bytes)
        if self.fit is not None:
            return int(self.fit.budget_bytes)
        if self.report is not None and self.report.budget_bytes:
            return int(self.report.budget_bytes)
        return None


@dataclass(frozen=True)
class EvidenceBundle:
    """Everything the rules may look at; any part may be missing."""

    system: SystemReport | None = None
    trace: TraceReport | None = None
    samples: Samples | None = None  # monitor samples
    workload: Workload | None = None
    code: str | None = None  # source text to scan for API misuse
    runtime: Mapping[str, Any] | None = None  # torch switches of this process
    batch_scaling: BatchScaling | None = None
    # measured collective bandwidth (gd.bench.allreduce, nccl-tests logs)
    collectives: Collectives | None = None
    memory: MemoryEvidence | None = None
    # The environment of the process that ran the job; None when the evidence comes from
    # elsewhere (a recorded machine, a trace file), whose environment this process cannot see.
    env: Mapping[str, str] | None = field(default_factory=lambda: dict(os.environ))

    # The parts a rule ``needs`` (the engine runs it only when they are there), typed.
    def _present(self, need: str) -> Any:
        value = getattr(self, need)
        if value is None:
            raise GpuDiagError(f"this rule needs {NEEDS.get(need, need)}")
        return value

    @property
    def system_report(self) -> SystemReport:
        """The system report, for a rule that ``needs`` "system" or "gpu"."""
        report: SystemReport = self._present("system")
        return report

    @property
    def trace_report(self) -> TraceReport:
        """The trace, for a rule that ``needs`` "trace" or "gpu_trace"."""
        report: TraceReport = self._present("trace")
        return report

    @property
    def scaling_report(self) -> BatchScaling:
        """The step times at two batch sizes, for a rule that ``needs`` "batch_scaling"."""
        report: BatchScaling = self._present("batch_scaling")
        return report

    @property
    def workload_given(self) -> Workload:
        """The workload, for a rule that ``needs`` "workload"."""
        workload: Workload = self._present("workload")
        return workload

    @property
    def environment(self) -> Mapping[str, str]:
        """The job's environment variables, for a rule that ``needs`` "env"."""
        env: Mapping[str, str] = self._present("env")
        return env

    @property
    def monitor_samples(self) -> Samples:
        """The monitor samples, for a rule that ``needs`` "samples"."""
        samples: Samples = self._present("samples")
        return samples

    @property
    def memory_evidence(self) -> MemoryEvidence:
        """The memory evidence, for a rule that ``needs`` "memory"."""
        memory: MemoryEvidence = self._present("memory")
        return memory

    def has(self, need: str) -> bool:
        if need == "gpu":
            return self.system is not None and bool(self.system.gpus)
        if need == "gpu_trace":
            return self.trace is not None and self.trace.has_gpu_events
        return getattr(self, need) is not None
