"""Step rules: step-time outliers, straggler ranks, and steps dominated by a fixed cost."""

from __future__ import annotations

import statistics
from collections.abc import Iterator

from gpudiag.rules._facts import trace_source
from gpudiag.rules.engine import EvidenceBundle, rule
from gpudiag.rules.finding import Evidence, Finding, FixRef, NotEvaluated, Severity

CATEGORY = "steps"

OUTLIER_RATIO = 1.5  # a step this much slower than the median is an outlier
MIN_STEPS = 4
# Share of a step that does not grow with the batch (from two measured batch sizes) above
# which the batch is too small to amortise Python, launches and the optimizer.
FIXED_SHARE = 0.5
FIXED_SHARE_HIGH = 0.75
# A step at 4x the batch cannot run in half the time of a step at 1x: medians that say so come
# from a disturbed measurement (warm-up, another process), not from a fixed cost. (Near 1x is
# what a tiny batch really looks like, so only a large inversion counts.)
FASTER_LARGER_TOLERANCE = 0.5


@rule("steps.outliers", category=CATEGORY, needs=("trace",))
def step_outliers(evidence: EvidenceBundle) -> Iterator[Finding]:
    """Some steps take far longer than the median step (SageMaker's step-outlier rule)."""
    trace = evidence.trace_report
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
    """Ranks with more GPU work than the others, where the collectives cannot say who waits.

    Where three or more collectives match across the ranks, the trace analysis reads the
    stragglers from who arrives late (``straggler_basis`` "collective arrivals") and
    comm.late_rank reports them: this rule stays silent, so the same waiting is told once.
    """
    trace = evidence.trace_report
    if not trace.stragglers or trace.straggler_basis != "gpu work":
        return
    src = trace_source(trace)
    summaries = {c.rank: c for c in trace.comparison}
    items = tuple(
        Evidence(f"rank {r} work", round(summaries[r].work_us / 1e3, 2), "ms", src)
        for r in trace.stragglers
        if r in summaries
    )
    named = ", ".join(map(str, trace.stragglers))
    yield Finding(
        "steps.stragglers",
        Severity.MEDIUM,
        CATEGORY,
        f"straggler rank(s) {named}: they run more GPU work than the median rank, so in a "
        "synchronous job the others wait for them (too few matched collectives to read who "
        "arrives late)",
        items,
        threshold="the trace analysis' straggler test over per-rank GPU work (used when fewer "
        "than 3 collectives match across the ranks)",
        instruction="compare those ranks' kernels and input sizes with the others', and check "
        "their GPUs with gpudiag inspect (clocks, PCIe, temperature)",
    )


@rule("steps.per_step_overhead", category=CATEGORY, needs=("batch_scaling",))
def per_step_overhead(evidence: EvidenceBundle) -> Iterator[Finding | NotEvaluated]:
    """The batch is so small that a fixed per-step cost (Python, launches, the optimizer)
    dominates: a larger batch costs little more per step (SageMaker's BatchSize rule, measured
    instead of inferred from utilization)."""
    scaling = evidence.scaling_report
    share = scaling.fixed_share
    if scaling.larger_step_s < FASTER_LARGER_TOLERANCE * scaling.step_s:
        yield NotEvaluated(
            "steps.per_step_overhead",
            f"consistent timings: batch {scaling.larger_batch_size} ran faster than batch "
            f"{scaling.batch_size} ({scaling.larger_step_s * 1e3:.3g} vs "
            f"{scaling.step_s * 1e3:.3g} ms, medians of {len(scaling.rounds)} rounds), which "
            "only a disturbed measurement does",
        )
        return
    if scaling.fixed_share_low < FIXED_SHARE:
        return
    b, big = scaling.batch_size, scaling.larger_batch_size
    src = f"batch scaling ({len(scaling.rounds)} interleaved rounds, medians)"
    severity = Severity.HIGH if share >= FIXED_SHARE_HIGH else Severity.MEDIUM
    busy = []
    if scaling.host_busy and (wl := evidence.workload) is not None and wl.device_type == "cpu":
        # Threads that wait for a descheduled sibling at every operator look like a fixed cost.
        severity = Severity.LOW
        busy = [
            Evidence(
                "host load average (busy: timings overstate the fixed cost)",
                round(scaling.load_average or 0.0, 2),  # host_busy: it was read
                f"on {scaling.cpus} CPUs",
                "os.getloadavg",
            )
        ]
    yield Finding(
        "steps.per_step_overhead",
        severity,
        CATEGORY,
        f"{share:.0%} of a step at batch {b} is a fixed per-step cost: batch {big} takes "
        f"{scaling.larger_step_s / scaling.step_s:.2f}x the time for {big // b}x the samples "
        f"(samples/s x{scaling.throughput_gain:.2f})",
        (
            Evidence(f"step at batch {b}", round(scaling.step_s * 1e3, 3), "ms", src),
            Evidence(f"step at batch {big}", round(scaling.larger_step_s * 1e3, 3), "ms", src),
            Evidence("fixed share of the step", round(100 * share, 1), "%", src),
            Evidence(
                "lowest fixed share in a round", round(100 * scaling.fixed_share_low, 1), "%", src
            ),
            *busy,
        ),
        threshold=f"fixed share of the step >= {FIXED_SHARE:.0%} in every round, from the line "
        "through the step times at two batch sizes; severity by the estimated gain (high from "
        "10 %), low without one when CPU timings were taken on a busy host",
        fix=FixRef("batch.size", {"micro_batch": big}),
        instruction=f"raise the micro-batch towards {big} (it ran here); to keep the "
        "optimisation unchanged keep the global batch (fewer accumulation steps) or retune the "
        "learning rate",
        estimated_gain=None if busy else 1.0 - 1.0 / scaling.throughput_gain,
    )
