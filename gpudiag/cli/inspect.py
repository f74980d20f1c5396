"""Report the host, the GPUs, the driver and torch (or a recorded machine with --replay)."""

from __future__ import annotations

from gpudiag.commands.inspect import add_arguments, run

__all__ = ["add_arguments", "run"]
