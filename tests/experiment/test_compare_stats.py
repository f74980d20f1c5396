"""Statistics of before/after comparisons, on seeded data: no real timings."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpudiag.analysis.stats import (
    AdaptiveRule,
    AdaptiveStopper,
    Measurement,
    SpeedupEstimate,
    speedup_ci,
    verdict,
)


def test_measurement_summaries_are_robust_to_an_outlier() -> None:
    m = Measurement((1.0, 2.0, 3.0, 4.0, 100.0), "before")
    assert m.median_s == 3.0
    assert m.q1_s == 2.0
    assert m.q3_s == 4.0
    assert m.iqr_s == 2.0
    assert m.n == 5
    assert m.mean_s == pytest.approx(22.0)


def test_measurement_repr_warns_only_on_large_spread() -> None:
    tight = Measurement(tuple(0.100 + 0.001 * i for i in range(10)), "tight")
    noisy = Measurement(tuple(0.100 * (1 + 0.1 * i) for i in range(10)), "noisy")
    assert not tight.has_large_spread
    assert "WARNING" not in repr(tight)
    assert noisy.has_large_spread
    assert "WARNING" in repr(noisy)
    assert "noisy" in repr(noisy)
    assert noisy.to_dict()["warnings"]


def test_measurement_with_few_samples_says_spread_cannot_be_judged() -> None:
    m = Measurement((0.1, 0.2), "x")
    assert any("cannot be judged" in w for w in m.warnings())


def test_paired_speedup_is_the_median_per_round_ratio_and_seeded() -> None:
    rng = np.random.default_rng(1)
    base = 0.2 + rng.normal(0, 0.01, 30)
    fix = 0.1 + rng.normal(0, 0.005, 30)
    a = speedup_ci(base, fix, seed=3)
    b = speedup_ci(base, fix, seed=3)
    assert a == b
    assert a.value == pytest.approx(np.median(base / fix))
    unpaired = speedup_ci(base, fix, paired=False)
    assert unpaired.value == pytest.approx(np.median(base) / np.median(fix))
    assert unpaired.method != a.method
    assert a.low <= a.value <= a.high
    assert verdict(a) == "faster"


def test_speedup_interval_narrows_with_more_samples() -> None:
    rng = np.random.default_rng(2)
    small = speedup_ci(0.1 + rng.normal(0, 0.01, 10), 0.1 + rng.normal(0, 0.01, 10))
    large = speedup_ci(0.1 + rng.normal(0, 0.01, 200), 0.1 + rng.normal(0, 0.01, 200))
    assert (large.high - large.low) < (small.high - small.low)


def test_paired_bootstrap_removes_shared_slowdowns() -> None:
    # Both arms share a machine whose speed drifts round to round; the fix is 10 % faster.
    rng = np.random.default_rng(4)
    load = rng.uniform(1.0, 2.0, 40)
    base = 0.1 * load * (1 + rng.normal(0, 0.005, 40))
    fix = 0.1 / 1.1 * load * (1 + rng.normal(0, 0.005, 40))
    paired = speedup_ci(base, fix, paired=True)
    independent = speedup_ci(base, fix, paired=False)
    assert paired.high - paired.low < (independent.high - independent.low) / 2
    assert verdict(paired) == "faster"


def test_same_distribution_is_no_significant_difference_only_inside_the_margin() -> None:
    rng = np.random.default_rng(5)
    tight = speedup_ci(0.1 + rng.normal(0, 0.001, 50), 0.1 + rng.normal(0, 0.001, 50))
    assert tight.low < 1.0 < tight.high
    assert verdict(tight) == "no significant difference"
    # An interval that merely contains 1 says nothing about a difference of a few percent
    # (this used to be "no significant difference" too).
    wide = speedup_ci(0.1 + rng.normal(0, 0.03, 20), 0.1 + rng.normal(0, 0.03, 20))
    assert wide.low < 0.95
    assert wide.high > 1.05
    assert verdict(wide) == "undecided"


def test_verdict_slower_and_tolerance() -> None:
    assert verdict(SpeedupEstimate(0.5, 0.45, 0.55)) == "slower"
    tiny = SpeedupEstimate(1.01, 1.005, 1.02)
    assert verdict(tiny) == "faster"
    assert verdict(tiny, tolerance=0.01) == "no significant difference"
    assert verdict(tiny, tolerance=0.01, equivalence=0.015) == "undecided"
    # No interval is no evidence (this used to read "no significant difference").
    assert verdict(SpeedupEstimate(math.nan, math.nan, math.nan)) == "undecided"


def test_empty_samples_give_nan_not_a_crash() -> None:
    est = speedup_ci([], [0.1])
    assert math.isnan(est.value)
    assert verdict(est) == "undecided"


def _stop_round(
    stopper: AdaptiveStopper, base: list[float], fix: list[float], budget_per_round: float
) -> tuple[int, str]:
    for n in range(1, len(base) + 1):
        decision = stopper.update(base[:n], fix[:n], rounds=n, elapsed_s=n * budget_per_round)
        if decision.stop:
            return n, decision.reason
    return len(base), "undecided"


def test_adaptive_clear_verdict_comes_at_the_first_planned_look() -> None:
    rule = AdaptiveRule(min_rounds=5, time_budget_s=1e9)
    assert rule.plan.schedule == (9, 14, 21, 32, 48, 72, 100)
    base, fix = [0.01] * 50, [0.005] * 50  # noiseless: a 2x speedup from the first look
    stopper = AdaptiveStopper(rule)
    assert _stop_round(stopper, base, fix, 0.0) == (9, "clear")
    assert stopper.decided is not None
    assert stopper.decided.look == "faster"
    assert [j.rounds for j in stopper.history] == [9]


def test_adaptive_equal_arms_stop_as_equivalent() -> None:
    rule = AdaptiveRule(min_rounds=5, time_budget_s=1e9)
    n, reason = _stop_round(AdaptiveStopper(rule), [0.01] * 50, [0.01] * 50, 0.0)
    assert (n, reason) == (9, "equivalent")


def test_adaptive_noisy_undecided_arm_stops_at_the_time_budget_undecided() -> None:
    rng = np.random.default_rng(6)
    base = list(0.1 * rng.uniform(0.5, 1.5, 200))
    fix = list(0.1 * rng.uniform(0.5, 1.5, 200))
    rule = AdaptiveRule(min_rounds=5, max_rounds=500, time_budget_s=3.0, equivalence=0.02)
    stopper = AdaptiveStopper(rule)
    n, reason = _stop_round(stopper, base, fix, budget_per_round=0.25)
    assert reason == "time budget"
    assert n == 12  # 12 rounds x 0.25 s reach the 3 s budget
    assert stopper.decided is not None
    assert stopper.decided.look == "undecided"


def test_adaptive_max_rounds_below_the_first_look_is_undecided() -> None:
    rule = AdaptiveRule(min_rounds=2, max_rounds=3, time_budget_s=1e9)
    base, fix = [1.0, 2.0] * 5, [2.0, 1.0] * 5  # the arms swap places every round
    stopper = AdaptiveStopper(rule)
    assert _stop_round(stopper, base, fix, 0.0) == (3, "max rounds")
    assert stopper.decided is not None
    assert stopper.decided.judgement is not None
    assert stopper.decided.judgement.needs == (
        "3 round(s); a verdict at 95% needs at least 6: about 3 more round(s)"
    )


def test_adaptive_rule_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="min_rounds"):
        AdaptiveRule(min_rounds=1)
    with pytest.raises(ValueError, match="max_rounds"):
        AdaptiveRule(min_rounds=10, max_rounds=5)
    with pytest.raises(ValueError, match="equivalence margin larger"):
        AdaptiveRule(tolerance=0.05, equivalence=0.05)
