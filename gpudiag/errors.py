"""Errors and warnings a user can cause, each saying what to do next."""

from __future__ import annotations


class GpuDiagError(Exception):
    """Base of every error gpudiag raises on purpose; the message says what to do next."""


class ProbeError(GpuDiagError):
    """The hardware layer could not give an answer (driver, library or permission)."""


class ReplayError(GpuDiagError):
    """A recorded machine (nvidia-smi XML or gpudiag JSON snapshot) could not be read."""


class TraceError(GpuDiagError):
    """A profiler trace is missing, broken or not a Kineto trace."""


class RecipeError(GpuDiagError):
    """A recipe file is malformed, or names a fix or parameter gpudiag does not know."""


class UnsupportedFixError(GpuDiagError):
    """A fix was asked for on hardware or software that cannot take it."""


class GpuDiagWarning(UserWarning):
    """Something worth knowing that does not stop the work."""
