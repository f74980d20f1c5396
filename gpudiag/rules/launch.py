"""Launch and utilization rules: many short kernels with the GPU waiting on the host."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from gpudiag.analysis.trace.launches import LAUNCH_BOUND_SHARE, LAUNCH_GAP_US
from gpudiag.rules._facts import trace_source
from gpudiag.rules.engine import EvidenceBundle, rule
from gpudiag.rules.finding import Evidence, Finding, FixRef, Severity, severity_for_gain

if TYPE_CHECKING:
    from gpudiag.analysis.trace.launches import LaunchStats
    from gpudiag.analysis.trace.report import TraceReport

CATEGORY = "launch overhead"

LOW_UTILIZATION = 0.50  # torch-tb-profiler: "GPU utilization < 50 %"


def _pooled_launches(trace: TraceReport) -> tuple[list[tuple[int, LaunchStats, float]], float]:
    """Each rank's launch statistics with its span, and the span-weighted short host-wait
    share over them (short gaps summed over the ranks / spans summed)."""
    rows = [
        (r.rank, r.launches, r.breakdown.span_us)
        for r in trace.ranks
        if r.launches is not None and r.breakdown is not None and r.breakdown.span_us > 0
    ]
    spans = sum(span for _, _, span in rows)
    short = sum((st.short_host_wait_share or 0.0) * span for _, st, span in rows)
    return rows, (short / spans if spans > 0 else 0.0)


@rule("launch.launch_bound", category=CATEGORY, needs=("gpu_trace",))
def launch_bound(evidence: EvidenceBundle) -> Iterator[Finding]:
    """Many short kernels, with the GPU idle in short gaps while the host launches the next."""
    trace = evidence.trace_report
    if len(trace.ranks) > 1:
        yield from _launch_bound_ranks(trace)
        return
    stats = trace.launch_stats()
    if stats is None or not stats.launch_bound:
        return
    src = trace_source(trace)
    gain = stats.short_host_wait_share
    yield Finding(
        "launch.launch_bound",
        severity_for_gain(gain) if gain is not None else Severity.MEDIUM,
        CATEGORY,
        f"launch-bound: {stats.short_kernels} of {stats.kernels} kernels run under 10 us and the "
        "GPU waits on the host between them",
        (
            Evidence("median kernel time", stats.median_kernel_us, "us", src),
            Evidence(
                "GPU waiting on the host",
                round(100 * (stats.host_wait_share or 0.0), 1),
                "% of span",
                src,
            ),
            Evidence("of it in gaps < 100 us", round(100 * (gain or 0.0), 1), "% of span", src),
            Evidence("mean launch call", stats.launch_call_mean_us, "us", src),
        ),
        threshold="the trace analysis' launch-bound test: " + stats.reason,
        fix=FixRef("compile", {"mode": "reduce-overhead"}),
        instruction=_LAUNCH_FIX,
        estimated_gain=gain,
    )


_LAUNCH_FIX = (
    "torch.compile(mode='reduce-overhead') fuses kernels and replays them as a CUDA graph (or "
    "capture the step with cuda.graphs); a larger batch also amortises launches"
)


def _launch_bound_ranks(trace: TraceReport) -> Iterator[Finding]:
    """The launch-bound test over every rank: counts summed, shares over the summed spans."""
    rows, gain = _pooled_launches(trace)
    bound = [rank for rank, st, _ in rows if st.launch_bound]
    if not rows or gain < LAUNCH_BOUND_SHARE:
        return
    src = trace_source(trace)
    n = len(rows)
    kernels = sum(st.kernels for _, st, _ in rows)
    short = sum(st.short_kernels for _, st, _ in rows)
    spans = sum(span for _, _, span in rows)
    host = sum((st.host_wait_share or 0.0) * span for _, st, span in rows) / spans
    medians = sorted(st.median_kernel_us for _, st, _ in rows if st.median_kernel_us is not None)
    calls = [st.launch_call_mean_us for _, st, _ in rows if st.launch_call_mean_us is not None]
    items = [
        Evidence(
            f"median kernel time, median of {n} ranks",
            medians[len(medians) // 2] if medians else None,
            "us",
            src,
        ),
        Evidence(
            f"GPU waiting on the host ({n} ranks pooled)", round(100 * host, 1), "% of span", src
        ),
        Evidence(
            f"of it in gaps < 100 us ({n} ranks pooled)", round(100 * gain, 1), "% of span", src
        ),
        Evidence(
            f"mean launch call, mean of {n} ranks",
            round(sum(calls) / len(calls), 2) if calls else None,
            "us",
            src,
        ),
        Evidence("launch-bound ranks", len(bound), f"of {n}", src),
    ]
    yield Finding(
        "launch.launch_bound",
        severity_for_gain(gain),
        CATEGORY,
        f"launch-bound on {len(bound)} of {n} ranks: {short} of {kernels} kernels ({n} ranks "
        "summed) run under 10 us and the GPU waits on the host between them",
        tuple(items),
        threshold=f"the trace analysis' launch-bound test over the ranks pooled: host-wait gaps "
        f"under {LAUNCH_GAP_US:.0f} us >= {LAUNCH_BOUND_SHARE:.0%} of the summed spans",
        fix=FixRef("compile", {"mode": "reduce-overhead"}),
        instruction=_LAUNCH_FIX,
        estimated_gain=gain,
    )


@rule("launch.low_utilization", category="utilization", needs=("gpu_trace",))
def low_utilization(evidence: EvidenceBundle) -> Iterator[Finding]:
    """The GPU computes for less than half of the profiled time."""
    trace = evidence.trace_report
    b = trace.time_breakdown()
    span = b.get("span_us") or 0.0
    if span <= 0:
        return
    busy = ((b.get("compute_us") or 0.0) + (b.get("communication_us") or 0.0)) / span
    if busy >= LOW_UTILIZATION:
        return
    host = (b.get("idle_host_wait_us") or 0.0) / span
    src = trace_source(trace)
    scope = f" ({len(trace.ranks)} ranks pooled)" if len(trace.ranks) > 1 else ""
    # Without ProfilerStep ranges the span is the whole capture, idle set-up included: the
    # number is still true of the capture, but says less about the training step.
    stepped = bool(trace.steps())
    instruction = (
        "the other findings say why the host is slow (input pipeline, syncs, launches); a "
        "small batch also leaves the GPU idle"
    )
    if not stepped:
        instruction = (
            "the trace has no ProfilerStep ranges, so idle time outside the training loop "
            "counts too: profile with a schedule and prof.step() to measure the steps; "
            + instruction
        )
    yield Finding(
        "gpu.low_utilization",
        Severity.MEDIUM if stepped else Severity.LOW,
        "utilization",
        f"the GPU runs kernels {busy:.0%} of the profiled time; it waits on the host {host:.0%}"
        + ("" if stepped else " (whole capture: no step ranges)"),
        (
            Evidence(
                f"kernel time (compute + communication){scope}",
                round(100 * busy, 1),
                "% of span",
                src,
            ),
            Evidence(f"idle waiting on the host{scope}", round(100 * host, 1), "% of span", src),
            *_span_evidence(trace, span, src),
            Evidence("profiler steps", len(trace.steps()), source=src),
        ),
        threshold=f"compute + communication < {LOW_UTILIZATION:.0%} of the profiled span "
        "(medium over profiler steps, low over a capture without steps)",
        instruction=instruction,
    )


def _span_evidence(trace: TraceReport, span: float, src: str) -> tuple[Evidence, ...]:
    """The span, and with several ranks what it is: their spans summed, and each rank's."""
    n = len(trace.ranks)
    if n == 1:
        return (Evidence("span", round(span / 1e3, 1), "ms", src),)
    spans = sorted(r.breakdown.span_us for r in trace.ranks if r.breakdown is not None)
    return (
        Evidence(f"span ({n} ranks summed)", round(span / 1e3, 1), "ms", src),
        Evidence(
            "span per rank, shortest - longest",
            f"{spans[0] / 1e3:.1f} - {spans[-1] / 1e3:.1f}",
            "ms",
            src,
        ),
    )
