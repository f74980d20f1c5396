"""Communication rules: collectives that the computation does not hide.

Definitions as Holistic Trace Analysis and TraceLens state them: total communication is the
union of communication-kernel time; the part that runs while no compute kernel runs is
*exposed* (TraceLens' ``exposed_comm_time``); HTA's communication-computation overlap is the
overlapped part over the total. So exposed = total x (1 - overlap), and hiding every exposed
microsecond behind compute is the most a fix can save.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

from gpudiag.analysis.trace.ranks import CommOverlap
from gpudiag.rules._facts import trace_source
from gpudiag.rules.engine import EvidenceBundle, rule
from gpudiag.rules.finding import Evidence, Finding, severity_for_gain

if TYPE_CHECKING:
    from gpudiag.analysis.trace.collectives import CollectiveReport
    from gpudiag.analysis.trace.report import TraceReport

CATEGORY = "communication"

COMM_SHARE = 0.10  # torch-tb-profiler: "communication > 10 % of the step"
# The exposed (not overlapped) communication, as a share of the span, is the estimated gain
# and sets the severity (severity_for_gain); below this line the collectives are hidden well
# enough not to report.
EXPOSED_MEDIUM = 0.05


def _pct(value: float | None) -> float | None:
    return None if value is None else round(100 * value, 1)


def _per_rank_evidence(rows: tuple[CommOverlap, ...], src: str) -> tuple[Evidence, ...]:
    """The spread over ranks: the least and the most exposed rank."""
    known = [r for r in rows if r.exposed_share is not None]
    if len(known) < 2:
        return ()
    low = min(known, key=lambda r: r.exposed_share or 0.0)
    high = max(known, key=lambda r: r.exposed_share or 0.0)
    return (
        Evidence(
            "exposed communication, least exposed rank",
            f"{_pct(low.exposed_share)} % (rank {low.rank})",
            source=src,
        ),
        Evidence(
            "exposed communication, most exposed rank",
            f"{_pct(high.exposed_share)} % (rank {high.rank})",
            source=src,
        ),
    )


@rule("comm.exposed", category=CATEGORY, needs=("gpu_trace",))
def exposed_communication(evidence: EvidenceBundle) -> Iterator[Finding]:
    """Communication above 10 % of the GPU's time, 5 % or more of it with no compute alongside."""
    trace = evidence.trace_report
    comm = trace.communication()
    if comm is None or comm.span_us <= 0:
        return
    total, exposed, overlap = comm.total_share or 0.0, comm.exposed_share or 0.0, comm.overlap
    if total <= COMM_SHARE or exposed < EXPOSED_MEDIUM:
        return
    src = trace_source(trace)
    scope = "" if comm.rank is not None else f" ({comm.label})"
    world = trace.ranks[0].world_size
    yield Finding(
        "comm.exposed",
        severity_for_gain(exposed),
        CATEGORY,
        f"communication kernels run {total:.1%} of the GPU's time{scope} and "
        f"{(overlap or 0.0):.0%} of that overlaps compute: for {exposed:.1%} of the time the "
        "GPU only communicates",
        (
            Evidence(f"communication{scope}", _pct(total), "% of span", src),
            Evidence(f"communication overlapped by compute{scope}", _pct(overlap), "%", src),
            Evidence(f"exposed communication{scope}", _pct(exposed), "% of span", src),
            *_per_rank_evidence(trace.communication_by_rank(), src),
            Evidence("world size", world, source=src),
        ),
        threshold=f"communication > {COMM_SHARE:.0%} of span and exposed communication >= "
        f"{EXPOSED_MEDIUM:.0%} of span; severity by the exposed share, its estimated gain "
        "(high from 10 %)",
        instruction="let DDP overlap gradient all-reduce with backward (bucket_cap_mb, "
        "gradient_as_bucket_view, no extra syncs in backward); with FSDP, prefetch the next "
        "all-gather (forward_prefetch / backward_prefetch); check the interconnect with "
        "gd.bench.allreduce",
        estimated_gain=exposed,
    )


# A rank whose late starts hold the others inside the collectives: from the matched calls of
# TraceReport.collectives() (start skew, wait per rank), not from GPU work.
LATE_SHARE = 0.5  # its lateness is at least half of all ranks' lateness
MIN_CALLS = 3
LATE_MEDIUM = 0.05
WORK_MARGIN = 0.05  # GPU work within 5 % of the median: the delay is not on its GPU


def _median_span(trace: TraceReport, report: CollectiveReport) -> float:
    """The median rank's profiled time: its steps in the window, else its GPU span, else the
    time its matched collectives cover."""
    spans = []
    for r in trace.ranks:
        steps = [s.duration_us for s in r.steps if s.in_window]
        if steps:
            spans.append(float(sum(steps)))
        elif r.breakdown is not None and r.breakdown.span_us > 0:
            spans.append(float(r.breakdown.span_us))
        elif report.calls:
            spans.append(
                max(c.ends_us.get(r.rank, 0.0) for c in report.calls)
                - min(c.starts_us.get(r.rank, math.inf) for c in report.calls)
            )
    spans.sort()
    return spans[len(spans) // 2] if spans else 0.0


@rule("comm.late_rank", category=CATEGORY, needs=("trace",))
def late_rank(evidence: EvidenceBundle) -> Iterator[Finding]:
    """One rank's late starts hold the others inside the collectives (most of the waiting)."""
    trace = evidence.trace_report
    if len(trace.ranks) < 2:
        return
    report = trace.collectives()
    late = report.waited_for
    if late is None or len(report.calls) < MIN_CALLS:
        return
    if late.lateness_us < LATE_SHARE * sum(w.lateness_us for w in report.by_rank):
        return  # the delays are spread over the ranks: no one rank to point at
    span = _median_span(trace, report)
    share = late.lateness_us / span if span > 0 else 0.0
    if share < LATE_MEDIUM:
        return
    src = trace_source(trace)
    waiting = max(report.by_rank, key=lambda w: w.wait_us)
    items = [
        Evidence(
            f"rank {late.rank} started last",
            late.last_arrivals,
            f"of {len(report.calls)} matched collectives",
            src,
        ),
        Evidence(
            f"rank {late.rank} later than the others' median start",
            round(late.lateness_us / 1000, 2),
            "ms in all",
            src,
        ),
        Evidence("median rank's profiled time", round(span / 1000, 2), "ms", src),
        Evidence(
            f"rank {waiting.rank} waiting inside collectives",
            round(100 * (waiting.wait_share or 0.0), 1),
            "% of its time in them",
            src,
        ),
    ]
    why = ""
    work = {c.rank: c.work_us for c in trace.comparison}
    if late.rank in work and len(work) >= 2:
        others = sorted(v for r, v in work.items() if r != late.rank)
        median = others[len(others) // 2]
        items.append(
            Evidence(
                f"rank {late.rank} GPU work vs the others' median",
                f"{work[late.rank] / 1000:.2f} vs {median / 1000:.2f}",
                "ms",
                src,
            )
        )
        if median > 0 and work[late.rank] <= median * (1 + WORK_MARGIN):
            why = (
                "; its GPU does no more work than the others', so the delay comes before its "
                "launches (host side: data loading, CPU contention, a slower node)"
            )
        elif median > 0:
            why = f"; it runs {work[late.rank] / median - 1:.0%} more GPU work than the others"
    items += [Evidence("note", n, source=src) for n in report.notes[:2]]
    yield Finding(
        "comm.late_rank",
        severity_for_gain(min(share, 1.0)),
        CATEGORY,
        f"rank {late.rank} starts {late.last_arrivals} of {len(report.calls)} collectives last, "
        f"{late.lateness_us / 1000:.1f} ms in all after the others: they wait for it inside "
        f"the collectives{why}",
        tuple(items),
        threshold=f"one rank holds >= {LATE_SHARE:.0%} of the lateness over >= {MIN_CALLS} "
        f"matched collectives, late by >= {LATE_MEDIUM:.0%} of the median rank's profiled time "
        "(severity by that share, its estimated gain: high from 10 %)",
        instruction=f"look at what rank {late.rank} does before its collectives (its trace's "
        "CPU operators and DataLoader waits, its host's load, CPU pinning and clocks with "
        "gpudiag inspect); even out the work per rank (data sharding, uneven embedding "
        "tables); `gd.analyze_trace(folder).collectives()` lists every call",
        estimated_gain=min(share, 1.0),
    )
