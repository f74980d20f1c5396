"""Occupancy rules: hot custom kernels that keep few warps resident, and why."""

from __future__ import annotations

import re
from collections.abc import Iterator

from gpudiag.rules._facts import trace_device, trace_source
from gpudiag.rules.engine import EvidenceBundle, rule
from gpudiag.rules.finding import Evidence, Finding, Severity

CATEGORY = "occupancy"

HOT_SHARE = 0.05  # of all kernel time
LOW_OCCUPANCY = 0.25
# Vendor-tuned kernels pick big tiles and low occupancy on purpose: advice to change their
# block size would be noise.
_TUNED = re.compile(
    r"gemm|cudnn|cutlass|xmma|cublas|nccl|flash|fmha|sm\d\d_|volta_|ampere_|hopper_", re.I
)


@rule("occupancy.low", category=CATEGORY, needs=("gpu_trace",))
def low_occupancy(evidence: EvidenceBundle) -> Iterator[Finding]:
    """Hot non-library kernels with low theoretical occupancy, with the limiting resource."""
    from gpudiag.analysis.occupancy import best_block_size
    from gpudiag.errors import GpuDiagError

    trace = evidence.trace
    cc, name = trace_device(evidence)
    src = trace_source(trace)
    for k in trace.top_kernels(10):
        if k.share < HOT_SHARE or k.category != "compute" or _TUNED.search(k.name):
            continue
        occ = k.theoretical_occupancy
        if occ is None or occ >= LOW_OCCUPANCY:
            continue
        limits = ", ".join(k.occupancy_limited_by) or "unknown"
        threads = k.block[0] * k.block[1] * k.block[2] if k.block else None
        items = [
            Evidence("share of kernel time", round(100 * k.share, 1), "%", src),
            Evidence("theoretical occupancy", round(100 * occ, 1), "%", src),
            Evidence("limited by", limits, source=src),
            Evidence("threads per block", threads, source=src),
            Evidence("registers per thread", k.registers_per_thread, source=src),
        ]
        advice = "reduce registers (__launch_bounds__, -maxrregcount) or shared memory per block"
        if cc is not None and k.registers_per_thread:
            try:
                size, best = best_block_size(
                    cc, int(k.registers_per_thread), int(k.shared_memory_bytes or 0)
                )
            except (GpuDiagError, ValueError):
                size, best = 0, None
            if best is not None and best.occupancy > occ + 0.05:
                items.append(
                    Evidence(
                        "occupancy at block size " + str(size),
                        round(100 * best.occupancy, 1),
                        "%",
                        "occupancy calculator",
                    )
                )
                advice = (
                    f"launch with {size} threads per block ({best.occupancy:.0%} occupancy "
                    f"on {name}), or " + advice
                )
        yield Finding(
            "occupancy.low",
            Severity.MEDIUM if k.share >= 0.10 else Severity.LOW,
            CATEGORY,
            f"hot kernel {k.short_name} runs at {occ:.0%} theoretical occupancy "
            f"(limited by {limits})",
            tuple(items),
            threshold=f"kernel >= {HOT_SHARE:.0%} of kernel time, occupancy < {LOW_OCCUPANCY:.0%}",
            instruction=advice
            + "; low occupancy only hurts latency-bound kernels: check with Nsight Compute",
        )
