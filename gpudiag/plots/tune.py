"""Tune figure: the path from the baseline to the best arm, and the time spent per arm."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from gpudiag._report import esc

if TYPE_CHECKING:  # pragma: no cover
    from gpudiag.tune.result import TuneResult

_STATUS_COLORS = {
    "best": "#54a24b",
    "accepted": "#88d27a",
    "winner": "#4c78a8",
    "raced again": "#9d9d9d",
    "dropped": "#e45756",
    "A/A control": "#bab0ac",
    "on ranks": "#b279a2",
}


def _finite(value: float) -> float:
    return value if math.isfinite(value) else 0.0


def tune_figure(result: TuneResult) -> Any:
    """Two panels: speedup of each accepted step (baseline 1.0 first) with its interval, and
    the timed seconds each arm of the search took, coloured by how it ended."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.45, 0.55],
        subplot_titles=("speedup per accepted step (interval)", "timed seconds per arm"),
    )
    steps = [a for a in result.path if a.speedup is not None]
    labels = ["baseline", *(esc(a.label) for a in steps)]
    values = [1.0, *(a.speedup.value for a in steps if a.speedup is not None)]
    plus = [0.0, *(_finite(a.speedup.high - a.speedup.value) for a in steps if a.speedup)]
    minus = [0.0, *(_finite(a.speedup.value - a.speedup.low) for a in steps if a.speedup)]
    fig.add_trace(
        go.Scatter(
            x=labels,
            y=values,
            mode="lines+markers",
            error_y={"type": "data", "array": plus, "arrayminus": minus, "visible": True},
            marker={"color": _STATUS_COLORS["best"], "size": 9},
            showlegend=False,
            hovertemplate="%{x}: %{y:.2f}x<extra></extra>",
        ),
        row=1,
        col=1,
    )
    fig.add_hline(y=1.0, line={"dash": "dot", "color": "#888"}, row=1, col=1)
    arms = list(result.history)
    fig.add_trace(
        go.Bar(
            y=[f"{a.stage}: {esc(a.label)}" for a in arms],
            x=[a.timed_s for a in arms],
            orientation="h",
            marker={"color": [_STATUS_COLORS.get(a.status, "#f58518") for a in arms]},
            text=[esc(a.status) for a in arms],
            hovertext=[esc(a.reason or a.source) for a in arms],
            showlegend=False,
        ),
        row=1,
        col=2,
    )
    fig.update_yaxes(title_text="x baseline samples/s", row=1, col=1)
    fig.update_xaxes(title_text="s", row=1, col=2)
    fig.update_layout(
        title=esc(f"gd.tune on {result.workload_description}: {result.summary()}"),
        height=max(360, 22 * len(arms) + 120),
    )
    return fig


__all__ = ["tune_figure"]
