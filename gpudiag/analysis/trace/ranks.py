"""Across ranks: one summary row per rank, and the ranks the others wait for (stragglers)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpudiag.analysis.trace.breakdown import TimeBreakdown
from gpudiag.analysis.trace.model import fields_json

# A rank whose busy (non-communication) GPU time exceeds the ranks' median by this share is
# a straggler: in synchronous training the others wait for it inside their collectives.
STRAGGLER_THRESHOLD = 0.05


@dataclass(frozen=True)
class RankSummary:
    rank: int
    span_us: float
    compute_us: float
    communication_us: float
    memory_us: float
    idle_us: float
    steps: int
    mean_step_us: float | None

    @property
    def work_us(self) -> float:
        """GPU time not spent in communication: what the other ranks wait for."""
        return self.compute_us + self.memory_us

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = fields_json(self)
        out["work_us"] = self.work_us
        return out


def summarize(rank: int, breakdown: TimeBreakdown, step_durations: Sequence[float]) -> RankSummary:
    return RankSummary(
        rank=rank,
        span_us=breakdown.span_us,
        compute_us=breakdown.compute_us,
        communication_us=breakdown.communication_us,
        memory_us=breakdown.memory_us,
        idle_us=breakdown.idle_us,
        steps=len(step_durations),
        mean_step_us=statistics.fmean(step_durations) if step_durations else None,
    )


def stragglers(
    rows: Sequence[RankSummary], threshold: float = STRAGGLER_THRESHOLD
) -> tuple[int, ...]:
    """Ranks with clearly more GPU work than the median rank (needs two or more ranks)."""
    if len(rows) < 2:
        return ()
    median = statistics.median(r.work_us for r in rows)
    if median <= 0:
        return ()
    return tuple(r.rank for r in rows if r.work_us > median * (1.0 + threshold))
