"""Rules: evidence in, findings out, ranked; the rules that could not run say why.

``gd.diagnose`` (gathering the evidence, profiling a workload) lives above this package, in
``gpudiag.doctor``.
"""

from __future__ import annotations

from gpudiag.rules.engine import (
    REGISTRY,
    Diagnosis,
    EvidenceBundle,
    Rule,
    load_rules,
    rule,
    run_rules,
)
from gpudiag.rules.finding import Evidence, Finding, FixRef, NotEvaluated, Severity

__all__ = [
    "REGISTRY",
    "Diagnosis",
    "Evidence",
    "EvidenceBundle",
    "Finding",
    "FixRef",
    "NotEvaluated",
    "Rule",
    "Severity",
    "load_rules",
    "rule",
    "run_rules",
]
