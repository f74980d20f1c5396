"""Memory of a training step: estimate, measure, explain an out-of-memory, find what fits."""

from __future__ import annotations

from gpudiag.commands.memory import add_arguments, run

__all__ = ["add_arguments", "run"]
