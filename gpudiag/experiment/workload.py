"""``gd.Workload``: what a trial runs (defined in :mod:`gpudiag.step`, below the fixes)."""

from __future__ import annotations

from gpudiag.step import Workload, WorkloadError, default_loss, move_to, split_batch

__all__ = ["Workload", "WorkloadError", "default_loss", "move_to", "split_batch"]
