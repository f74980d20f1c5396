"""Communication rules: collectives that the computation does not hide.

Definitions as Holistic Trace Analysis and TraceLens state them: total communication is the
union of communication-kernel time; the part that runs while no compute kernel runs is
*exposed* (TraceLens' ``exposed_comm_time``); HTA's communication-computation overlap is the
overlapped part over the total. So exposed = total x (1 - overlap), and hiding every exposed
microsecond behind compute is the most a fix can save.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from gpudiag.analysis.trace.collectives import (
    MIN_MATCHED_CALLS,
    STRAGGLER_HOLD_SHARE,
    TOGETHER_SHARE,
)
from gpudiag.analysis.trace.ledger import COMM_EXPOSED, COMM_OVERLAPPED, PEER_IDLE
from gpudiag.analysis.trace.ranks import CommOverlap
from gpudiag.rules._claims import claim
from gpudiag.rules._facts import trace_source
from gpudiag.rules.engine import EvidenceBundle, rule
from gpudiag.rules.finding import Evidence, Finding, severity_for_gain

if TYPE_CHECKING:
    from gpudiag.analysis.trace.collectives import CollectiveReport, CollectiveStats
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


# Advice that fits each kind of collective (the one that takes most of the calls' time).
_OVERLAP_ADVICE = {
    "all_reduce": "let DDP overlap gradient all-reduce with backward (bucket_cap_mb, "
    "gradient_as_bucket_view, no extra syncs in backward)",
    "all_gather": "with FSDP, prefetch the next all-gather (forward_prefetch / backward_prefetch)",
    "reduce_scatter": "with FSDP, overlap the gradient reduce-scatter with backward "
    "(backward_prefetch; keep reshard_after_forward only where memory needs it)",
    "all_to_all": "overlap the all-to-all exchange (sharded embedding lookups, MoE token "
    "dispatch) with dense compute, e.g. a pipelined step that starts the next batch's exchange "
    "during this batch's dense part (TorchRec's TrainPipelineSparseDist), or send fewer, larger "
    "exchanges",
    "send_recv": "overlap the point-to-point sends/receives with compute (pipeline "
    "micro-batches) or batch them (batch_isend_irecv)",
}
# Without a recorded collective to go by: the data-parallel advice (DDP, then FSDP).
_GENERIC_ADVICE = f"{_OVERLAP_ADVICE['all_reduce']}; {_OVERLAP_ADVICE['all_gather']}"
ADVICE_SHARE = 0.25  # a collective with this share of the calls' time gets its advice
_OVERLAP_REMOVE = 1.0
_OVERLAP_SOURCE = (
    "an upper bound: overlap (DDP bucketing, FSDP prefetch) hides communication behind "
    "compute, at best all of its exposed part"
)
WAITING_DOMINATES = 0.5  # waiting for late ranks is most of the communication time


def _time_by_op(trace: TraceReport) -> dict[str, float]:
    """GPU time of the recorded collective calls by collective, summed over the ranks."""
    out: dict[str, float] = {}
    for r in trace.ranks:
        for c in r.collectives:
            if c.timed_on == "gpu":
                out[c.op] = out.get(c.op, 0.0) + c.duration_us
    return out


def _advice(by_op: dict[str, float]) -> tuple[str, list[tuple[str, float]]]:
    total = sum(by_op.values())
    shares = sorted(((op, us / total) for op, us in by_op.items()), key=lambda x: -x[1])
    fitting = [
        _OVERLAP_ADVICE[op] for op, f in shares if f >= ADVICE_SHARE and op in _OVERLAP_ADVICE
    ]
    return ("; ".join(fitting) if fitting else _GENERIC_ADVICE), shares


@rule("comm.exposed", category=CATEGORY, needs=("gpu_trace",))
def exposed_communication(evidence: EvidenceBundle) -> Iterator[Finding]:
    """Communication above 10 % of the GPU's time, 5 % or more of it with no compute alongside.

    With several ranks, the time ranks wait inside the collectives for a late rank is read from
    the matched calls: when it is most of the communication, the exposed time is mostly waiting
    (comm.late_rank's finding), and only the rest is transfer that overlap could hide."""
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
    items = [
        Evidence(f"communication{scope}", _pct(total), "% of span", src),
        Evidence(f"communication overlapped by compute{scope}", _pct(overlap), "%", src),
        Evidence(f"exposed communication{scope}", _pct(exposed), "% of span", src),
        *_per_rank_evidence(trace.communication_by_rank(), src),
        Evidence("world size", world, source=src),
    ]
    advice, shares = _advice(_time_by_op(trace))
    if shares:
        items.append(
            Evidence(
                "collective calls' GPU time by collective",
                ", ".join(f"{op} {100 * f:.0f}%" for op, f in shares),
                "",
                src,
            )
        )
    message = (
        f"communication kernels run {total:.1%} of the GPU's time{scope} and "
        f"{(overlap or 0.0):.0%} of that overlaps compute: for {exposed:.1%} of the time the "
        "GPU only communicates"
    )
    gain = exposed
    claimed_us = comm.exposed_us
    instruction = f"{advice}; check the interconnect with gd.bench.allreduce"
    if len(trace.ranks) > 1 and comm.total_us > 0:
        report = trace.collectives()
        wait_us = sum(w.wait_us for w in report.by_rank)
        waiting = min(wait_us / comm.total_us, 1.0)
        # Exposed time that is not waiting is at most the communication time that is not.
        transfer = max(0.0, min(comm.exposed_us, comm.total_us - wait_us)) / comm.span_us
        items += [
            Evidence(
                f"ranks waiting inside collectives for late ranks{scope}",
                _pct(waiting),
                "% of communication time",
                src,
            ),
            Evidence(
                f"exposed communication that is not waiting{scope}, at most",
                _pct(transfer),
                "% of span",
                src,
            ),
        ]
        if waiting >= WAITING_DOMINATES:
            who = " (comm.late_rank names them)" if report.stragglers else ""
            message += (
                f"; {waiting:.0%} of the communication time is ranks waiting for ranks that "
                f"start the collectives late{who}, so at most {transfer:.1%} of the time is "
                "exposed transfer"
            )
            gain = transfer
            claimed_us = transfer * comm.span_us
            instruction = (
                "most of it is waiting: make the late ranks start on time first"
                f"{who}; then {instruction}"
            )
    found = claim(trace, (COMM_EXPOSED,), _OVERLAP_REMOVE, _OVERLAP_SOURCE, claimed_us)
    if found is not None:
        gain = found.gain
        items += found.evidence(src)
    yield Finding(
        "comm.exposed",
        severity_for_gain(gain),
        CATEGORY,
        message,
        tuple(items),
        threshold=f"communication > {COMM_SHARE:.0%} of span and exposed communication >= "
        f"{EXPOSED_MEDIUM:.0%} of span; severity by its estimated gain, the exposed time that "
        "is not waiting for late ranks (high from 10 %)",
        instruction=instruction,
        estimated_gain=gain,
        claims=(COMM_EXPOSED,) if found is not None else (),
    )


# The ranks the others wait for, read from the matched calls of TraceReport.collectives()
# (who starts each call late, and for how long the others wait), not from GPU work.
LATE_LOW = 0.01
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


def _ranks_text(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _late_episode(call: CollectiveStats) -> str:
    """ "ranks 2, 6, 7 start together 7.12-7.62 ms after rank 1" for one matched call."""
    first = min(call.starts_us, key=lambda r: (call.starts_us[r], r))
    t0 = call.starts_us[first]
    offsets = [(call.starts_us[r] - t0) / 1000 for r in call.late_ranks]
    when = (
        f"{min(offsets):.2f}-{max(offsets):.2f} ms"
        if max(offsets) - min(offsets) >= 0.005
        else f"{max(offsets):.2f} ms"
    )
    verb = "starts" if len(call.late_ranks) == 1 else "start together"
    return f"{_ranks_text(call.late_ranks)} {verb} {when} after rank {first}"


def _why_late(trace: TraceReport, named: Sequence[int]) -> tuple[str, Evidence | None]:
    """Whether the late ranks' GPUs do more work than the others' (per-rank summaries)."""
    work = {c.rank: c.work_us for c in trace.comparison}
    others = sorted(v for r, v in work.items() if r not in named)
    mine = [work[r] for r in named if r in work]
    if not others or not mine:
        return "", None
    median = others[len(others) // 2]
    item = Evidence(
        f"{_ranks_text(named)} GPU work vs the other ranks' median",
        f"{' / '.join(f'{w / 1000:.2f}' for w in mine)} vs {median / 1000:.2f}",
        "ms",
        trace_source(trace),
    )
    if median <= 0:
        return "", item
    one = len(named) == 1
    if max(mine) <= median * (1 + WORK_MARGIN):
        return (
            f"; {'its GPU does' if one else 'their GPUs do'} no more work than the others', so "
            f"the delay comes before {'its' if one else 'their'} launches (host side: data "
            "loading, CPU contention, a slower node)",
            item,
        )
    more = f"{max(mine) / median - 1:.0%} more GPU work than the others"
    return f"; {'it runs' if one else 'they run up to'} {more}", item


_LATE_ROWS = (COMM_EXPOSED, COMM_OVERLAPPED, PEER_IDLE)
_LATE_SOURCE = (
    "the waiting itself: ranks that start on time leave the others nothing to wait for in "
    "these calls (an upper bound: work taken off a late rank may land on another)"
)


def _waits(calls: Sequence[CollectiveStats]) -> dict[int, float]:
    """Each rank's time waiting in ``calls`` for their last rank to start, summed over the
    calls where it is not late itself."""
    out: dict[int, float] = {}
    for call in calls:
        late = set(call.late_ranks)
        for r in call.starts_us:
            if r not in late:
                out[r] = out.get(r, 0.0) + call.wait_us(r)
    return out


@rule("comm.late_rank", category=CATEGORY, needs=("trace",))
def late_rank(evidence: EvidenceBundle) -> Iterator[Finding]:
    """The ranks the others wait for inside the collectives: those that start calls last
    (or together with the last) in the calls that hold the others longest."""
    trace = evidence.trace_report
    if len(trace.ranks) < 2:
        return
    report = trace.collectives()
    late = report.stragglers
    if not late:
        return  # too few matched calls, or the delays are spread over the ranks
    named = sorted(w.rank for w in late)
    held_calls = [c for c in report.calls if set(c.late_ranks) & set(named)]
    held = sum(c.hold_us for c in held_calls)
    span = _median_span(trace, report)
    share = held / span if span > 0 else 0.0
    if share < LATE_LOW:
        return
    src = trace_source(trace)
    n = len(report.calls)
    worst = max(held_calls, key=lambda c: c.hold_us)
    waiting = max(report.by_rank, key=lambda w: w.wait_us)
    items = [
        Evidence(
            f"rank {w.rank} late (last, or with the last) / last to start",
            f"{w.late_calls} / {w.last_arrivals}",
            f"of {n} matched collectives",
            src,
        )
        for w in sorted(late, key=lambda w: w.rank)
    ]
    items += [
        Evidence(
            f"others held by calls where {_ranks_text(named)} "
            f"{'is' if len(named) == 1 else 'are'} late",
            round(held / 1000, 2),
            f"ms of {report.total_hold_us / 1000:.2f} ms held in all",
            src,
        ),
        Evidence(
            f"longest hold: {worst.op} call {worst.seq}",
            round(worst.hold_us / 1000, 2),
            f"ms ({_late_episode(worst)})",
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
    why, work_item = _why_late(trace, named)
    if work_item is not None:
        items.append(work_item)
    # On the ledger a rank's waiting is time in its collective kernels (a communication row)
    # or, where its host waits, the peer-wait row. The ranks step together, so the time a
    # waiting rank loses is the step time of the job: the claim is on the ledger of the
    # median waiting rank (as the share is of the median rank's time), for its waits in the
    # calls held.
    gain = min(share, 1.0)
    waits = _waits(held_calls)
    found = None
    if waits:
        ranked = sorted(waits, key=lambda r: (waits[r], r))
        median_rank = ranked[(len(ranked) - 1) // 2]
        found = claim(trace, _LATE_ROWS, 1.0, _LATE_SOURCE, waits[median_rank], rank=median_rank)
    if found is not None:
        gain = found.gain
        items += found.evidence(src)
    items += [Evidence("note", note, source=src) for note in report.notes[:2]]
    counts = ", ".join(str(w.late_calls) for w in sorted(late, key=lambda w: w.rank))
    yield Finding(
        "comm.late_rank",
        severity_for_gain(gain),
        CATEGORY,
        f"the other ranks wait inside the collectives for {_ranks_text(named)}: the calls they "
        f"start late hold the others {held / 1000:.1f} ms ({share:.0%} of the median rank's "
        f"profiled time); the longest wait is at {worst.op} call {worst.seq}, where "
        f"{_late_episode(worst)} ({'it is' if len(named) == 1 else 'they are'} late at "
        f"{counts} of {n} calls){why}",
        tuple(items),
        threshold=f"over >= {MIN_MATCHED_CALLS} matched collectives, the ranks late (last to "
        f"start, or within {TOGETHER_SHARE:.0%} of the call's skew of the last) in calls that "
        f"hold the others >= {STRAGGLER_HOLD_SHARE:.0%} of all the holding (hold: last start "
        f"minus the median start of the ranks not late), >= {LATE_LOW:.0%} of the median rank's "
        "profiled time; severity by its estimated gain, the other ranks' waiting in those "
        "calls on the time ledger (high from 10 %)",
        instruction=f"look at what {_ranks_text(named)} "
        + (
            "does before its collectives (its trace's CPU operators and DataLoader waits, its "
            "host's load"
            if len(named) == 1
            else "do before their collectives (their traces' CPU operators and DataLoader "
            "waits, their hosts' load"
        )
        + ", CPU pinning and clocks with gpudiag inspect); even out the work per rank (data "
        "sharding, uneven embedding tables); `gd.analyze_trace(folder).collectives()` lists "
        "every call",
        estimated_gain=gain,
        claims=_LATE_ROWS if found is not None else (),
    )
