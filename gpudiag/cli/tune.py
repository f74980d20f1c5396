"""Search the fixes the diagnosis points to for the fastest measured combination, in a budget."""

from __future__ import annotations

from gpudiag.commands.tune import add_arguments, run

__all__ = ["add_arguments", "run"]
