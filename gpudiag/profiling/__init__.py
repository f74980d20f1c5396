"""``gd.profile``: run a step function under torch.profiler, save the trace and analyse it."""

from __future__ import annotations

from gpudiag.profiling.capture import DEFAULT_TRACE_DIR, profile

__all__ = ["DEFAULT_TRACE_DIR", "profile"]
