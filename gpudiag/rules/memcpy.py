"""Copy rules: host<->device copies from pageable memory (synchronous and slow)."""

from __future__ import annotations

from collections.abc import Iterator

from gpudiag.analysis.trace.ledger import MEMCPY
from gpudiag.rules._claims import claim
from gpudiag.rules._facts import (
    PIN_SOURCE_ADVICE,
    PINNED_DESTINATION_ADVICE,
    span_us,
    trace_source,
)
from gpudiag.rules.engine import EvidenceBundle, rule
from gpudiag.rules.finding import Evidence, Finding, FixRef, severity_for_gain

CATEGORY = "memory copies"

PAGEABLE_SHARE = 0.01  # of the profiled span
# Pinned memory copies at the link's speed; pageable memory is staged through a pinned
# buffer by the driver, at about half of it or less (CUDA C++ Best Practices Guide, "Pinned
# Memory").
_PINNED_REMOVE = 0.5
_PINNED_SOURCE = (
    "CUDA C++ Best Practices Guide, 'Pinned Memory': pageable copies are staged, at about "
    "half the pinned bandwidth or less"
)


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
    found = claim(trace, (MEMCPY,), _PINNED_REMOVE, _PINNED_SOURCE, claimed_us=total_us)
    gain = found.gain if found is not None else share * _PINNED_REMOVE
    items = [Evidence("pageable copy time", round(100 * share, 2), "% of span", src)]
    items += found.evidence(src) if found is not None else ()
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
    # The fix depends on the direction: a pinned source for host-to-device, a pinned
    # destination for device-to-host (DataLoader(pin_memory=True) pins only the batches).
    to_device = any(t.direction == "HtoD" for t in pageable)
    advice = []
    if to_device:
        advice.append("host-to-device: " + PIN_SOURCE_ADVICE)
    if any(t.direction == "DtoH" for t in pageable):
        advice.append("device-to-host: " + PINNED_DESTINATION_ADVICE)
    yield Finding(
        "memcpy.pageable",
        severity_for_gain(gain),
        CATEGORY,
        f"{share:.1%} of the profiled time is host<->device copies from pageable memory: each "
        "one is staged and blocks the host",
        tuple(items),
        threshold=f"pageable HtoD/DtoH copies >= {PAGEABLE_SHARE:.0%} of the profiled span; "
        "its estimated gain is half their time on the ledger's memcpy row (medium from 3 %, "
        "high from 10 %)",
        fix=FixRef("dataloader.tuning", {"pin_memory": True}) if to_device else None,
        instruction="; ".join(advice),
        estimated_gain=gain,
        claims=(MEMCPY,) if found is not None else (),
    )
