"""The sequential verdict on synthetic, seeded rounds: exact intervals, looks and needs."""

from __future__ import annotations

import math
import random

import pytest

from gpudiag.analysis.verdict import (
    VerdictPlan,
    fewest_rounds,
    judge,
    median_ratio,
    sign_rank,
)


def _binomial_cdf(n: int, k: int) -> float:
    return sum(math.comb(n, i) for i in range(k + 1)) / 2**n


@pytest.mark.parametrize("n", range(2, 60))
def test_sign_rank_is_the_widest_order_statistic_with_the_coverage(n: int) -> None:
    k = sign_rank(n, 0.95)
    if k:
        assert 1 - 2 * _binomial_cdf(n, k - 1) >= 0.95
    # One rank further in would not cover 95 %.
    assert 1 - 2 * _binomial_cdf(n, k) < 0.95


def test_too_few_rounds_give_no_interval() -> None:
    assert [sign_rank(n, 0.95) for n in (5, 6, 10, 20, 100)] == [0, 1, 2, 6, 40]
    assert (fewest_rounds(0.95), fewest_rounds(0.99)) == (6, 8)
    est = median_ratio([1.0] * 5, [0.5] * 5)
    assert est.value == 2.0
    assert not est.bounded
    assert str(est) == "2.00x (no 95% interval from 5 round(s))"


def test_the_interval_is_two_order_statistics_of_the_ratios() -> None:
    base = [1.0] * 10
    cand = [1 / r for r in (0.8, 0.9, 0.95, 1.0, 1.02, 1.04, 1.06, 1.1, 1.2, 1.5)]
    est = median_ratio(base, cand)
    assert (est.value, est.low, est.high) == pytest.approx((1.03, 0.9, 1.2))


def test_planned_looks_share_the_error_rate() -> None:
    plan = VerdictPlan()
    assert plan.schedule == (9, 14, 21, 32, 48, 72, 100)
    assert plan.per_look_confidence == pytest.approx(1 - 0.05 / 7)
    assert fewest_rounds(plan.per_look_confidence) == 9
    assert VerdictPlan(adaptive=False, max_rounds=20).schedule == (20,)
    assert VerdictPlan(adaptive=False, max_rounds=5).schedule == (6,)
    assert VerdictPlan(min_rounds=20).schedule == (20, 30, 45, 68, 100)
    assert plan.describe() == (
        "95% over up to 7 look(s) at rounds 9, 14, 21, 32, 48, 72, 100 (each at 99.29%); "
        "faster/slower beyond 1%, no significant difference within +/-5%"
    )


def _rounds(effect: float, noise: float, n: int, seed: int) -> tuple[list[float], list[float]]:
    rng = random.Random(seed)
    base = [0.1 * rng.uniform(1 - noise, 1 + noise) for _ in range(n)]
    return base, [b / effect * rng.uniform(1 - noise / 3, 1 + noise / 3) for b in base]


def test_judgements_at_and_between_looks_with_what_they_need() -> None:
    base, cand = _rounds(1.03, 0.1, 14, seed=7)
    plan = VerdictPlan()
    before = judge(base[:2], cand[:2], plan, round_s=0.5)
    assert before.verdict == "undecided"
    assert before.needs == (
        "2 round(s); a verdict at 95% needs at least 9: about 7 more round(s) (~3.5 s at this pace)"
    )
    at_nine = judge(base[:9], cand[:9], plan, round_s=0.5)
    assert str(at_nine) == (
        "undecided: the 95% interval 1.00-1.06x neither clears +/-1% nor lies within +/-5%: "
        "about 12 more round(s) (~6.0 s at this pace), 1.02x (95% CI 1.00-1.06x)"
    )
    between = judge(base[:12], cand[:12], plan)
    assert (between.verdict, between.looked, between.reason) == (
        "undecided",
        False,
        "next look at round 14",
    )


def test_clear_and_equivalent_verdicts() -> None:
    plan = VerdictPlan()
    base, cand = _rounds(1.5, 0.2, 9, seed=1)
    assert judge(base, cand, plan).verdict == "faster"
    assert judge(cand, base, plan).verdict == "slower"
    same = judge([0.1] * 9, [0.1] * 9, plan)
    assert same.verdict == "no significant difference"
    assert same.reason == "the interval lies inside the +/-5% margin (0.952-1.05x)"


def _aa_false_verdicts(runs: int, noise: float, plan: VerdictPlan, seed: int) -> int:
    """A/A comparisons run the adaptive way (stop at the first deciding look)."""
    rng = random.Random(seed)
    false = 0
    for _ in range(runs):
        base: list[float] = []
        cand: list[float] = []
        for n in range(1, plan.max_rounds + 1):
            machine = rng.lognormvariate(0, 0.3)  # a shared machine's slow moments
            base.append(machine * rng.lognormvariate(0, noise))
            cand.append(machine * rng.lognormvariate(0, noise))
            look = judge(base, cand, plan, final=n == plan.max_rounds)
            if look.decided:
                false += look.verdict in ("faster", "slower")
                break
    return false


def test_aa_false_verdicts_stay_under_the_stated_rate() -> None:
    plan = VerdictPlan(max_rounds=40)
    false = _aa_false_verdicts(400, noise=0.05, plan=plan, seed=3)
    assert false / 400 <= 0.05
    assert false == 4  # seeded: 1 %
