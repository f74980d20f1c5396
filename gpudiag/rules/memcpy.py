"""Copy rules: host<->device copies from pageable memory (synchronous and slow)."""

from __future__ import annotations

from collections.abc import Iterator

from gpudiag.rules._facts import span_us, trace_source
from gpudiag.rules.engine import EvidenceBundle, rule
from gpudiag.rules.finding import Evidence, Finding, FixRef, severity_for_gain

CATEGORY = "memory copies"

PAGEABLE_SHARE = 0.01  # of the profiled span


@rule("memcpy.pageable", category=CATEGORY, needs=("gpu_trace",))
def pageable_copies(evidence: EvidenceBundle) -> Iterator[Finding]:
    """Host<->device copies from pageable memory: staged, synchronous, below the link's speed."""
    trace = evidence.trace_report
    span = span_us(trace)
    if not span:
        return
    pageable = [
        t
        for t in trace.transfers()
        if t.direction in {"HtoD", "DtoH"} and "Pageable" in {t.source, t.destination}
    ]
    total_us = sum(t.total_us for t in pageable)
    share = total_us / span
    if share < PAGEABLE_SHARE:
        return
    src = trace_source(trace)
    items = [Evidence("pageable copy time", round(100 * share, 2), "% of span", src)]
    for t in pageable:
        items.append(
            Evidence(
                f"{t.direction} {t.source}->{t.destination}",
                round(t.achieved_gbps or 0.0, 2),
                f"GB/s in {t.count} copies"
                + (f" (link peak {t.peak_gbps:g} GB/s)" if t.peak_gbps else ""),
                src,
            )
        )
    yield Finding(
        "memcpy.pageable",
        severity_for_gain(share / 2),
        CATEGORY,
        f"{share:.1%} of the profiled time is host<->device copies from pageable memory: each "
        "one is staged and blocks the host",
        tuple(items),
        threshold=f"pageable HtoD/DtoH copies >= {PAGEABLE_SHARE:.0%} of the profiled span; "
        "severity by the estimated gain, half the copy time (medium from 3 %, high from 10 %)",
        fix=FixRef("dataloader.tuning", {"pin_memory": True}),
        instruction="pin host batches (DataLoader(pin_memory=True)) and copy with "
        "`.to(device, non_blocking=True)`",
        estimated_gain=share / 2,
    )
