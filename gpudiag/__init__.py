"""gpudiag: why is my GPU job slow or out of memory, what should I change, and did it help?

``import gpudiag`` is light: it imports neither torch, nor NVML bindings, nor plotly. Each
public name is loaded on first use from the one module that owns it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from gpudiag import _views
from gpudiag._version import __version__
from gpudiag.errors import GpuDiagError, GpuDiagWarning

# public name -> (module, attribute); attribute None means the module itself.
_EXPORTS: dict[str, tuple[str, str | None]] = {
    "inspect": ("gpudiag.probe.system", "inspect"),
    "SystemReport": ("gpudiag.probe.system", "SystemReport"),
    "Reading": ("gpudiag.probe.readings", "Reading"),
    "Status": ("gpudiag.probe.readings", "Status"),
    "ReplayBackend": ("gpudiag.probe.replay", "ReplayBackend"),
    "specs": ("gpudiag.specs", None),
    "occupancy": ("gpudiag.analysis.occupancy", "occupancy"),
    "Occupancy": ("gpudiag.analysis.occupancy", "Occupancy"),
    "best_block_size": ("gpudiag.analysis.occupancy", "best_block_size"),
    "occupancy_curve": ("gpudiag.analysis.occupancy", "occupancy_curve"),
    "analyze_trace": ("gpudiag.analysis.trace", "analyze_trace"),
    "TraceReport": ("gpudiag.analysis.trace", "TraceReport"),
    "profile": ("gpudiag.profiling", "profile"),
    "monitor": ("gpudiag.monitoring", "monitor"),
    "Monitor": ("gpudiag.monitoring", "Monitor"),
    "processes": ("gpudiag.probe.processes", "processes"),
    "ProcessReport": ("gpudiag.probe.processes", "ProcessReport"),
    "bench": ("gpudiag.bench", None),
    "roofline": ("gpudiag.analysis.roofline", "roofline"),
    "Workload": ("gpudiag.step", "Workload"),
    "Fix": ("gpudiag.fixes", "Fix"),
    "compare": ("gpudiag.trials", "compare"),
    "Comparison": ("gpudiag.experiment.comparison", "Comparison"),
    "Recipe": ("gpudiag.recipe", "Recipe"),
    "diagnose": ("gpudiag.doctor", "diagnose"),
    "Diagnosis": ("gpudiag.rules", "Diagnosis"),
    "estimate_memory": ("gpudiag.experiment.estimate", "estimate_memory"),
    "MemoryEstimate": ("gpudiag.analysis.memory_estimate", "MemoryEstimate"),
    "memory": ("gpudiag.experiment.memory_report", "memory"),
    "MemoryReport": ("gpudiag.experiment.memory_report", "MemoryReport"),
    "analyze_memory_snapshot": ("gpudiag.analysis.memory_snapshot", "analyze_memory_snapshot"),
    "MemorySnapshot": ("gpudiag.analysis.memory_snapshot", "MemorySnapshot"),
    "SnapshotDiff": ("gpudiag.analysis.snapshot_diff", "SnapshotDiff"),
    "SnapshotRanks": ("gpudiag.analysis.snapshot_diff", "SnapshotRanks"),
    "fit": ("gpudiag.experiment.fit", "fit"),
    "FitResult": ("gpudiag.experiment.fit", "FitResult"),
    "plan": ("gpudiag.experiment.plan", "plan"),
    "Plan": ("gpudiag.experiment.plan", "Plan"),
    "tune": ("gpudiag.tune", "tune"),
    "TuneResult": ("gpudiag.tune", "TuneResult"),
    # Every error a user can cause (gpudiag.errors), as gd.<Name>Error.
    "ArgumentError": ("gpudiag.errors", "ArgumentError"),
    "WorkloadSpecError": ("gpudiag.errors", "WorkloadSpecError"),
    "DistributedError": ("gpudiag.errors", "DistributedError"),
    "PlanError": ("gpudiag.errors", "PlanError"),
    "MemoryMeasurementError": ("gpudiag.errors", "MemoryMeasurementError"),
    "SnapshotError": ("gpudiag.errors", "SnapshotError"),
    "MemoryEstimateError": ("gpudiag.errors", "MemoryEstimateError"),
    "FixConflictError": ("gpudiag.errors", "FixConflictError"),
    "FixError": ("gpudiag.errors", "FixError"),
    "OccupancyInputError": ("gpudiag.errors", "OccupancyInputError"),
    "ProbeError": ("gpudiag.errors", "ProbeError"),
    "PrometheusParseError": ("gpudiag.errors", "PrometheusParseError"),
    "RecipeError": ("gpudiag.errors", "RecipeError"),
    "ReplayError": ("gpudiag.errors", "ReplayError"),
    "SpecsError": ("gpudiag.errors", "SpecsError"),
    "TraceError": ("gpudiag.errors", "TraceError"),
    "TrialStateError": ("gpudiag.errors", "TrialStateError"),
    "StepTimeoutError": ("gpudiag.errors", "StepTimeoutError"),
    "StepExitError": ("gpudiag.errors", "StepExitError"),
    "StepFailedError": ("gpudiag.errors", "StepFailedError"),
    "UnknownComputeCapabilityError": ("gpudiag.errors", "UnknownComputeCapabilityError"),
    "UnsupportedFixError": ("gpudiag.errors", "UnsupportedFixError"),
    "ViewError": ("gpudiag.errors", "ViewError"),
    "WorkloadError": ("gpudiag.errors", "WorkloadError"),
}

# The presentation layer registers the figures and widgets of the results when imported; a
# result's .plot() or .view() loads it on first use (the domain itself never imports it).
_views.add_provider("gpudiag.plots")
_views.add_provider("gpudiag.ui")

# Names whose results a notebook shows with their figure (gpudiag.ui.figures).
_SHOWN_WITH_FIGURES = frozenset({"compare", "Comparison", "diagnose"})


def _register_notebook_displays() -> None:
    """In IPython, show a Comparison with its figure even without ``%load_ext gpudiag``."""
    import sys

    if "IPython" not in sys.modules:
        return
    from IPython import get_ipython

    shell = get_ipython()
    if shell is not None:
        from gpudiag.ui.figures import register_displays

        register_displays(shell)


__all__ = ["GpuDiagError", "GpuDiagWarning", "__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    try:
        module_name, attr = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'gpudiag' has no attribute {name!r}") from None
    module = importlib.import_module(module_name)
    value = module if attr is None else getattr(module, attr)
    if name in _SHOWN_WITH_FIGURES:
        _register_notebook_displays()
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext gpudiag``: registers ``%gpudiag`` / ``%%gpudiag`` (imported lazily)."""
    from gpudiag.magics import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    from gpudiag.magics import unload_ipython_extension as unload

    unload(ipython)


if TYPE_CHECKING:  # pragma: no cover - names for type checkers and IDEs only
    from gpudiag import bench as bench
    from gpudiag import specs as specs
    from gpudiag.analysis.memory_estimate import MemoryEstimate as MemoryEstimate
    from gpudiag.analysis.memory_snapshot import MemorySnapshot as MemorySnapshot
    from gpudiag.analysis.memory_snapshot import (
        analyze_memory_snapshot as analyze_memory_snapshot,
    )
    from gpudiag.analysis.occupancy import Occupancy as Occupancy
    from gpudiag.analysis.occupancy import best_block_size as best_block_size
    from gpudiag.analysis.occupancy import occupancy as occupancy
    from gpudiag.analysis.occupancy import occupancy_curve as occupancy_curve
    from gpudiag.analysis.roofline import roofline as roofline
    from gpudiag.analysis.snapshot_diff import SnapshotDiff as SnapshotDiff
    from gpudiag.analysis.snapshot_diff import SnapshotRanks as SnapshotRanks
    from gpudiag.analysis.trace import TraceReport as TraceReport
    from gpudiag.analysis.trace import analyze_trace as analyze_trace
    from gpudiag.doctor import diagnose as diagnose
    from gpudiag.errors import ArgumentError as ArgumentError
    from gpudiag.errors import DistributedError as DistributedError
    from gpudiag.errors import FixConflictError as FixConflictError
    from gpudiag.errors import FixError as FixError
    from gpudiag.errors import MemoryEstimateError as MemoryEstimateError
    from gpudiag.errors import MemoryMeasurementError as MemoryMeasurementError
    from gpudiag.errors import OccupancyInputError as OccupancyInputError
    from gpudiag.errors import PlanError as PlanError
    from gpudiag.errors import ProbeError as ProbeError
    from gpudiag.errors import PrometheusParseError as PrometheusParseError
    from gpudiag.errors import RecipeError as RecipeError
    from gpudiag.errors import ReplayError as ReplayError
    from gpudiag.errors import SnapshotError as SnapshotError
    from gpudiag.errors import SpecsError as SpecsError
    from gpudiag.errors import StepExitError as StepExitError
    from gpudiag.errors import StepFailedError as StepFailedError
    from gpudiag.errors import StepTimeoutError as StepTimeoutError
    from gpudiag.errors import TraceError as TraceError
    from gpudiag.errors import TrialStateError as TrialStateError
    from gpudiag.errors import UnknownComputeCapabilityError as UnknownComputeCapabilityError
    from gpudiag.errors import UnsupportedFixError as UnsupportedFixError
    from gpudiag.errors import ViewError as ViewError
    from gpudiag.errors import WorkloadError as WorkloadError
    from gpudiag.errors import WorkloadSpecError as WorkloadSpecError
    from gpudiag.experiment.comparison import Comparison as Comparison
    from gpudiag.experiment.estimate import estimate_memory as estimate_memory
    from gpudiag.experiment.fit import FitResult as FitResult
    from gpudiag.experiment.fit import fit as fit
    from gpudiag.experiment.memory_report import MemoryReport as MemoryReport
    from gpudiag.experiment.memory_report import memory as memory
    from gpudiag.experiment.plan import Plan as Plan
    from gpudiag.experiment.plan import plan as plan
    from gpudiag.fixes import Fix as Fix
    from gpudiag.monitoring import Monitor as Monitor
    from gpudiag.monitoring import monitor as monitor
    from gpudiag.probe.processes import ProcessReport as ProcessReport
    from gpudiag.probe.processes import processes as processes
    from gpudiag.probe.readings import Reading as Reading
    from gpudiag.probe.readings import Status as Status
    from gpudiag.probe.replay import ReplayBackend as ReplayBackend
    from gpudiag.probe.system import SystemReport as SystemReport
    from gpudiag.probe.system import inspect as inspect
    from gpudiag.profiling import profile as profile
    from gpudiag.recipe import Recipe as Recipe
    from gpudiag.rules import Diagnosis as Diagnosis
    from gpudiag.step import Workload as Workload
    from gpudiag.trials import compare as compare
    from gpudiag.tune import TuneResult as TuneResult
    from gpudiag.tune import tune as tune
