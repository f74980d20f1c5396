"""Errors and warnings a user can cause, each saying what to do next.

Every error gpudiag raises on purpose is defined here and reachable as ``gd.<Name>Error``.
Those that replaced a ``ValueError`` keep ``ValueError`` as a second base, so code that
caught the ``ValueError`` still catches them.
"""

from __future__ import annotations


class GpuDiagError(Exception):
    """Base of every error gpudiag raises on purpose; the message says what to do next."""


class ArgumentError(GpuDiagError, ValueError):
    """A value passed to gpudiag is out of its range; the message names the value and the range."""


class ProbeError(GpuDiagError):
    """The hardware layer could not give an answer (driver, library or permission)."""


class PrometheusParseError(ProbeError, ValueError):
    """A line is not Prometheus text exposition format; the message names the line."""


class ReplayError(GpuDiagError):
    """A recorded machine (nvidia-smi XML or gpudiag JSON snapshot) could not be read."""


class SpecsError(GpuDiagError, ValueError):
    """A spec look-up got something it cannot interpret."""


class UnknownComputeCapabilityError(SpecsError):
    """The compute capability is not one gpudiag has per-SM limits for."""


class OccupancyInputError(GpuDiagError, ValueError):
    """An occupancy question with values no CUDA kernel can have."""


class TraceError(GpuDiagError):
    """A profiler trace is missing, broken or not a Kineto trace."""


class FixError(GpuDiagError, ValueError):
    """An unknown fix id, a bad parameter, or two fixes that cannot go together."""


class FixConflictError(FixError):
    """Two fixes that change the same thing were asked for in one trial."""


class UnsupportedFixError(GpuDiagError):
    """A fix was asked for on hardware or software that cannot take it."""


class WorkloadError(GpuDiagError, ValueError):
    """A workload was described in a way gpudiag cannot run."""


class StepTimeoutError(GpuDiagError, TimeoutError):
    """A training step (or a notebook cell run as one) did not finish within its time limit."""


class StepFailedError(WorkloadError):
    """The workload's own code (its loss, batch or step function) raised; the original
    exception, with its traceback, is the ``__cause__``."""


class StepExitError(WorkloadError):
    """A training step (or a notebook cell run as one) called ``sys.exit`` during a trial."""


class TrialStateError(GpuDiagError):
    """After a trial the user's state differs from the snapshot (a gpudiag bug: please report)."""


class RecipeError(GpuDiagError):
    """A recipe file is malformed, or names a fix or parameter gpudiag does not know."""


class ViewError(GpuDiagError):
    """No figure or widget is registered for a result (the presentation layer is missing)."""


class MemoryEstimateError(GpuDiagError, ValueError):
    """A memory estimate was asked for with arguments it cannot use."""


class SnapshotError(GpuDiagError):
    """A memory snapshot file is missing, unsafe, or not a CUDA allocator snapshot."""


class MemoryMeasurementError(GpuDiagError):
    """A step's memory could not be traced or measured (the reason says why)."""


class PlanError(GpuDiagError, ValueError):
    """A plan was asked for with arguments it cannot use."""


class DistributedError(GpuDiagError, RuntimeError):
    """A distributed run could not start or finish (launch, rendezvous, a rank's failure)."""


class WorkloadSpecError(GpuDiagError, ValueError):
    """A workload description that a rank could not rebuild."""


class GpuDiagWarning(UserWarning):
    """Something worth knowing that does not stop the work."""


__all__ = [
    "ArgumentError",
    "DistributedError",
    "FixConflictError",
    "FixError",
    "GpuDiagError",
    "GpuDiagWarning",
    "MemoryEstimateError",
    "MemoryMeasurementError",
    "OccupancyInputError",
    "PlanError",
    "ProbeError",
    "PrometheusParseError",
    "RecipeError",
    "ReplayError",
    "SnapshotError",
    "SpecsError",
    "StepExitError",
    "StepFailedError",
    "StepTimeoutError",
    "TraceError",
    "TrialStateError",
    "UnknownComputeCapabilityError",
    "UnsupportedFixError",
    "ViewError",
    "WorkloadError",
    "WorkloadSpecError",
]
