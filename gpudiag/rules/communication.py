"""Communication rules: collectives that the computation does not hide.

Definitions as Holistic Trace Analysis and TraceLens state them: total communication is the
union of communication-kernel time; the part that runs while no compute kernel runs is
*exposed* (TraceLens' ``exposed_comm_time``); HTA's communication-computation overlap is the
overlapped part over the total. So exposed = total x (1 - overlap), and hiding every exposed
microsecond behind compute is the most a fix can save.
"""

from __future__ import annotations

from collections.abc import Iterator

from gpudiag.analysis.trace.ranks import CommOverlap
from gpudiag.rules._facts import trace_source
from gpudiag.rules.engine import EvidenceBundle, rule
from gpudiag.rules.finding import Evidence, Finding, Severity

CATEGORY = "communication"

COMM_SHARE = 0.10  # torch-tb-profiler: "communication > 10 % of the step"
# Severity by the exposed (not overlapped) communication, as a share of the span; below the
# medium line the collectives are hidden well enough not to report.
EXPOSED_HIGH = 0.20
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
    trace = evidence.trace
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
        Severity.HIGH if exposed >= EXPOSED_HIGH else Severity.MEDIUM,
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
        f"{EXPOSED_MEDIUM:.0%} of span (high from {EXPOSED_HIGH:.0%})",
        instruction="let DDP overlap gradient all-reduce with backward (bucket_cap_mb, "
        "gradient_as_bucket_view, no extra syncs in backward); with FSDP, prefetch the next "
        "all-gather (forward_prefetch / backward_prefetch); check the interconnect with "
        "gd.bench.allreduce",
        estimated_gain=exposed,
    )
