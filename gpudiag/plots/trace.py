"""Plots of a TraceReport: time breakdown, top kernels, idle time per step, ranks side by side."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from gpudiag.analysis.trace import TraceReport

# One colour per kind of GPU time, shared by every figure so they read together.
COLORS: dict[str, str] = {
    "compute": "#4c78a8",
    "communication": "#f58518",
    "memory": "#54a24b",
    "sync": "#b279a2",
    "idle: host wait": "#e45756",
    "idle: kernel wait": "#ff9d98",
    "idle: other": "#bab0ac",
}
_PARTS: tuple[tuple[str, str], ...] = (
    ("compute", "compute_us"),
    ("communication", "communication_us"),
    ("memory", "memory_us"),
    ("sync", "sync_us"),
    ("idle: host wait", "idle_host_wait_us"),
    ("idle: kernel wait", "idle_kernel_wait_us"),
    ("idle: other", "idle_other_us"),
)


def _go() -> Any:
    import plotly.graph_objects as go

    return go


def _empty(title: str, message: str) -> Any:
    go = _go()
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
    fig.update_layout(title=title, xaxis_visible=False, yaxis_visible=False, height=240)
    return fig


def breakdown_figure(report: TraceReport, rank: int | None = None) -> Any:
    """One stacked bar: the share of GPU time per category over the analysed window."""
    b = report.time_breakdown(rank)
    span = b["span_us"]
    title = "GPU time breakdown"
    if not span:
        return _empty(title, "no GPU events in this trace (CPU-only)")
    go = _go()
    fig = go.Figure()
    for label, key in _PARTS:
        value = b[key] or 0.0
        fig.add_bar(
            name=label,
            y=["GPU"],
            x=[100.0 * value / span],
            orientation="h",
            marker_color=COLORS[label],
            customdata=[[value / 1000.0]],
            hovertemplate=f"{label}: %{{x:.1f}}% (%{{customdata[0]:.2f}} ms)<extra></extra>",
        )
    fig.update_layout(
        title=f"{title} ({span / 1000:.1f} ms of GPU span)",
        barmode="stack",
        xaxis_title="% of span",
        xaxis_range=[0, 100],
        height=220,
        legend_orientation="h",
    )
    return fig


def top_kernels_figure(report: TraceReport, n: int = 10, rank: int | None = None) -> Any:
    """The kernels with the most total time, coloured by tensor-core use."""
    kernels = report.top_kernels(n, rank)
    title = f"Top {n} kernels by total time"
    if not kernels:
        return _empty(title, "no kernels in this trace")
    go = _go()
    ordered = list(reversed(kernels))
    fig = go.Figure(
        go.Bar(
            y=[f"{i + 1}. {k.short_name}" for i, k in reversed(list(enumerate(kernels)))],
            x=[k.total_us / 1000.0 for k in ordered],
            orientation="h",
            marker_color=["#4c78a8" if k.tensor_cores else "#9ecae9" for k in ordered],
            customdata=[
                [k.count, k.mean_us, 100 * k.share, "yes" if k.tensor_cores else "no"]
                for k in ordered
            ],
            hovertemplate=(
                "%{y}<br>%{x:.2f} ms, %{customdata[0]} calls, mean %{customdata[1]:.1f} us"
                "<br>%{customdata[2]:.1f}% of kernel time, tensor cores: %{customdata[3]}"
                "<extra></extra>"
            ),
        )
    )
    fig.update_layout(
        title=f"{title} (dark: tensor cores)",
        xaxis_title="total time (ms)",
        height=max(260, 28 * len(kernels) + 120),
        margin={"l": 20},
        yaxis_automargin=True,
    )
    return fig


def idle_timeline_figure(report: TraceReport, rank: int | None = None) -> Any:
    """GPU time per ProfilerStep, idle split by cause: where along the run the GPU waited."""
    steps = [s for s in report.steps(rank) if s.gpu is not None]
    title = "GPU time per step"
    if not steps:
        why = "no ProfilerStep ranges" if not report.steps(rank) else "no GPU events"
        return _empty(title, f"{why}: nothing to show per step")
    go = _go()
    fig = go.Figure()
    x = [f"#{s.number}" for s in steps]
    for label, key in _PARTS:
        values = [getattr(s.gpu, key) / 1000.0 for s in steps]
        fig.add_bar(name=label, x=x, y=values, marker_color=COLORS[label])
    loaders = [s.dataloader_us for s in steps]
    if any(v is not None for v in loaders):
        fig.add_scatter(
            name="waiting on DataLoader",
            x=x,
            y=[(v or 0.0) / 1000.0 for v in loaders],
            mode="markers",
            marker={"symbol": "diamond", "size": 10, "color": "black"},
        )
    fig.update_layout(
        title=title,
        barmode="stack",
        xaxis_title="ProfilerStep",
        yaxis_title="ms",
        legend_orientation="h",
        height=380,
    )
    return fig


def rank_comparison_figure(report: TraceReport) -> Any:
    """Compute, communication and idle time per rank; stragglers are marked."""
    rows = report.comparison
    title = "Ranks compared"
    if len(rows) < 2:
        return _empty(title, "one rank only: pass one trace file per rank to compare them")
    go = _go()
    fig = go.Figure()
    x = [f"rank {r.rank}" + (" (straggler)" if r.rank in report.stragglers else "") for r in rows]
    for label, attr in (
        ("compute", "compute_us"),
        ("communication", "communication_us"),
        ("memory", "memory_us"),
        ("idle: other", "idle_us"),
    ):
        names = {"idle_us": "idle", "communication_us": "communication (exposed)"}
        fig.add_bar(
            name=names.get(attr, label),
            x=x,
            y=[getattr(r, attr) / 1000.0 for r in rows],
            marker_color=COLORS[label],
        )
    fig.update_layout(title=title, barmode="group", yaxis_title="ms", height=380)
    return fig
