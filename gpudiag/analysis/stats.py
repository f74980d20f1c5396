"""Before/after statistics: measurements that describe their noise, bootstrap speedups, verdicts."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from gpudiag._report import jsonable
from gpudiag.analysis.measurement import SPREAD_WARNING as SPREAD_WARNING
from gpudiag.analysis.measurement import Measurement as Measurement
from gpudiag.errors import ArgumentError

Verdict = Literal["faster", "slower", "no significant difference"]
FASTER: Verdict = "faster"
SLOWER: Verdict = "slower"
NO_DIFFERENCE: Verdict = "no significant difference"

PAIRED_METHOD = "median of per-round ratios, bootstrap over rounds"
UNPAIRED_METHOD = "ratio of medians, independent bootstrap"


@dataclass(frozen=True)
class SpeedupEstimate:
    """Baseline time / candidate time, with a bootstrap confidence interval.

    ``value`` > 1 means the candidate is faster. ``low``/``high`` bound the interval at
    ``confidence``; ``method`` says how it was resampled.
    """

    value: float
    low: float
    high: float
    confidence: float = 0.95
    method: str = ""
    resamples: int = 0
    n_baseline: int = 0
    n_candidate: int = 0

    def verdict(self, tolerance: float = 0.0) -> Verdict:
        return verdict(self, tolerance=tolerance)

    def __str__(self) -> str:
        pct = f"{self.confidence:.0%}"
        return f"{self.value:.2f}x ({pct} CI {self.low:.2f}-{self.high:.2f}x)"

    def __repr__(self) -> str:
        return f"SpeedupEstimate({self})"

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "value": self.value,
                "low": self.low,
                "high": self.high,
                "confidence": self.confidence,
                "method": self.method,
                "resamples": self.resamples,
                "n_baseline": self.n_baseline,
                "n_candidate": self.n_candidate,
            }
        )


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


def verdict(estimate: SpeedupEstimate, *, tolerance: float = 0.0) -> Verdict:
    """'faster' / 'slower' only when the whole interval clears ``1 +- tolerance``.

    ``tolerance`` is the smallest change worth a claim (0.01 = 1 %): below it, step timing on
    a shared machine cannot tell a real effect from the order the arms ran in.
    """
    if not (math.isfinite(estimate.low) and math.isfinite(estimate.high)):
        return NO_DIFFERENCE
    if estimate.low > 1.0 + tolerance:
        return FASTER
    if estimate.high < 1.0 / (1.0 + tolerance):
        return SLOWER
    return NO_DIFFERENCE


Look = Literal["faster", "slower", "equivalent", "undecided"]
StopReason = Literal["undecided", "clear", "equivalent", "time budget", "max rounds"]


@dataclass(frozen=True)
class StopDecision:
    stop: bool
    reason: StopReason
    look: Look = "undecided"


@dataclass(frozen=True)
class AdaptiveRule:
    """When an adaptive comparison may stop looking at one arm.

    Each look after ``min_rounds`` computes the speedup interval at ``confidence`` (stricter
    than the reported 95 %: looking again and again would otherwise find "significant"
    differences by chance). The arm is decided when ``agreeing_looks`` looks in a row clear
    ``1 +- tolerance`` the same way, or when the interval lies inside ``1 +- equivalence``
    (any difference is smaller than that: further rounds would not change the answer that
    matters). The time budget and ``max_rounds`` stop everything regardless.
    """

    min_rounds: int = 5
    max_rounds: int = 100
    time_budget_s: float = 60.0
    confidence: float = 0.99
    agreeing_looks: int = 2
    tolerance: float = 0.01
    equivalence: float = 0.05
    resamples: int = 1000
    seed: int = 0

    def __post_init__(self) -> None:
        if self.min_rounds < 2:
            raise ArgumentError("min_rounds must be at least 2")
        if self.max_rounds < self.min_rounds:
            raise ArgumentError("max_rounds must be at least min_rounds")

    def look(self, baseline_s: Sequence[float], candidate_s: Sequence[float]) -> Look:
        est = speedup_ci(
            baseline_s,
            candidate_s,
            confidence=self.confidence,
            resamples=self.resamples,
            seed=self.seed,
        )
        v = verdict(est, tolerance=self.tolerance)
        if v == FASTER:
            return "faster"
        if v == SLOWER:
            return "slower"
        if est.low >= 1.0 / (1.0 + self.equivalence) and est.high <= 1.0 + self.equivalence:
            return "equivalent"
        return "undecided"


@dataclass
class AdaptiveStopper:
    """Tracks the looks at one arm; ``update`` after every round says whether to stop."""

    rule: AdaptiveRule
    history: list[Look] = field(default_factory=list)
    decided: StopDecision | None = None

    def update(
        self,
        baseline_s: Sequence[float],
        candidate_s: Sequence[float],
        *,
        rounds: int,
        elapsed_s: float,
    ) -> StopDecision:
        if self.decided is not None:
            return self.decided
        rule = self.rule
        look: Look = "undecided"
        if rounds >= rule.min_rounds:
            look = rule.look(baseline_s, candidate_s)
            self.history.append(look)
            recent = self.history[-rule.agreeing_looks :]
            if look == "equivalent":
                self.decided = StopDecision(True, "equivalent", look)
            elif (
                look in (FASTER, SLOWER)
                and len(recent) == rule.agreeing_looks
                and len(set(recent)) == 1
            ):
                self.decided = StopDecision(True, "clear", look)
        if self.decided is None and rounds >= rule.max_rounds:
            self.decided = StopDecision(True, "max rounds", look)
        if self.decided is None and elapsed_s >= rule.time_budget_s:
            self.decided = StopDecision(True, "time budget", look)
        return self.decided or StopDecision(False, "undecided", look)


def describe_stop(reason: str) -> str:
    return {
        "clear": "the verdict was clear",
        "equivalent": "any difference was shown to be small",
        "time budget": "the time budget ran out",
        "max rounds": "the maximum number of rounds was reached",
        "fixed": "fixed number of rounds (adaptive stopping off)",
    }.get(reason, reason)
