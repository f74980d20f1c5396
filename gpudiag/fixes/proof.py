"""Proof of effect: did a fix change the step it was applied to?

A trial runs one untimed, warm step of each arm (the baseline too) and keeps what it saw: an
:class:`Observation` (the arm's transformed Step, the operators and dtypes it ran, compiled
regions, torch's switches and the environment read inside the arm). Each fix's
``FixSpec.proof(params, arm, baseline)`` reads it and returns a :class:`Proof`: applied (with
the evidence), not applied (with the reason and the change to make by hand), or unverified
(with why nothing could tell). A trial judges an arm only when none of its fixes is "not
applied"; an unverified fix keeps its verdict, labelled so.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpudiag._report import jsonable

if TYPE_CHECKING:
    from gpudiag.profiling.census import CompiledRuns, OpCensus
    from gpudiag.step import Step


class ProofStatus(str, enum.Enum):
    APPLIED = "applied"
    NOT_APPLIED = "not applied"
    UNVERIFIED = "unverified"


@dataclass(frozen=True)
class Proof:
    """Whether one fix took effect in an arm's own step, and the evidence.

    ``evidence``: what was seen (``"2 fused (flash) attention calls; baseline: 2 softmax
    between matmuls"``). ``reason``: why it did not take effect, or why it cannot be told.
    ``manual``: the change to make by hand when the fix cannot reach the code.
    """

    fix: str
    status: ProofStatus
    evidence: str = ""
    reason: str = ""
    manual: str = ""

    @property
    def applied(self) -> bool:
        return self.status is ProofStatus.APPLIED

    @property
    def not_applied(self) -> bool:
        return self.status is ProofStatus.NOT_APPLIED

    def __str__(self) -> str:
        if self.status is ProofStatus.APPLIED:
            return (
                f"{self.fix}: applied ({self.evidence})"
                if self.evidence
                else f"{self.fix}: applied"
            )
        text = f"{self.fix}: {self.status.value}: {self.reason}"
        if self.manual:
            text += f". By hand: {self.manual}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "fix": self.fix,
                "status": self.status.value,
                "evidence": self.evidence,
                "reason": self.reason,
                "manual": self.manual,
            }
        )


def applied(fix: str, evidence: str) -> Proof:
    return Proof(fix, ProofStatus.APPLIED, evidence)


def not_applied(fix: str, reason: str, manual: str = "", evidence: str = "") -> Proof:
    return Proof(fix, ProofStatus.NOT_APPLIED, evidence, reason, manual)


def unverified(fix: str, reason: str, evidence: str = "") -> Proof:
    return Proof(fix, ProofStatus.UNVERIFIED, evidence, reason)


@dataclass(frozen=True)
class Observation:
    """What one arm's own step showed (one untimed, warm step, run inside the arm).

    ``step``: the arm's Step as its fixes transformed it (model, optimizer, dataloader,
    micro-batch and accumulation, autocast dtype, scaler, the fixes' ``state``). ``ops``: the
    operators the step dispatched (None when they were not counted: ``ops_missing`` says why,
    e.g. compiled code bypasses the dispatcher). ``compiled``: torch.compile's regions that
    ran (observed instead of ``ops`` for a compiled arm). ``switches``: torch's process-wide
    switches read inside the arm (``"cudnn.benchmark"``, ``"cuda.matmul.allow_tf32"``, the
    SDPA backend enables, ...). ``environ``: the environment variables of the trial process.
    ``dynamo``: Dynamo's counters over the arm's steps so far (frames compiled, graph breaks).
    """

    step: Step
    ops: OpCensus | None = None
    ops_missing: str = ""
    compiled: CompiledRuns | None = None
    switches: Mapping[str, Any] = field(default_factory=dict)
    environ: Mapping[str, str] = field(default_factory=dict)
    dynamo: Mapping[str, int] = field(default_factory=dict)


__all__ = [
    "Observation",
    "Proof",
    "ProofStatus",
    "applied",
    "not_applied",
    "unverified",
]
