"""Launch and utilization rules: many short kernels with the GPU waiting on the host."""

from __future__ import annotations

from collections.abc import Iterator

from gpudiag.rules._facts import trace_source
from gpudiag.rules.engine import EvidenceBundle, rule
from gpudiag.rules.finding import Evidence, Finding, FixRef, Severity, severity_for_gain

CATEGORY = "launch overhead"

LOW_UTILIZATION = 0.50  # torch-tb-profiler: "GPU utilization < 50 %"


@rule("launch.launch_bound", category=CATEGORY, needs=("gpu_trace",))
def launch_bound(evidence: EvidenceBundle) -> Iterator[Finding]:
    """Many short kernels, with the GPU idle in short gaps while the host launches the next."""
    trace = evidence.trace_report
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
        instruction="torch.compile(mode='reduce-overhead') fuses kernels and replays them as a "
        "CUDA graph (or capture the step with cuda.graphs); a larger batch also amortises launches",
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
                "kernel time (compute + communication)", round(100 * busy, 1), "% of span", src
            ),
            Evidence("idle waiting on the host", round(100 * host, 1), "% of span", src),
            Evidence("span", round(span / 1e3, 1), "ms", src),
            Evidence("profiler steps", len(trace.steps()), source=src),
        ),
        threshold=f"compute + communication < {LOW_UTILIZATION:.0%} of the profiled span "
        "(medium over profiler steps, low over a capture without steps)",
        instruction=instruction,
    )
