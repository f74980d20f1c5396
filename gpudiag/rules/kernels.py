"""Kernel rules: hot work far below its roof, and memory-bound kernels that fusion removes.

Where a trace recorded shapes (GEMM, convolution and attention operators, and custom operators
named like a matrix product), the roofline gives each call's achieved FLOP/s against what the
traced GPU's spec table allows at its arithmetic intensity: a hot one far below is a finding,
with its shape for a library's kernel and its efficiency for the user's own. Element-wise,
normalisation and reduction kernels are bound by memory traffic; when they hold a large share
of the time, fusing them (torch.compile) is the fix.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpudiag.analysis.trace.kernel_classes import USER_FAMILIES, classify_kernel
from gpudiag.analysis.trace.ledger import (
    ATTENTION_FUSED,
    GEMM_CUDA_CORES,
    GEMM_TENSOR_CORES,
    GEMM_UNKNOWN_UNITS,
    MEMORY_BOUND_WORK,
    OTHER_KERNELS,
)
from gpudiag.rules._claims import claim, ledger_of
from gpudiag.rules._facts import trace_source
from gpudiag.rules.engine import EvidenceBundle, rule
from gpudiag.rules.finding import Evidence, Finding, FixRef, Severity, severity_for_gain

if TYPE_CHECKING:
    from gpudiag.analysis.roofline import Roofline, RooflinePoint

CATEGORY = "kernels"

MEMORY_BOUND_SHARE = 0.25  # of the profiled time
COMPILED_SHARE = 0.5  # of the memory-bound time already in Inductor's fused kernels
_FUSION_REMOVE = 0.3
_FUSION_SOURCE = (
    "an estimate: fused element-wise chains read and write each tensor once instead of once "
    "per kernel; torch.compile made element-wise chains 3-5x faster on this project's CPU "
    "(DESIGN.md); 30 % of the row, for the kernels that are not fused now"
)

FAR_BELOW = 0.10  # achieved / attainable at the op's intensity
HOT_SHARE = 0.05  # of the profiled time
_TARGET = 0.5  # the share of the roof a well-shaped product reaches, for the gain
_ROOF_ROWS = (
    GEMM_TENSOR_CORES + ".",
    GEMM_CUDA_CORES,
    GEMM_UNKNOWN_UNITS,
    ATTENTION_FUSED,
    OTHER_KERNELS,
)


@rule("kernels.memory_bound", category=CATEGORY, needs=("gpu_trace",))
def memory_bound(evidence: EvidenceBundle) -> Iterator[Finding]:
    """Memory-bound kernels (element-wise, norms, reductions, copies) hold a quarter of the
    profiled time or more, and are not fused yet."""
    trace = evidence.trace_report
    found = claim(trace, (MEMORY_BOUND_WORK,), _FUSION_REMOVE, _FUSION_SOURCE)
    if found is None or found.row_share < MEMORY_BOUND_SHARE:
        return
    kernels = [k for k in trace.kernels() if classify_kernel(k.name).work == "memory-bound"]
    total = sum(k.total_us for k in kernels)
    fused = sum(k.total_us for k in kernels if k.family == "triton-inductor")
    if total <= 0 or fused / total >= COMPILED_SHARE:
        return  # Inductor already fused them: what is left is its own kernels' work
    src = trace_source(trace)
    top = sorted(kernels, key=lambda k: -k.total_us)[:3]
    items = [
        *found.evidence(src),
        *(
            Evidence(k.short_name, round(k.total_us / 1e3, 2), f"ms in {k.count} calls", src)
            for k in top
        ),
    ]
    yield Finding(
        "kernels.memory_bound",
        severity_for_gain(found.gain),
        CATEGORY,
        f"memory-bound kernels (element-wise, normalisation, reductions, copies) hold "
        f"{found.row_share:.0%} of the time, {len(kernels)} kinds in all: each reads and writes "
        "its tensors in memory; fused, a chain of them does it once",
        tuple(items),
        threshold=f"the time ledger's memory-bound row >= {MEMORY_BOUND_SHARE:.0%} of the "
        f"profiled time, under {COMPILED_SHARE:.0%} of it in torch.compile's fused kernels",
        fix=FixRef("compile", {"mode": "default"}),
        instruction="compile the model (torch.compile) so that Inductor fuses the element-wise "
        "and normalisation chains; fused library layers (apex / Transformer Engine norms, "
        "fused optimizers: foreach=True or fused=True) cut the rest",
        estimated_gain=found.gain,
        claims=(MEMORY_BOUND_WORK,),
    )


@dataclass(frozen=True)
class _Hot:
    """Calls of one operator and shape, with their time and efficiency."""

    name: str
    dtype: str | None
    shapes: str
    calls: int
    us: float
    efficiency: float
    achieved_tflops: float
    attainable_tflops: float
    bound: str | None
    intensity: float

    @property
    def users(self) -> bool:
        """A custom operator: the user's (or an extension's) kernel, not ATen's library call."""
        return not self.name.startswith("aten::")


def _hot_points(roof: Roofline, ops: list[Any]) -> list[_Hot]:
    """The traced calls grouped by operator, shapes and dtype, each group's time and its
    achieved FLOP/s against the roof at its arithmetic intensity (calls without a cost are
    left out)."""
    from gpudiag.analysis.roofline import op_point

    groups: dict[tuple[str, str, str | None], list[RooflinePoint]] = {}
    for op in ops:
        try:
            point = op_point(op)
        except (ValueError, TypeError, IndexError, SyntaxError):
            continue
        shapes = "x".join(str(list(s)) for s in op.input_shapes[:3])
        groups.setdefault((op.name, shapes, point.dtype), []).append(point)
    out = []
    for (name, shapes, dtype), points in groups.items():
        seconds = sum(p.seconds for p in points)
        flops = sum(p.flops for p in points)
        first = points[0]
        attainable = roof.attainable_tflops(first.intensity, dtype)
        if not attainable or seconds <= 0:
            continue
        achieved = flops / seconds / 1e12
        out.append(
            _Hot(
                name,
                dtype,
                shapes,
                len(points),
                seconds * 1e6,
                achieved / attainable,
                achieved,
                attainable,
                roof.bound(first),
                first.intensity,
            )
        )
    return out


@rule("kernels.below_roof", category=CATEGORY, needs=("gpu_trace",))
def below_roof(evidence: EvidenceBundle) -> Iterator[Finding]:
    """A hot matrix product, convolution or attention call far below the roof the spec table
    allows at its arithmetic intensity (where the trace recorded its shapes)."""
    trace = evidence.trace_report
    ledger = ledger_of(trace)
    if ledger is None or not trace.device_properties:
        return
    ops = [op for op in trace.shaped_ops() if op.gpu_us]
    if not ops:
        return
    from gpudiag.analysis.roofline import roofline

    roof = roofline(trace.device_properties[0].roofline_system())
    if roof.compute_ceiling() is None or roof.memory_ceiling() is None:
        return  # a GPU the spec table does not know: no roof to set the calls against
    hot = [
        h
        for h in _hot_points(roof, ops)
        if h.us >= HOT_SHARE * ledger.window_us and h.efficiency < FAR_BELOW
    ]
    if not hot:
        return
    worst = max(hot, key=lambda h: h.us * (1 - h.efficiency))
    removable = min(0.9, max(0.0, 1.0 - worst.efficiency / _TARGET))
    device = roof.device or "the traced GPU"
    found = claim(
        trace,
        _ROOF_ROWS,
        removable,
        f"an estimate: reaching half the roof at its arithmetic intensity (roofline, spec "
        f"table: {device}); tuned libraries reach more on large shapes",
        claimed_us=worst.us,
    )
    if found is None:
        return
    src = trace_source(trace)
    items = [
        Evidence(
            f"{worst.name} [{worst.dtype}] {worst.shapes}",
            round(worst.us / 1e3, 2),
            f"ms in {worst.calls} calls",
            src,
        ),
        Evidence(
            "achieved / attainable at its intensity",
            f"{worst.achieved_tflops:.3g} / {worst.attainable_tflops:.3g}",
            f"TFLOP/s ({100 * worst.efficiency:.1f} %; {worst.intensity:.3g} FLOP/byte, "
            f"{worst.bound or 'bound unknown'})",
            f"roofline: spec table {device}",
        ),
        *found.evidence(src),
        *(
            Evidence(
                f"also far below: {h.name} {h.shapes}",
                round(100 * h.efficiency, 1),
                "% of its roof",
                src,
            )
            for h in sorted(hot, key=lambda h: -h.us)
            if h is not worst
        ),
    ][:8]
    if worst.users:
        message = (
            f"a kernel of your own ({worst.name}) runs at {worst.efficiency:.1%} of what "
            f"{device} allows at its arithmetic intensity ({worst.achieved_tflops:.3g} of "
            f"{worst.attainable_tflops:.3g} TFLOP/s, {worst.bound or 'bound unknown'}), for "
            f"{found.claimed_us / ledger.window_us:.0%} of the time"
        )
        instruction = (
            "a hand-written product far below the roof usually lacks tiling in shared memory "
            "and tensor cores: call torch.matmul (cuBLAS) or a tuned library kernel for it, or "
            "profile it with Nsight Compute (ncu --set full) to see what bounds it"
        )
        fix = None
    else:
        message = (
            f"{worst.name} on {worst.shapes} [{worst.dtype}] runs at {worst.efficiency:.1%} of "
            f"what {device} allows at its arithmetic intensity ({worst.achieved_tflops:.3g} of "
            f"{worst.attainable_tflops:.3g} TFLOP/s, {worst.bound or 'bound unknown'}), for "
            f"{found.claimed_us / ledger.window_us:.0%} of the time: the shape keeps the library "
            "kernel from filling the GPU"
        )
        instruction = (
            "small or skinny products cannot fill the GPU: batch them (one bmm or a grouped "
            "GEMM for many small ones), make the small dimension larger (batch size, tokens "
            "per step), or fuse them into their neighbours (torch.compile)"
        )
        fix = None
    yield Finding(
        "kernels.below_roof",
        severity_for_gain(found.gain),
        CATEGORY,
        message,
        tuple(items),
        threshold=f"an operator and shape >= {HOT_SHARE:.0%} of the profiled time, at under "
        f"{FAR_BELOW:.0%} of the roofline's attainable FLOP/s at its arithmetic intensity "
        "(spec-table roofs; shapes recorded with record_shapes=True)",
        fix=fix,
        instruction=instruction,
        estimated_gain=found.gain,
        claims=tuple(r.rstrip(".") for r in _ROOF_ROWS),
    )


OWN_KERNEL_SHARE = 0.10  # of the profiled time, for a kernel of the user's own


@rule("kernels.own_kernel", category=CATEGORY, needs=("gpu_trace",))
def own_kernel(evidence: EvidenceBundle) -> Iterator[Finding]:
    """A kernel of the user's own (no library knows its name) holds a tenth of the time or
    more, and the trace recorded no shapes to set it against the roof."""
    trace = evidence.trace_report
    ledger = ledger_of(trace)
    if ledger is None:
        return
    costed = {op.name for op in trace.shaped_ops() if op.gpu_us}
    for k in trace.top_kernels(5):
        if k.family not in USER_FAMILIES or k.family != "unknown":
            continue
        share = k.total_us / ledger.window_us
        if share < OWN_KERNEL_SHARE or (k.launched_by and k.launched_by in costed):
            continue
        src = trace_source(trace)
        occ = k.theoretical_occupancy
        items = [
            Evidence("kernel time", round(k.total_us / 1e3, 2), f"ms in {k.count} calls", src),
            Evidence("share of the profiled time", round(100 * share, 1), "%", src),
            Evidence("launched by", k.launched_by or "not recorded", source=src),
            Evidence(
                "grid x block",
                f"{k.grid} x {k.block}" if k.grid and k.block else "not recorded",
                source=src,
            ),
            Evidence(
                "theoretical occupancy",
                round(100 * occ, 1) if occ is not None else "N/A",
                "%" if occ is not None else "",
                src,
            ),
        ]
        yield Finding(
            "kernels.own_kernel",
            Severity.MEDIUM if share >= 0.25 else Severity.LOW,
            CATEGORY,
            f"a kernel of your own, {k.short_name}, holds {share:.0%} of the time; the trace "
            "has no shapes for it, so how far it is from the GPU's roof cannot be told",
            tuple(items),
            threshold=f"a kernel no library's naming knows >= {OWN_KERNEL_SHARE:.0%} of the "
            "profiled time, its operator without recorded shapes",
            instruction="register it as a PyTorch custom operator (custom_op) and profile with "
            "record_shapes=True, so gpudiag can set its FLOP/s against the roof; or profile "
            "it with Nsight Compute (ncu --set full) to see what bounds it",
        )
        return
