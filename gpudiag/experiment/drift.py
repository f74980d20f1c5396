"""Numerical drift of a fix: loss and gradient norm vs the baseline, same steps and seeds."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from gpudiag._report import FieldsDict

DriftStatus = Literal["ok", "large", "non-finite", "not measured"]

# A sound precision change moves the loss of a few steps by well under 1 % (bf16 autocast on the
# demo GPT, measured on the CPU: loss 0.0085 %, gradient norm 0.0093 % over 3 steps). Above
# these limits, treat the fix as changing the training, not just its speed.
LOSS_DRIFT_LIMIT = 0.02
GRAD_NORM_DRIFT_LIMIT = 0.10


@dataclass(frozen=True)
class StepTrace(FieldsDict):
    """Loss and gradient norm (before clipping) at each step of a seeded run from one state."""

    losses: tuple[float | None, ...] = ()  # None: the step returned no loss
    grad_norms: tuple[float | None, ...] = ()


def percent(fraction: float) -> str:
    """0.000254 -> '0.025%': two significant digits, however small."""
    if not math.isfinite(fraction):
        return "inf"
    return f"{fraction * 100:.2g}%"


def _rel(a: float | None, b: float | None) -> float | None:
    if a is None or b is None:
        return None
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    scale = max(abs(a), 1e-12)
    return abs(b - a) / scale


def _max_rel(base: Sequence[float | None], other: Sequence[float | None]) -> float | None:
    values = [r for r in (_rel(a, b) for a, b in zip(base, other, strict=False)) if r is not None]
    return max(values) if values else None


@dataclass(frozen=True)
class Drift(FieldsDict):
    """How far a fix moves the numbers: largest relative difference over the drift steps.

    ``loss_rel`` / ``grad_norm_rel``: max over steps of |fix - baseline| / |baseline|.
    ``floor_*``: the same between two baseline runs (what nondeterminism alone gives).
    """

    steps: int
    loss_rel: float | None
    grad_norm_rel: float | None
    floor_loss_rel: float | None
    floor_grad_norm_rel: float | None
    status: DriftStatus
    baseline: StepTrace = field(default_factory=StepTrace)
    candidate: StepTrace = field(default_factory=StepTrace)
    note: str = ""

    @property
    def acceptable(self) -> bool:
        return self.status == "ok"

    def __str__(self) -> str:
        if self.status == "not measured":
            return f"not measured ({self.note})" if self.note else "not measured"
        parts = []
        if self.loss_rel is not None:
            parts.append(f"loss {percent(self.loss_rel)}")
        if self.grad_norm_rel is not None:
            parts.append(f"grad norm {percent(self.grad_norm_rel)}")
        text = ", ".join(parts) or "no numbers"
        return text if self.status == "ok" else f"{text} ({self.status.upper()})"


def not_measured(note: str) -> Drift:
    return Drift(0, None, None, None, None, "not measured", note=note)


def compare_traces(
    baseline: StepTrace,
    candidate: StepTrace,
    floor: StepTrace | None = None,
    *,
    loss_limit: float = LOSS_DRIFT_LIMIT,
    grad_norm_limit: float = GRAD_NORM_DRIFT_LIMIT,
) -> Drift:
    """Drift of ``candidate`` from ``baseline``; ``floor`` is a second baseline run."""
    if all(v is None for v in baseline.losses) or all(v is None for v in candidate.losses):
        return not_measured("the step returned no loss")
    loss_rel = _max_rel(baseline.losses, candidate.losses)
    grad_rel = _max_rel(baseline.grad_norms, candidate.grad_norms)
    floor_loss = _max_rel(baseline.losses, floor.losses) if floor else None
    floor_grad = _max_rel(baseline.grad_norms, floor.grad_norms) if floor else None
    finite = all(v is None or math.isfinite(v) for v in (*candidate.losses, *candidate.grad_norms))
    status: DriftStatus = "ok"
    if not finite:
        status = "non-finite"
    elif (loss_rel is not None and loss_rel > loss_limit) or (
        grad_rel is not None and grad_rel > grad_norm_limit
    ):
        status = "large"
    return Drift(
        steps=min(len(baseline.losses), len(candidate.losses)),
        loss_rel=loss_rel,
        grad_norm_rel=grad_rel,
        floor_loss_rel=floor_loss,
        floor_grad_norm_rel=floor_grad,
        status=status,
        baseline=baseline,
        candidate=candidate,
    )
