"""Step rules: step-time outliers and straggler ranks in a trace."""

from __future__ import annotations

import statistics
from collections.abc import Iterator

from gpudiag.rules._facts import trace_source
from gpudiag.rules.engine import EvidenceBundle, rule
from gpudiag.rules.finding import Evidence, Finding, Severity

CATEGORY = "steps"

OUTLIER_RATIO = 1.5  # a step this much slower than the median is an outlier
MIN_STEPS = 4


@rule("steps.outliers", category=CATEGORY, needs=("trace",))
def step_outliers(evidence: EvidenceBundle) -> Iterator[Finding]:
    """Some steps take far longer than the median step (SageMaker's step-outlier rule)."""
    trace = evidence.trace
    steps = [s for s in trace.steps() if s.in_window]
    if len(steps) < MIN_STEPS:
        return
    durations = [s.duration_us for s in steps]
    median = statistics.median(durations)
    slow = [s for s in steps if s.duration_us > OUTLIER_RATIO * median]
    if not slow or median <= 0:
        return
    worst = max(slow, key=lambda s: s.duration_us)
    src = trace_source(trace)
    yield Finding(
        "steps.outliers",
        Severity.LOW,
        CATEGORY,
        f"{len(slow)} of {len(steps)} steps take over {OUTLIER_RATIO:g}x the median step "
        f"(worst: step {worst.number}, {worst.duration_us / median:.1f}x)",
        (
            Evidence("median step", round(median / 1e3, 2), "ms", src),
            Evidence(f"step {worst.number}", round(worst.duration_us / 1e3, 2), "ms", src),
        ),
        threshold=f"a step > {OUTLIER_RATIO:g}x the median step time ({MIN_STEPS}+ steps)",
        instruction="look at the slow steps in the trace: garbage collection, a DataLoader "
        "refill, recompilation, a checkpoint or a sync with a slow rank",
    )


@rule("steps.stragglers", category=CATEGORY, needs=("trace",))
def stragglers(evidence: EvidenceBundle) -> Iterator[Finding]:
    """Ranks whose GPU work takes longer than the others' (the rest wait for them)."""
    trace = evidence.trace
    if not trace.stragglers:
        return
    src = trace_source(trace)
    summaries = {c.rank: c for c in trace.comparison}
    items = tuple(
        Evidence(f"rank {r} work", round(summaries[r].work_us / 1e3, 2), "ms", src)
        for r in trace.stragglers
        if r in summaries
    )
    yield Finding(
        "steps.stragglers",
        Severity.MEDIUM,
        CATEGORY,
        f"straggler rank(s) {', '.join(map(str, trace.stragglers))}: the other ranks wait for "
        "them at every collective",
        items,
        threshold="the trace analysis' straggler test over per-rank GPU work",
        instruction="compare those ranks' kernels and input sizes with the others', and check "
        "their GPUs with gpudiag inspect (clocks, PCIe, temperature)",
    )
