"""Before/after experiments: isolated trials, the ``gd.compare`` protocol and its results.

The names other code builds on, loaded on first use (``import gpudiag.experiment`` imports
none of torch): ``Arm`` (one arm of a trial, ``runner``), ``Comparison`` / ``ArmResult`` (the
results of the protocol in the ``compare`` module), and the verdict rule the trials share,
``VerdictPlan`` / ``judge`` / ``Judgement`` (``gpudiag.analysis.verdict``).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "Arm": "gpudiag.experiment.runner",
    "ArmResult": "gpudiag.experiment.comparison",
    "Comparison": "gpudiag.experiment.comparison",
    "Judgement": "gpudiag.analysis.verdict",
    "VerdictPlan": "gpudiag.analysis.verdict",
    "judge": "gpudiag.analysis.verdict",
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'gpudiag.experiment' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


__all__ = sorted(_EXPORTS)
