"""Before/after statistics: measurements that describe their noise, bootstrap speedups, verdicts."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Literal

import numpy as np

from gpudiag.analysis.measurement import SPREAD_WARNING as SPREAD_WARNING
from gpudiag.analysis.measurement import Measurement as Measurement
from gpudiag.analysis.verdict import (
    FASTER,
    NO_DIFFERENCE,
    SLOWER,
    UNDECIDED,
    Judgement,
    SpeedupEstimate,
    VerdictPlan,
    judge,
)
from gpudiag.analysis.verdict import interval_verdict as verdict
from gpudiag.errors import ArgumentError

PAIRED_METHOD = "median of per-round ratios, bootstrap over rounds"
UNPAIRED_METHOD = "ratio of medians, independent bootstrap"


def speedup_ci(
    baseline_s: Sequence[float],
    candidate_s: Sequence[float],
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
    paired: bool | None = None,
) -> SpeedupEstimate:
    """Baseline time / candidate time with a percentile bootstrap interval (seeded).

    Paired (one sample of each arm per round, the default when the lengths match): the
    median of the per-round ratios, rounds resampled whole. Two arms timed back to back share
    the machine's slow moments; a per-round ratio cancels them, which on a shared machine
    narrows the interval several-fold. Unpaired: the ratio of the two medians, each arm
    resampled on its own.
    """
    b = np.asarray(baseline_s, dtype=float)
    c = np.asarray(candidate_s, dtype=float)
    if b.size == 0 or c.size == 0:
        return SpeedupEstimate(
            math.nan, math.nan, math.nan, confidence, "no samples", 0, b.size, c.size
        )
    if not 0.0 < confidence < 1.0:
        raise ArgumentError(f"confidence must be between 0 and 1, got {confidence}")
    if paired is None:
        paired = b.size == c.size
    rng = np.random.default_rng(seed)
    if paired:
        if b.size != c.size:
            raise ArgumentError("a paired bootstrap needs as many baseline as candidate samples")
        ratios = b / c
        value = float(np.median(ratios))
        idx = rng.integers(0, b.size, size=(resamples, b.size))
        boot = np.median(ratios[idx], axis=1)
        method = PAIRED_METHOD
    else:
        value = float(np.median(b) / np.median(c))
        ib = rng.integers(0, b.size, size=(resamples, b.size))
        ic = rng.integers(0, c.size, size=(resamples, c.size))
        boot = np.median(b[ib], axis=1) / np.median(c[ic], axis=1)
        method = UNPAIRED_METHOD
    alpha = 1.0 - confidence
    low, high = np.quantile(boot, [alpha / 2, 1 - alpha / 2])
    return SpeedupEstimate(
        value, float(low), float(high), confidence, method, resamples, b.size, c.size
    )


StopReason = Literal["undecided", "clear", "equivalent", "time budget", "max rounds"]


@dataclass(frozen=True)
class StopDecision:
    stop: bool
    reason: StopReason
    judgement: Judgement | None = None

    @property
    def look(self) -> str:
        """The verdict of the last look ("undecided" before the first)."""
        return self.judgement.verdict if self.judgement is not None else UNDECIDED


@dataclass(frozen=True)
class AdaptiveRule(VerdictPlan):
    """When an adaptive comparison stops looking at one arm (see gpudiag.analysis.verdict):
    the verdict plan, and the time budget of the whole comparison.

    The arm is looked at on the plan's schedule; it stops at the first look that decides it
    (faster, slower, or inside the ``equivalence`` margin), or when the time budget or
    ``max_rounds`` runs out, whose stop is the last look (possibly "undecided"). The error
    rate over all looks is ``1 - confidence``.
    """

    time_budget_s: float = 60.0

    @property
    def plan(self) -> VerdictPlan:
        """The verdict plan alone (what ``judge`` and the result's text read)."""
        return VerdictPlan(**{f.name: getattr(self, f.name) for f in fields(VerdictPlan)})


@dataclass
class AdaptiveStopper:
    """Tracks the looks at one arm; ``update`` after every round says whether to stop."""

    rule: AdaptiveRule
    history: list[Judgement] = field(default_factory=list)
    decided: StopDecision | None = None

    def update(
        self,
        baseline_s: Sequence[float],
        candidate_s: Sequence[float],
        *,
        rounds: int,
        elapsed_s: float,
        round_s: float | None = None,
    ) -> StopDecision:
        if self.decided is not None:
            return self.decided
        rule, plan = self.rule, self.rule.plan
        out_of_time = elapsed_s >= rule.time_budget_s
        last = rounds >= rule.max_rounds or out_of_time
        look = judge(baseline_s, candidate_s, plan, final=last, round_s=round_s)
        if look.looked:
            self.history.append(look)
        if look.verdict in (FASTER, SLOWER):
            self.decided = StopDecision(True, "clear", look)
        elif look.verdict == NO_DIFFERENCE:
            self.decided = StopDecision(True, "equivalent", look)
        elif rounds >= rule.max_rounds:
            self.decided = StopDecision(True, "max rounds", look)
        elif out_of_time:
            self.decided = StopDecision(True, "time budget", look)
        return self.decided or StopDecision(False, "undecided", look)


def describe_stop(reason: str) -> str:
    return {
        "clear": "the verdict was clear",
        "equivalent": "any difference was shown to be small",
        "time budget": "the time budget ran out",
        "max rounds": "the maximum number of rounds was reached",
        "fixed": "fixed number of rounds (adaptive stopping off)",
        "not applied": "the fix did not take effect: not timed",
    }.get(reason, reason)


__all__ = [
    "FASTER",
    "NO_DIFFERENCE",
    "PAIRED_METHOD",
    "SLOWER",
    "SPREAD_WARNING",
    "UNDECIDED",
    "UNPAIRED_METHOD",
    "AdaptiveRule",
    "AdaptiveStopper",
    "Judgement",
    "Measurement",
    "SpeedupEstimate",
    "StopDecision",
    "VerdictPlan",
    "describe_stop",
    "judge",
    "speedup_ci",
    "verdict",
]
