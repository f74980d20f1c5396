"""Memory figures: a step's live bytes as a stacked area by category; estimates as bars."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from gpudiag.analysis.snapshot_diff import SnapshotDiff, SnapshotRanks
    from gpudiag.experiment.fit import FitResult
    from gpudiag.experiment.memory_report import MemoryReport
    from gpudiag.profiling.memory import MemoryTimeline

_MIB = 2**20
CATEGORY_COLORS: dict[str, str] = {
    "parameters": "#54a24b",
    "gradients": "#4c78a8",
    "optimizer_state": "#eeca3b",
    "activations": "#e45756",
    "temporaries": "#b279a2",
    "kv_cache": "#f58518",
    "inputs": "#72b7b2",
    "other": "#bab0ac",
}
# The categories a snapshot's allocation stacks are read into (gpudiag.analysis.snapshot_diff).
SNAPSHOT_COLORS: dict[str, str] = {
    "parameters": "#54a24b",
    "optimizer": "#eeca3b",
    "forward": "#e45756",
    "backward": "#4c78a8",
    "other": "#bab0ac",
    "no stack recorded": "#79706e",
}


# A step's memory events number in the tens of thousands; a figure (and a notebook that stores
# it) needs a few thousand points to show the same shape.
MAX_TIMELINE_POINTS = 2000


def plotted_rows(totals: Sequence[int], max_points: int = MAX_TIMELINE_POINTS) -> list[int]:
    """Row indices to draw: all of them when few, else the lowest and highest total of each of
    ``max_points // 2`` equal slices (so every rise and fall shows), the peak always included."""
    n = len(totals)
    if n <= max_points:
        return list(range(n))
    buckets = max_points // 2
    keep = {max(range(n), key=totals.__getitem__)}
    for b in range(buckets):
        lo, hi = b * n // buckets, (b + 1) * n // buckets
        if lo < hi:
            part = range(lo, hi)
            keep.add(min(part, key=totals.__getitem__))
            keep.add(max(part, key=totals.__getitem__))
    return sorted(keep)


def timeline_figure(timeline: MemoryTimeline, *, title: str = "Memory of one step") -> Any:
    """Stacked area of live MiB by category over the step, the peak marked."""
    import plotly.graph_objects as go

    fig = go.Figure()
    t0 = timeline.times_us[0] if timeline.times_us else 0.0
    keep = plotted_rows(timeline.totals)
    xs = [(timeline.times_us[i] - t0) / 1000.0 for i in keep]
    for category in timeline.categories:
        series = timeline.series(category)
        ys = [series[i] / _MIB for i in keep]
        if not any(ys):
            continue
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                name=category.replace("_", " "),
                stackgroup="memory",
                mode="lines",
                line={"width": 0.5, "color": CATEGORY_COLORS.get(category)},
            )
        )
    if timeline.rows:
        fig.add_hline(
            y=timeline.peak_bytes / _MIB,
            line_dash="dot",
            annotation_text=f"peak {timeline.peak_bytes / _MIB:,.1f} MiB",
        )
    fig.update_layout(
        title=title, xaxis_title="ms into the step", yaxis_title="live MiB", hovermode="x unified"
    )
    return fig


def whatif_figure(
    rows: Sequence[tuple[str, Mapping[str, int]]],
    *,
    budget_bytes: int | None = None,
    title: str = "Peak memory per option",
) -> Any:
    """One stacked bar per option (label, category -> bytes), the budget as a line."""
    import plotly.graph_objects as go

    fig = go.Figure()
    labels = [label for label, _ in rows]
    categories = [c for c in CATEGORY_COLORS if any(b.get(c) for _, b in rows)]
    for category in categories:
        fig.add_trace(
            go.Bar(
                x=labels,
                y=[b.get(category, 0) / _MIB for _, b in rows],
                name=category.replace("_", " "),
                marker_color=CATEGORY_COLORS[category],
            )
        )
    if budget_bytes:
        fig.add_hline(
            y=budget_bytes / _MIB,
            line_dash="dash",
            line_color="black",
            annotation_text=f"budget {budget_bytes / _MIB:,.0f} MiB",
        )
    fig.update_layout(title=title, barmode="stack", yaxis_title="peak MiB")
    return fig


def memory_report_figure(report: MemoryReport) -> Any:
    """``MemoryReport.plot()``: the measured step's timeline, titled with its workload."""
    return timeline_figure(report.timeline, title=f"Memory of one step: {report.workload}")


def fit_figure(result: FitResult) -> Any:
    """``FitResult.plot()``: one bar per what-if that has a peak, the budget as a line."""
    rows = [(w.label, w.breakdown) for w in result.whatifs if w.peak_bytes is not None]
    return whatif_figure(rows, budget_bytes=result.budget_bytes)


def snapshot_diff_figure(diff: SnapshotDiff, *, top: int = 15) -> Any:
    """``SnapshotDiff.plot()``: the stacks whose live memory changed most, one bar each (MiB,
    growth right, shrinkage left), coloured by category."""
    import plotly.graph_objects as go

    rows = list(reversed(diff.top(top)))  # plotly draws the first bar at the bottom
    fig = go.Figure(
        go.Bar(
            x=[r.bytes_delta / _MIB for r in rows],
            y=[f"{r.where[:70]} ({r.category})" for r in rows],
            orientation="h",
            marker_color=[SNAPSHOT_COLORS.get(r.category, "#bab0ac") for r in rows],
            customdata=[[r.count_before, r.count_after] for r in rows],
            hovertemplate="%{x:,.1f} MiB, blocks %{customdata[0]} -> %{customdata[1]}"
            "<extra></extra>",
        )
    )
    a, b = diff.labels
    fig.update_layout(
        title=f"What changed: {a} -> {b} (allocated {diff.allocated_delta_bytes / _MIB:+,.0f} MiB)",
        xaxis_title="change of live MiB",
        height=max(300, 40 + 28 * len(rows)),
    )
    return fig


def snapshot_ranks_figure(ranks: SnapshotRanks) -> Any:
    """``SnapshotRanks.plot()``: allocated MiB per rank, stacked by category."""
    import plotly.graph_objects as go

    from gpudiag.analysis.snapshot_diff import category_bytes

    per_rank = [category_bytes(s.holders) for s in ranks.snapshots]
    labels = [f"rank {r}" for r in ranks.ranks]
    fig = go.Figure()
    for category, color in SNAPSHOT_COLORS.items():
        ys = [b.get(category, 0) / _MIB for b in per_rank]
        if any(ys):
            fig.add_trace(go.Bar(x=labels, y=ys, name=category, marker_color=color))
    fig.update_layout(
        title=f"Live memory per rank ({ranks.source})", barmode="stack", yaxis_title="MiB"
    )
    return fig
