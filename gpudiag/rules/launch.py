"""Launch and utilization rules: many short kernels with the GPU waiting on the host."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from gpudiag.analysis.trace.launches import LAUNCH_BOUND_SHARE, LAUNCH_GAP_US
from gpudiag.analysis.trace.ledger import CPU_IDLE, LAUNCH_IDLE
from gpudiag.rules._claims import claim
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


_LAUNCH_REMOVE = 1.0
_LAUNCH_SOURCE = (
    "an upper bound: CUDA graphs (torch.compile mode='reduce-overhead', or cuda.graphs) launch "
    "the step's kernels as one graph, so the host no longer launches each of them"
)


@rule("launch.launch_bound", category=CATEGORY, needs=("gpu_trace",))
def launch_bound(evidence: EvidenceBundle) -> Iterator[Finding]:
    """Many short kernels, with the GPU idle in short gaps while the host launches the next:
    the time ledger's launch-overhead row at 15 % of the profiled time or more."""
    trace = evidence.trace_report
    found = claim(trace, (LAUNCH_IDLE,), _LAUNCH_REMOVE, _LAUNCH_SOURCE)
    if found is None or found.row_share < LAUNCH_BOUND_SHARE:
        return
    src = trace_source(trace)
    rows, _ = _pooled_launches(trace)
    n = len(rows)
    kernels = sum(st.kernels for _, st, _ in rows)
    short = sum(st.short_kernels for _, st, _ in rows)
    items = list(found.evidence(src))
    what = f"launch-bound: {short} of {kernels} kernels run under 10 us"
    if n == 1:
        stats = rows[0][1]
        items += [
            Evidence("median kernel time", stats.median_kernel_us, "us", src),
            Evidence(
                "GPU waiting on the host",
                round(100 * (stats.host_wait_share or 0.0), 1),
                "% of span",
                src,
            ),
            Evidence("mean launch call", stats.launch_call_mean_us, "us", src),
        ]
    elif n > 1:
        bound = [rank for rank, st, _ in rows if st.launch_bound]
        medians = sorted(st.median_kernel_us for _, st, _ in rows if st.median_kernel_us)
        calls = [st.launch_call_mean_us for _, st, _ in rows if st.launch_call_mean_us]
        items += [
            Evidence(
                f"median kernel time, median of {n} ranks",
                medians[len(medians) // 2] if medians else None,
                "us",
                src,
            ),
            Evidence(
                f"mean launch call, mean of {n} ranks",
                round(sum(calls) / len(calls), 2) if calls else None,
                "us",
                src,
            ),
            Evidence("launch-bound ranks", len(bound), f"of {n}", src),
        ]
        what = (
            f"launch-bound on {len(bound)} of {n} ranks: {short} of {kernels} kernels ({n} "
            "ranks summed) run under 10 us"
        )
    yield Finding(
        "launch.launch_bound",
        severity_for_gain(found.gain),
        CATEGORY,
        f"{what} and the GPU idles {found.row_share:.0%} of the time in short gaps while the "
        "host launches the next",
        tuple(items),
        threshold=f"the time ledger's launch-overhead row (idle gaps under {LAUNCH_GAP_US:.0f} "
        f"us between launches) >= {LAUNCH_BOUND_SHARE:.0%} of the profiled time",
        fix=FixRef("compile", {"mode": "reduce-overhead"}),
        instruction=_LAUNCH_FIX,
        estimated_gain=found.gain,
        claims=(LAUNCH_IDLE,),
    )


_LAUNCH_FIX = (
    "torch.compile(mode='reduce-overhead') fuses kernels and replays them as a CUDA graph (or "
    "capture the step with cuda.graphs); a larger batch also amortises launches"
)

CPU_BOUND_SHARE = 0.10  # of the profiled time: the host's own work leaves the GPU idle
_CPU_REMOVE = 0.5
_CPU_SOURCE = (
    "an estimate: a CUDA graph (torch.compile mode='reduce-overhead') replays the step's "
    "kernels without the operators' and Python's host work between them; what the step does "
    "outside the graph stays"
)


@rule("launch.cpu_overhead", category=CATEGORY, needs=("gpu_trace",))
def cpu_overhead(evidence: EvidenceBundle) -> Iterator[Finding]:
    """The GPU idles while the host runs operators and Python (not launches, syncs or data
    loading): the time ledger's CPU-overhead row at 10 % of the profiled time or more."""
    trace = evidence.trace_report
    found = claim(trace, (CPU_IDLE,), _CPU_REMOVE, _CPU_SOURCE)
    if found is None or found.row_share < CPU_BOUND_SHARE:
        return
    src = trace_source(trace)
    row = trace.ledger().row(CPU_IDLE)
    behind = row.host_events if row is not None else ()
    items = list(found.evidence(src))
    items += [
        Evidence(f"of it in {name} (not in its child operators)", round(us / 1e3, 2), "ms", src)
        for name, us in behind[:3]
    ]
    where = f", most of it in {behind[0][0]}" if behind else ""
    yield Finding(
        "host.cpu_bound",
        severity_for_gain(found.gain),
        CATEGORY,
        f"the GPU idles {found.row_share:.0%} of the time while the host runs operators and "
        f"Python{where}: the step is CPU-bound",
        tuple(items),
        threshold=f"the time ledger's 'CPU operator and Python overhead' row >= "
        f"{CPU_BOUND_SHARE:.0%} of the profiled time (GPU idle, the host in its operators or "
        "Python, not in a launch gap, a sync, the DataLoader or a warm-up)",
        fix=FixRef("compile", {"mode": "reduce-overhead"}),
        instruction="capture the step as a CUDA graph (torch.compile mode='reduce-overhead', "
        "or cuda.graphs) so the host work between kernels drops out; move per-step Python "
        "(logging, metric bookkeeping, tensor creation) out of the step; a larger batch gives "
        "the GPU more work per host operation",
        estimated_gain=found.gain,
        claims=(CPU_IDLE,),
    )


@rule("launch.low_utilization", category="utilization", needs=("gpu_trace",))
def low_utilization(evidence: EvidenceBundle) -> Iterator[Finding]:
    """The GPU computes for less than half of the profiled time (information: the time
    ledger's idle rows say why, and each of those has its own finding and gain)."""
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
    ledger = trace.ledger()
    idle_rows = [r for r in ledger.rows if r.kind == "idle"][:3] if ledger.window_us else []
    yield Finding(
        "gpu.low_utilization",
        Severity.INFO,
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
            *(
                Evidence(
                    f"time ledger: {r.label}", round(100 * r.us / ledger.window_us, 1), "%", src
                )
                for r in idle_rows
            ),
        ),
        threshold=f"compute + communication < {LOW_UTILIZATION:.0%} of the profiled span "
        "(information: the idle rows of the time ledger carry the gains)",
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
