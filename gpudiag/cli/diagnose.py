"""Diagnose a run (system, trace, demo workload); under torchrun, every rank in one report.

The terminal's ``doctor`` command (``diagnose`` is its alias): see gpudiag.commands.doctor.
"""

from __future__ import annotations

from gpudiag.commands.doctor import add_arguments, run

__all__ = ["add_arguments", "run"]
