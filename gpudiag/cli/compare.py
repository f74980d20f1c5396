"""Compare a demo workload before/after fixes: speedup with CI, verdict, memory, drift."""

from __future__ import annotations

from gpudiag.commands.compare import add_arguments, run

__all__ = ["add_arguments", "run"]
