"""Straggler analysis: leave-one-out reference, causes read from the rank's own facts."""

from __future__ import annotations

import pytest

from gpudiag.analysis.stragglers import RankTiming, find_stragglers


def _rank(rank: int, step_ms: float, **facts: object) -> RankTiming:
    times = tuple(step_ms / 1e3 * f for f in (0.98, 1.0, 1.02))
    return RankTiming(rank=rank, step_s=times, **facts)  # type: ignore[arg-type]


def test_one_slow_rank_of_four_is_named_with_its_throttled_gpu() -> None:
    ranks = [
        _rank(0, 100, gpu="H100", sm_clock_mhz=1980, max_sm_clock_mhz=1980),
        _rank(1, 101, gpu="H100", sm_clock_mhz=1980, max_sm_clock_mhz=1980),
        _rank(
            2,
            140,
            gpu="H100",
            sm_clock_mhz=1200,
            max_sm_clock_mhz=1980,
            clock_reasons=("gpu_idle", "hw_thermal_slowdown"),
        ),
        _rank(3, 99, gpu="H100", sm_clock_mhz=1980, max_sm_clock_mhz=1980),
    ]
    found = find_stragglers(ranks)
    assert [s.rank for s in found] == [2]
    s = found[0]
    assert s.reference_s == pytest.approx(0.100)
    assert s.slower_by == pytest.approx(0.40)
    assert s.wait_s_per_step == pytest.approx(0.040)
    assert "hw_thermal_slowdown" in s.reasons[0]
    assert "gpu_idle" not in s.reasons[0]
    assert "1200 MHz" in s.reasons[1]
    assert "rank 2 is 40% slower" in s.describe()


def test_busy_host_and_fewer_cpus_explain_a_cpu_straggler() -> None:
    ranks = [
        _rank(0, 50, host="a", load_average=1.0, usable_cpus=8),
        _rank(1, 80, host="a", load_average=9.0, usable_cpus=4),
    ]
    (s,) = find_stragglers(ranks)
    assert s.rank == 1
    assert any("oversubscribed" in r and "9.0" in r and "rank(s) 0" in r for r in s.reasons)
    assert any("4 CPUs" in r for r in s.reasons)
    other_host = [ranks[0], RankTiming(**{**ranks[1].__dict__, "host": "b"})]
    (s,) = find_stragglers(other_host)
    assert any(r.startswith("its host b is busy (load average 9.0") for r in s.reasons)


def test_rank_alone_on_its_node_points_at_the_network() -> None:
    ranks = [_rank(0, 50, host="a"), _rank(1, 51, host="a"), _rank(2, 70, host="b")]
    (s,) = find_stragglers(ranks)
    assert s.rank == 2
    assert "alone on host b" in s.reasons[0]


def test_even_ranks_and_too_few_ranks_give_no_straggler() -> None:
    assert find_stragglers([_rank(0, 50), _rank(1, 53)]) == []
    assert find_stragglers([_rank(0, 50)]) == []
    assert find_stragglers([_rank(0, 50), RankTiming(rank=1, step_s=())]) == []
    assert [s.rank for s in find_stragglers([_rank(0, 50), _rank(1, 53)], threshold=0.05)] == [1]
    no_cause = find_stragglers([_rank(0, 50), _rank(1, 70)])[0]
    assert "no cause found" in no_cause.describe()
