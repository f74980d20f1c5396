"""Across ranks: one summary row per rank, communication overlap per rank and pooled, the ranks
the others wait for (stragglers), and the check that the traces come from one job."""

from __future__ import annotations

import os
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpudiag.analysis.trace.breakdown import TimeBreakdown
from gpudiag.analysis.trace.kernels import COMMUNICATION, COMPUTE
from gpudiag.analysis.trace.model import RankTrace, fields_json
from gpudiag.errors import TraceError

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


@dataclass(frozen=True)
class CommOverlap:
    """Communication kernels against compute kernels on one rank (``rank``) or pooled over
    several (``rank`` None, ``ranks`` how many).

    The definitions are HTA's and TraceLens': ``total_us`` is the union of communication-kernel
    time (TraceLens' ``total_comm_time``); ``overlapped_us`` the part of it during which a compute
    kernel ran too; ``exposed_us`` the rest, when the GPU only communicates (TraceLens'
    ``exposed_comm_time``, gpudiag's ``communication_us``). ``overlap`` = overlapped / total is
    HTA's communication-computation overlap. Pooled rows add the microseconds of every rank, so
    a share is over the summed spans, not a mean of shares.
    """

    rank: int | None
    ranks: int
    span_us: float
    total_us: float
    overlapped_us: float
    exposed_us: float

    @property
    def total_share(self) -> float | None:
        return self.total_us / self.span_us if self.span_us > 0 else None

    @property
    def exposed_share(self) -> float | None:
        return self.exposed_us / self.span_us if self.span_us > 0 else None

    @property
    def overlap(self) -> float | None:
        return self.overlapped_us / self.total_us if self.total_us > 0 else None

    @property
    def label(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else f"{self.ranks} ranks pooled"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = fields_json(self)
        out.update(
            total_share=self.total_share, exposed_share=self.exposed_share, overlap=self.overlap
        )
        return out


def comm_overlap(
    rank: int, breakdown: TimeBreakdown, busy_by_category_set: Mapping[str, float]
) -> CommOverlap:
    """One rank's communication overlap from its breakdown and its time by category set."""
    total = overlapped = 0.0
    for label, us in busy_by_category_set.items():
        parts = label.split("+")
        if COMMUNICATION in parts:
            total += us
            if COMPUTE in parts:
                overlapped += us
    return CommOverlap(
        rank=rank,
        ranks=1,
        span_us=breakdown.span_us,
        total_us=total,
        overlapped_us=overlapped,
        exposed_us=breakdown.communication_us,
    )


def pooled_overlap(rows: Sequence[CommOverlap]) -> CommOverlap | None:
    """The rows' microseconds added up (None without rows; the row itself for one rank)."""
    if not rows:
        return None
    if len(rows) == 1:
        return rows[0]
    return CommOverlap(
        rank=None,
        ranks=sum(r.ranks for r in rows),
        span_us=sum(r.span_us for r in rows),
        total_us=sum(r.total_us for r in rows),
        overlapped_us=sum(r.overlapped_us for r in rows),
        exposed_us=sum(r.exposed_us for r in rows),
    )


def _gpu_names(trace: RankTrace) -> frozenset[str]:
    return frozenset(d.name.strip() for d in trace.devices if d.name.strip())


def check_one_job(traces: Sequence[RankTrace]) -> None:
    """Raise TraceError when the traces cannot be ranks of one job: different world sizes, or
    GPUs of different models. A per-rank comparison across two jobs would call the slower
    job's ranks "stragglers"."""
    if len(traces) < 2:
        return
    worlds: dict[int, list[str]] = {}
    for t in traces:
        if t.world_size:
            worlds.setdefault(t.world_size, []).append(os.path.basename(t.path))
    if len(worlds) > 1:
        listed = "; ".join(
            f"world size {w}: {', '.join(files[:3])}{' ...' if len(files) > 3 else ''}"
            for w, files in sorted(worlds.items())
        )
        raise TraceError(
            f"these traces come from different jobs ({listed}): ranks of one job share one world "
            "size. Analyse each job's traces separately (gd.analyze_trace(folder_of_one_job))."
        )
    named = [(t, _gpu_names(t)) for t in traces if _gpu_names(t)]
    models = {names for _, names in named}
    if len(models) > 1 and not frozenset.intersection(*models):
        listed = "; ".join(
            f"{os.path.basename(t.path)}: {', '.join(sorted(names))}" for t, names in named[:4]
        )
        raise TraceError(
            f"these traces were recorded on different GPU models ({listed}): they are not ranks "
            "of one job, and comparing them rank by rank would report the slower GPU as a "
            "straggler. Analyse each trace separately."
        )
