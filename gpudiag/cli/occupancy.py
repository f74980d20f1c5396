"""Theoretical occupancy of a kernel launch (NVIDIA's occupancy rules), and the best block size."""

from __future__ import annotations

from gpudiag.commands.occupancy import add_arguments, run

__all__ = ["add_arguments", "run"]
