"""Parallelism plan figure: the fastest layouts' step time split into its parts, memory beside."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from gpudiag.experiment.plan import Plan

PART_COLORS: dict[str, str] = {
    "compute": "#4c78a8",
    "communication": "#f58518",
    "pipeline bubble": "#e45756",
}


def plan_figure(plan: Plan, top: int = 12) -> Any:
    """Horizontal stacked bars (seconds per step) for the ``top`` fastest layouts, fastest on
    top; the hover says the memory per GPU and the exposed communication by kind."""
    import plotly.graph_objects as go

    layouts = list(plan.layouts[: max(1, top)])
    names = [f"{n}. {lay.name}" for n, lay in enumerate(layouts, 1)]
    parts = {
        "compute": [lay.compute_s or 0.0 for lay in layouts],
        "communication": [sum(lay.communication_s.values()) for lay in layouts],
        "pipeline bubble": [lay.bubble_s for lay in layouts],
    }
    hover = [
        f"{lay.name}<br>memory {(lay.memory_bytes or 0) / 2**30:.1f} GiB per GPU<br>"
        + "<br>".join(f"{k}: {v:.3g} s" for k, v in lay.communication_s.items())
        for lay in layouts
    ]
    fig = go.Figure()
    for part, values in parts.items():
        fig.add_trace(
            go.Bar(
                y=names,
                x=values,
                name=part,
                orientation="h",
                marker_color=PART_COLORS[part],
                hovertext=hover,
                hovertemplate="%{hovertext}<br>" + part + ": %{x:.3g} s<extra></extra>",
            )
        )
    title = f"{plan.model} on {plan.gpus} x {plan.gpu}: estimated step time"
    if not layouts:
        title += " (no layout fits)"
    fig.update_layout(
        barmode="stack",
        title=title,
        xaxis_title="seconds per step (estimated)",
        yaxis={"autorange": "reversed"},
        height=max(260, 40 + 28 * len(layouts)),
        legend={"orientation": "h"},
    )
    return fig
