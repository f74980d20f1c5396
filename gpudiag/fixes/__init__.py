"""Fixes a trial can apply: ``gd.Fix(id, **params)`` over a registry keyed by stable fix ids.

Each fix says whether this machine can take it (``supported(system) -> (ok, reason)``), how
it reaches the code (ambient switch, structural transform, environment variable, advice),
and applies / reverts itself.
"""

from __future__ import annotations

from gpudiag.fixes.base import (
    AppliedFixes,
    Fix,
    FixConflictError,
    FixError,
    FixKind,
    FixParams,
    FixSpec,
    Need,
    Observation,
    Proof,
    ProofStatus,
    Step,
    apply_fixes,
    check_conflicts,
    get_spec,
    parse_value,
    registry,
)

__all__ = [
    "AppliedFixes",
    "Fix",
    "FixConflictError",
    "FixError",
    "FixKind",
    "FixParams",
    "FixSpec",
    "Need",
    "Observation",
    "Proof",
    "ProofStatus",
    "Step",
    "apply_fixes",
    "check_conflicts",
    "get_spec",
    "parse_value",
    "registry",
]
