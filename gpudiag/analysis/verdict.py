"""No verdict without evidence: a sequential before/after verdict with a stated error rate.

An arm and the baseline run once per round, in a random order, so each round gives one ratio
``baseline time / arm time``. The speedup is the median of those ratios; its interval is the
exact, distribution-free one for a median (the sign test's order statistics: with ``n``
rounds, ``[r_(k), r_(n-k+1)]`` covers the true median with probability at least
``1 - 2 P(Binomial(n, 1/2) < k)``). It needs no assumption about the noise (heavy tails,
outliers, a busy machine), only that rounds are independent and the order within a round
random.

A comparison looks at its rounds more than once (it stops early when the answer is clear), and
every look is a chance to be wrong. The looks are planned (:class:`VerdictPlan`: from the first
round count at which a verdict is possible, then each ``growth`` times the last, and
``max_rounds``) and each gets ``1 - confidence`` divided by their number (Bonferroni), so the
interval reported at whichever look the comparison stops is a valid ``confidence`` interval
and the chance that an A/A comparison (a fix that changes nothing) is called faster or slower
is at most ``1 - confidence`` (``benchmarks/aa_false_verdicts.py`` measures it). A stop forced
by the time budget or the round limit is one of the planned looks: it takes the place of the
next one.

Verdicts: "faster" / "slower" when the interval clears ``1 +- tolerance``; "no significant
difference" when it lies inside ``1 +- equivalence`` (the stated margin); otherwise
"undecided", with the rounds (and time) that would likely decide it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gpudiag._report import jsonable
from gpudiag.errors import ArgumentError
from gpudiag.units import WAIT, format_seconds

Verdict = Literal["faster", "slower", "no significant difference", "undecided"]
FASTER: Verdict = "faster"
SLOWER: Verdict = "slower"
NO_DIFFERENCE: Verdict = "no significant difference"
UNDECIDED: Verdict = "undecided"
# Not a verdict of this module: a trial whose fix did not take effect is never judged.
NOT_APPLIED = "not applied"

SIGN_METHOD = "median of per-round ratios; exact sign-test interval (distribution-free)"


def percent(confidence: float) -> str:
    """A confidence as a percentage: whole (95%, 99%) unless that would read 100% (99.69%)."""
    whole = f"{confidence:.0%}"
    return whole if whole != "100%" or confidence >= 1 else f"{confidence:.2%}"


def _log_binomial_half(n: int, i: int) -> float:
    """log P(Binomial(n, 1/2) = i)."""
    return math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) - n * math.log(2.0)


def sign_rank(n: int, confidence: float) -> int:
    """The largest ``k`` (1-based) such that ``[r_(k), r_(n-k+1)]`` of ``n`` sorted values
    covers their population median with probability ``>= confidence``; 0 when ``n`` values
    are too few for any such interval."""
    if not 0.0 < confidence < 1.0:
        raise ArgumentError(f"confidence must be between 0 and 1, got {confidence}")
    tail = (1.0 - confidence) / 2.0
    cumulative = 0.0
    k = 0
    for i in range((n + 1) // 2):
        cumulative += math.exp(_log_binomial_half(n, i))
        if cumulative > tail * (1 + 1e-12):
            break
        k = i + 1
    return k


def fewest_rounds(confidence: float) -> int:
    """The fewest rounds that give any interval at ``confidence`` (2 / 2**n <= 1 - confidence)."""
    n = 1
    while sign_rank(n, confidence) < 1:
        n += 1
    return n


@dataclass(frozen=True)
class SpeedupEstimate:
    """Baseline time / candidate time with its interval.

    ``value`` > 1 means the candidate is faster. ``low`` / ``high`` bound the interval at
    ``confidence``; they are infinite when the rounds are too few for any interval at that
    confidence. ``method`` says how the interval was made; ``looks`` is how many planned looks
    share the error rate (1 for a single look).
    """

    value: float
    low: float
    high: float
    confidence: float = 0.95
    method: str = ""
    resamples: int = 0
    n_baseline: int = 0
    n_candidate: int = 0
    looks: int = 1

    @property
    def bounded(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)

    def verdict(self, tolerance: float = 0.0, equivalence: float = 0.05) -> Verdict:
        return interval_verdict(self, tolerance=tolerance, equivalence=equivalence)

    def __str__(self) -> str:
        pct = percent(self.confidence)
        if not self.bounded:
            n = min(self.n_baseline, self.n_candidate)
            return f"{self.value:.2f}x (no {pct} interval from {n} round(s))"
        return f"{self.value:.2f}x ({pct} CI {self.low:.2f}-{self.high:.2f}x)"

    def __repr__(self) -> str:
        return f"SpeedupEstimate({self})"

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "value": self.value,
                "low": self.low if math.isfinite(self.low) else None,
                "high": self.high if math.isfinite(self.high) else None,
                "confidence": self.confidence,
                "method": self.method,
                "resamples": self.resamples,
                "n_baseline": self.n_baseline,
                "n_candidate": self.n_candidate,
                "looks": self.looks,
            }
        )


def interval_verdict(
    estimate: SpeedupEstimate, *, tolerance: float = 0.0, equivalence: float = 0.05
) -> Verdict:
    """The verdict one interval supports, looked at once.

    'faster' / 'slower' only when the whole interval clears ``1 +- tolerance`` (0.01 = 1 %,
    the smallest change worth a claim); 'no significant difference' only when it lies inside
    ``1 +- equivalence`` (a stated margin, not merely an interval that contains 1); otherwise
    (or without a finite interval) 'undecided'. A comparison that looks several times uses
    :func:`judge`, which also asks for enough rounds.
    """
    if not estimate.bounded:
        return UNDECIDED
    if estimate.low > 1.0 + tolerance:
        return FASTER
    if estimate.high < 1.0 / (1.0 + tolerance):
        return SLOWER
    if estimate.low >= 1.0 / (1.0 + equivalence) and estimate.high <= 1.0 + equivalence:
        return NO_DIFFERENCE
    return UNDECIDED


def median_ratio(
    baseline_s: Sequence[float],
    candidate_s: Sequence[float],
    *,
    confidence: float = 0.95,
    looks: int = 1,
) -> SpeedupEstimate:
    """The median per-round ratio ``baseline / candidate`` with its exact interval at
    ``confidence`` shared by ``looks`` looks (each at ``1 - (1 - confidence) / looks``)."""
    n = min(len(baseline_s), len(candidate_s))
    if n == 0:
        return SpeedupEstimate(
            math.nan, math.nan, math.nan, confidence, "no samples", 0, len(baseline_s),
            len(candidate_s), looks,
        )  # fmt: skip
    ratios = sorted(
        float(b) / float(c) for b, c in zip(baseline_s[:n], candidate_s[:n], strict=True)
    )
    mid = n // 2
    value = ratios[mid] if n % 2 else (ratios[mid - 1] + ratios[mid]) / 2.0
    k = sign_rank(n, 1.0 - (1.0 - confidence) / max(1, looks))
    low, high = (ratios[k - 1], ratios[n - k]) if k else (-math.inf, math.inf)
    return SpeedupEstimate(value, low, high, confidence, SIGN_METHOD, 0, n, n, looks)


@dataclass(frozen=True)
class VerdictPlan:
    """When a comparison may look at its rounds, and what a look must show.

    ``min_rounds``: no look before this many rounds (the statistics may ask for more: a
    verdict at ``confidence`` over the planned looks needs ``first_look`` rounds).
    ``tolerance``: the smallest change called faster or slower (0.01 = 1 %). ``equivalence``:
    the margin inside which "no significant difference" is claimed (0.05 = the interval within
    0.95x-1.05x). ``growth``: each planned look after the first comes at this many times the
    rounds of the one before. ``adaptive=False``: one look, at ``max_rounds``.
    """

    min_rounds: int = 5
    max_rounds: int = 100
    confidence: float = 0.95
    tolerance: float = 0.01
    equivalence: float = 0.05
    growth: float = 1.5
    adaptive: bool = True

    def __post_init__(self) -> None:
        if self.min_rounds < 2:
            raise ArgumentError("min_rounds must be at least 2")
        if self.max_rounds < self.min_rounds:
            raise ArgumentError("max_rounds must be at least min_rounds")
        if not 0.0 < self.confidence < 1.0:
            raise ArgumentError(f"confidence must be between 0 and 1, got {self.confidence}")
        if self.tolerance < 0 or self.equivalence <= self.tolerance:
            raise ArgumentError(
                "tolerance must be >= 0 and the equivalence margin larger than it "
                f"(got tolerance {self.tolerance}, equivalence {self.equivalence})"
            )
        if self.growth <= 1.0:
            raise ArgumentError("growth must be larger than 1")

    def _schedule_for(self, looks: int) -> tuple[int, ...]:
        first = max(self.min_rounds, fewest_rounds(1.0 - (1.0 - self.confidence) / looks))
        if first >= self.max_rounds or not self.adaptive:
            return (max(first, self.max_rounds) if not self.adaptive else first,)
        out = [first]
        while True:
            nxt = max(out[-1] + 1, math.ceil(out[-1] * self.growth))
            if nxt >= self.max_rounds:
                break
            out.append(nxt)
        out.append(self.max_rounds)
        return tuple(out)

    @property
    def schedule(self) -> tuple[int, ...]:
        """The planned looks (round counts); the last is ``max_rounds`` (or the first look)."""
        looks = 1
        while True:
            planned = self._schedule_for(looks)
            if len(planned) <= looks:
                return planned
            looks = len(planned)

    @property
    def looks(self) -> int:
        return len(self.schedule)

    @property
    def first_look(self) -> int:
        """The fewest rounds any verdict can come from."""
        return self.schedule[0]

    @property
    def per_look_confidence(self) -> float:
        return 1.0 - (1.0 - self.confidence) / self.looks

    def is_look(self, rounds: int) -> bool:
        return rounds in self.schedule

    def next_look(self, rounds: int) -> int | None:
        return next((n for n in self.schedule if n > rounds), None)

    def describe(self) -> str:
        return (
            f"{self.confidence:.0%} over up to {self.looks} look(s) at rounds "
            f"{', '.join(map(str, self.schedule))} (each at {self.per_look_confidence:.2%}); "
            f"faster/slower beyond {self.tolerance:.0%}, no significant difference within "
            f"+/-{self.equivalence:.0%}"
        )


@dataclass(frozen=True)
class Judgement:
    """The verdict of one look at an arm, with its evidence and what more it would need.

    ``more_rounds`` / ``more_s``: rounds (and seconds at the pace so far) that would likely
    decide an undecided arm (None when decided, or when no estimate can be made).
    """

    verdict: Verdict
    estimate: SpeedupEstimate | None
    rounds: int
    reason: str
    more_rounds: int | None = None
    more_s: float | None = None
    looked: bool = True

    @property
    def decided(self) -> bool:
        return self.verdict != UNDECIDED

    @property
    def needs(self) -> str:
        """What it would take to decide (empty when decided)."""
        if self.decided:
            return ""
        if self.more_rounds is None:
            return self.reason
        more = format_seconds(self.more_s, WAIT, none="?")
        when = f" (~{more} at this pace)" if self.more_s else ""
        return f"{self.reason}: about {self.more_rounds} more round(s){when}"

    def __str__(self) -> str:
        head = self.verdict if self.decided else f"undecided: {self.needs}"
        return f"{head}, {self.estimate}" if self.estimate is not None else head

    def to_dict(self) -> dict[str, Any]:
        return jsonable(
            {
                "verdict": self.verdict,
                "estimate": self.estimate,
                "rounds": self.rounds,
                "reason": self.reason,
                "needs": self.needs,
                "more_rounds": self.more_rounds,
                "more_s": self.more_s,
            }
        )


def judge(
    baseline_s: Sequence[float],
    candidate_s: Sequence[float],
    plan: VerdictPlan,
    *,
    final: bool = False,
    round_s: float | None = None,
) -> Judgement:
    """The verdict after ``len(candidate_s)`` rounds (paired with the baseline's first ones).

    A verdict is given only at a planned look (``plan.is_look``) or, with ``final``, at the
    round the comparison stops (time budget, round limit); elsewhere the arm is "undecided"
    until the next look. ``round_s``: seconds one round took so far, to say how long more
    rounds would take.
    """
    n = min(len(baseline_s), len(candidate_s))
    estimate = median_ratio(
        baseline_s[:n], candidate_s[:n], confidence=plan.confidence, looks=plan.looks
    )
    shown = estimate if n else None

    def pace(more: int | None) -> float | None:
        return None if more is None or not round_s else more * round_s

    if n < plan.first_look:
        short = plan.first_look - n
        return Judgement(
            UNDECIDED,
            shown,
            n,
            f"{n} round(s); a verdict at {percent(plan.confidence)} needs at least "
            f"{plan.first_look}",
            short,
            pace(short),
            looked=False,
        )
    if not (final or plan.is_look(n)):
        nxt = plan.next_look(n) or plan.max_rounds
        return Judgement(
            UNDECIDED, shown, n, f"next look at round {nxt}", nxt - n, pace(nxt - n), looked=False
        )
    low, high = estimate.low, estimate.high
    tol, eq = 1.0 + plan.tolerance, 1.0 + plan.equivalence
    if low > tol:
        return Judgement(FASTER, estimate, n, f"the interval is above {tol:.2f}x")
    if high < 1.0 / tol:
        return Judgement(SLOWER, estimate, n, f"the interval is below {1.0 / tol:.2f}x")
    if low >= 1.0 / eq and high <= eq:
        return Judgement(
            NO_DIFFERENCE,
            estimate,
            n,
            f"the interval lies inside the +/-{plan.equivalence:.0%} margin "
            f"({1.0 / eq:.3f}-{eq:.2f}x)",
        )
    more = _rounds_to_decide(estimate, n, plan)
    reason = (
        f"the {percent(plan.confidence)} interval {low:.2f}-{high:.2f}x neither clears "
        f"+/-{plan.tolerance:.0%} nor lies within +/-{plan.equivalence:.0%}"
    )
    if more is None:
        reason += " (the difference sits near the tolerance: more rounds may not decide it)"
    return Judgement(UNDECIDED, estimate, n, reason, more, pace(more))


def _rounds_to_decide(estimate: SpeedupEstimate, n: int, plan: VerdictPlan) -> int | None:
    """Rounds (beyond ``n``) after which an interval as wide as this one, narrowing as
    1/sqrt(rounds), would clear the tolerance or fit the margin, rounded up to the planned
    look that would see it; None when neither can."""
    if not estimate.bounded or estimate.low <= 0 or estimate.value <= 0:
        return None
    half = (math.log(estimate.high) - math.log(estimate.low)) / 2.0
    centre = abs(math.log(estimate.value))
    room = max(
        centre - math.log(1.0 + plan.tolerance),  # to clear the tolerance
        math.log(1.0 + plan.equivalence) - centre,  # to fit the equivalence margin
    )
    if half <= 0 or room <= 0:
        return None
    needed = max(n + 1, math.ceil(n * (half / room) ** 2))
    look = next((k for k in plan.schedule if k >= needed), needed)
    return look - n


__all__ = [
    "FASTER",
    "NOT_APPLIED",
    "NO_DIFFERENCE",
    "SIGN_METHOD",
    "SLOWER",
    "UNDECIDED",
    "Judgement",
    "SpeedupEstimate",
    "Verdict",
    "VerdictPlan",
    "fewest_rounds",
    "interval_verdict",
    "judge",
    "median_ratio",
    "sign_rank",
]
