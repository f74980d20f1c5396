"""Plots of a TraceReport: time breakdown, top kernels, idle time per step, ranks side by side."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpudiag._report import esc

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


_BACKWARD = "autograd::engine::evaluate_function:"
# Phases and operators get colours of their own, so no legend entry reads as another.
_PHASE_COLORS = ("#e45756", "#54a24b", "#4c78a8")
_OPERATOR_COLORS = ("#f58518", "#72b7b2", "#b279a2", "#eeca3b", "#9d755d", "#ff9da6")


def cpu_step_figure(report: TraceReport, rank: int | None = None, top: int = 5) -> Any:
    """Where a CPU step's host time goes: by phase (backward, data loading, the rest) and by
    operator (self time of the ``top`` operators, the rest as "other"), as shares of the
    profiled steps' wall time. The title gives a profiled step's time, which includes the
    profiler's overhead: a step's own time is measured without it (``Diagnosis.step_time``)."""
    title = "where the step's time goes (host)"
    steps = [s for s in report.steps(rank) if s.in_window] or list(report.steps(rank))
    step_us = sum(s.duration_us for s in steps)
    ops = report.rank(rank).cpu_ops
    if step_us <= 0 or not ops:
        return _empty(title, "no profiler steps or operators in this trace")
    go = _go()
    fig = go.Figure()
    backward = sum(o.total_us for o in ops if o.name.startswith(_BACKWARD))
    loading = sum(s.dataloader_us or 0.0 for s in steps)
    phases = [
        ("backward (autograd)", backward),
        ("data loading", loading),
        ("forward, loss, optimizer and Python", max(step_us - backward - loading, 0.0)),
    ]
    for (label, us), color in zip(phases, _PHASE_COLORS, strict=True):
        if us > 0:
            _share_bar(fig, "by phase", label, us, step_us, color)
    by_self = sorted((o for o in ops if o.self_us > 0), key=lambda o: -o.self_us)
    for op, color in zip(by_self[:top], _OPERATOR_COLORS, strict=False):
        name = op.name.replace(_BACKWARD, "backward:", 1).replace("torch::autograd::", "")
        _share_bar(fig, "by operator", name, op.self_us, step_us, color)
    rest = max(step_us - sum(o.self_us for o in by_self[:top]), 0.0)
    _share_bar(fig, "by operator", "other operators and Python", rest, step_us, "#bab0ac")
    fig.update_layout(
        title=f"{title}: {len(steps)} profiled step(s), {step_us / len(steps) / 1000:.1f} ms "
        "each under the profiler",
        barmode="stack",
        xaxis_title="% of step time",
        xaxis_range=[0, 100],
        height=300,  # the legend's nine entries fit without a scrollbar
        legend={"orientation": "v", "x": 1.02, "y": 1.0, "font": {"size": 11}},
        margin={"l": 90, "r": 20, "t": 50, "b": 40},
    )
    return fig


def _share_bar(fig: Any, row: str, label: str, us: float, total_us: float, color: str) -> None:
    fig.add_bar(
        name=esc(label),
        y=[row],
        x=[100.0 * us / total_us],
        orientation="h",
        marker_color=color,
        customdata=[[us / 1000.0]],
        hovertemplate=esc(label) + ": %{x:.1f}% (%{customdata[0]:.1f} ms)<extra></extra>",
    )


def step_time_figure(report: TraceReport, rank: int | None = None) -> Any:
    """Where the step's time goes: the time ledger (every microsecond of the window, busy and
    idle, largest first) when the trace has GPU events, the host step's phases and operators
    otherwise (a CPU run)."""
    if report.has_gpu_events:
        from gpudiag.plots.ledger import ledger_figure

        return ledger_figure(report.ledger(rank))
    return cpu_step_figure(report, rank)
