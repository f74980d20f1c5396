"""Occupancy rules: hot custom kernels that keep few warps resident, and why."""

from __future__ import annotations

from collections.abc import Iterator

from gpudiag.analysis.trace.kernel_classes import (
    ATTENTION,
    COMMUNICATION,
    GEMM,
    classify_kernel,
)
from gpudiag.analysis.trace.ledger import MEMORY_BOUND_WORK, OTHER_KERNELS
from gpudiag.rules._claims import claim
from gpudiag.rules._facts import trace_device, trace_source
from gpudiag.rules.engine import EvidenceBundle, rule
from gpudiag.rules.finding import Evidence, Finding, Severity, severity_for_gain

CATEGORY = "occupancy"

HOT_SHARE = 0.05  # of all kernel time
LOW_OCCUPANCY = 0.25
# Library kernels pick big tiles, persistent grids, warp specialisation and many registers on
# purpose, and PyTorch's own ATen kernels are not the user's to relaunch: block-size advice
# for them is noise. Whose kernel it is comes from the one kernel classifier
# (``kernel_classes.is_library_kernel``), and matrix products, attention and communication
# are left out even among the user's (Triton matmuls keep few warps on purpose, like cuBLAS).
_NOT_ADVISED_WORK = frozenset({GEMM, ATTENTION, COMMUNICATION})
# The ledger rows such a kernel's time lies on (its matrix products, attention and
# communication are left out above), and what more warps in flight can remove of it.
_ROWS = (MEMORY_BOUND_WORK, OTHER_KERNELS)
_REMOVABLE = 0.25
_SOURCE = (
    "an estimate, unverified: more resident warps hide memory latency, they do not remove "
    "work; a quarter of the kernel's time is taken as what they win (the CUDA Best Practices "
    "Guide: higher occupancy does not always mean higher performance; Nsight Compute measures "
    "it)"
)


def _is_triton(name: str, launched_by: str | None) -> bool:
    # Inductor's kernels are named triton_*; a user's @triton.jit kernel is recorded as a CPU
    # op of the kernel's own name.
    return name.startswith("triton") or (launched_by is not None and launched_by == name)


@rule("occupancy.low", category=CATEGORY, needs=("gpu_trace",))
def low_occupancy(evidence: EvidenceBundle) -> Iterator[Finding]:
    """Hot kernels of the user (own CUDA or Triton) with low theoretical occupancy, and why."""
    from gpudiag.analysis.occupancy import best_block_size
    from gpudiag.errors import GpuDiagError

    trace = evidence.trace_report
    cc, name = trace_device(evidence)
    src = trace_source(trace)
    for k in trace.top_kernels(10):
        said = classify_kernel(k.name)
        if k.share < HOT_SHARE or said.is_library or said.work in _NOT_ADVISED_WORK:
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
        triton = _is_triton(k.name, k.launched_by)
        advice = (
            "lower num_warps or the BLOCK sizes in the kernel's triton.Config (under "
            "torch.compile, mode='max-autotune' searches them)"
            if triton
            else "reduce registers (__launch_bounds__, -maxrregcount) or shared memory per block"
        )
        if cc is not None and k.registers_per_thread:
            try:
                size, best = best_block_size(
                    cc, int(k.registers_per_thread), int(k.shared_memory_bytes or 0)
                )
            except (GpuDiagError, ValueError):
                size, best = 0, None
            if best is not None and best.occupancy > occ + 0.05 and not triton:
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
        found = claim(trace, _ROWS, _REMOVABLE, _SOURCE, k.total_us)
        if found is not None:
            items += found.evidence(src)
        yield Finding(
            "occupancy.low",
            severity_for_gain(found.gain)
            if found is not None
            else Severity.MEDIUM
            if k.share >= 0.10
            else Severity.LOW,
            CATEGORY,
            f"hot kernel {k.short_name} runs at {occ:.0%} theoretical occupancy "
            f"(limited by {limits})",
            tuple(items),
            threshold=f"kernel >= {HOT_SHARE:.0%} of kernel time, occupancy < {LOW_OCCUPANCY:.0%}; "
            "severity by its estimated gain, its time on the time ledger x the share more warps "
            "can remove",
            instruction=advice
            + "; low occupancy mainly hurts memory-bound kernels (element-wise, reductions), "
            "which need many warps in flight to hide memory latency: check with Nsight Compute",
            estimated_gain=found.gain if found is not None else None,
            claims=_ROWS if found is not None else (),
        )
