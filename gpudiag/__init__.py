"""gpudiag: why is my GPU job slow or out of memory, what should I change, and did it help?

``import gpudiag`` is light: it imports neither torch, nor NVML bindings, nor plotly. Each
public name is loaded on first use from the one module that owns it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from gpudiag.errors import GpuDiagError, GpuDiagWarning

__version__ = "0.1.0"

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
    "bench": ("gpudiag.bench", None),
    "roofline": ("gpudiag.analysis.roofline", "roofline"),
    "Workload": ("gpudiag.step", "Workload"),
    "Fix": ("gpudiag.fixes", "Fix"),
    "compare": ("gpudiag.experiment.compare", "compare"),
    "Comparison": ("gpudiag.experiment.compare", "Comparison"),
    "Recipe": ("gpudiag.recipe", "Recipe"),
    "diagnose": ("gpudiag.rules", "diagnose"),
    "Diagnosis": ("gpudiag.rules", "Diagnosis"),
}

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
    from gpudiag.analysis.occupancy import Occupancy as Occupancy
    from gpudiag.analysis.occupancy import best_block_size as best_block_size
    from gpudiag.analysis.occupancy import occupancy as occupancy
    from gpudiag.analysis.occupancy import occupancy_curve as occupancy_curve
    from gpudiag.analysis.roofline import roofline as roofline
    from gpudiag.analysis.trace import TraceReport as TraceReport
    from gpudiag.analysis.trace import analyze_trace as analyze_trace
    from gpudiag.experiment.compare import Comparison as Comparison
    from gpudiag.experiment.compare import compare as compare
    from gpudiag.fixes import Fix as Fix
    from gpudiag.monitoring import Monitor as Monitor
    from gpudiag.monitoring import monitor as monitor
    from gpudiag.probe.readings import Reading as Reading
    from gpudiag.probe.readings import Status as Status
    from gpudiag.probe.replay import ReplayBackend as ReplayBackend
    from gpudiag.probe.system import SystemReport as SystemReport
    from gpudiag.probe.system import inspect as inspect
    from gpudiag.profiling import profile as profile
    from gpudiag.recipe import Recipe as Recipe
    from gpudiag.rules import Diagnosis as Diagnosis
    from gpudiag.rules import diagnose as diagnose
    from gpudiag.step import Workload as Workload
