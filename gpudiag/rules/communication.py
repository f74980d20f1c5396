"""Communication rules: collectives that the computation does not hide."""

from __future__ import annotations

from collections.abc import Iterator

from gpudiag.rules._facts import trace_source
from gpudiag.rules.engine import EvidenceBundle, rule
from gpudiag.rules.finding import Evidence, Finding, Severity

CATEGORY = "communication"

COMM_SHARE = 0.10  # torch-tb-profiler: "communication > 10 % of the step"
LOW_OVERLAP = 0.50
# Severity by the exposed (not overlapped) communication, as a share of the span.
EXPOSED_HIGH = 0.20
EXPOSED_MEDIUM = 0.05


@rule("comm.exposed", category=CATEGORY, needs=("gpu_trace",))
def exposed_communication(evidence: EvidenceBundle) -> Iterator[Finding]:
    """NCCL communication above 10 % of the run with little compute running alongside it."""
    trace = evidence.trace
    b = trace.time_breakdown()
    span = b.get("span_us") or 0.0
    comm = b.get("communication_us") or 0.0
    if span <= 0 or comm / span <= COMM_SHARE:
        return
    overlap = trace.comm_compute_overlap()
    src = trace_source(trace)
    if overlap is not None and overlap >= LOW_OVERLAP:
        return
    exposed = comm * (1.0 - (overlap or 0.0)) / span
    world = trace.ranks[0].world_size
    yield Finding(
        "comm.exposed",
        Severity.HIGH
        if exposed >= EXPOSED_HIGH
        else Severity.MEDIUM
        if exposed >= EXPOSED_MEDIUM
        else Severity.LOW,
        CATEGORY,
        f"communication takes {comm / span:.0%} of the GPU's time and only "
        f"{(overlap or 0.0):.0%} of it overlaps compute",
        (
            Evidence("communication", round(100 * comm / span, 1), "% of span", src),
            Evidence(
                "communication overlapped by compute",
                None if overlap is None else round(100 * overlap, 1),
                "%",
                src,
            ),
            Evidence("world size", world, source=src),
        ),
        threshold=f"communication > {COMM_SHARE:.0%} of span and overlap < {LOW_OVERLAP:.0%} "
        f"(exposed share: low < {EXPOSED_MEDIUM:.0%} <= medium < {EXPOSED_HIGH:.0%} <= high)",
        instruction="let DDP overlap gradient all-reduce with backward (bucket_cap_mb, "
        "gradient_as_bucket_view, no extra syncs in backward); with FSDP, prefetch the next "
        "all-gather (forward_prefetch / backward_prefetch); check the interconnect with "
        "gd.bench.allreduce",
        estimated_gain=exposed,
    )
