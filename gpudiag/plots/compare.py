"""Comparison figures: step-time distributions, speedup with its interval, peak memory."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from gpudiag._report import esc

if TYPE_CHECKING:  # pragma: no cover
    from gpudiag.experiment.compare import Comparison

BASELINE_COLOR = "#bab0ac"
_VERDICT_COLORS = {
    "faster": "#54a24b",
    "slower": "#e45756",
    "no significant difference": "#4c78a8",
    "undecided": "#9d9d9d",
}


def _bar(length: float) -> float:
    """An error bar's length; none where too few rounds gave no interval (infinite)."""
    return length if math.isfinite(length) else 0.0


def comparison_figure(comparison: Comparison) -> Any:
    """Three panels: per-step times of every arm (box + points), speedup with CI, peak memory."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    arms = [comparison.baseline, *comparison.arms]
    fig = make_subplots(
        rows=1,
        cols=3,
        column_widths=[0.45, 0.3, 0.25],
        subplot_titles=(
            "step time per arm (ms)",
            f"speedup vs baseline ({comparison.confidence:.0%} CI)",
            "peak memory (MiB)",
        ),
    )
    for arm in arms:
        color = (
            BASELINE_COLOR if arm.is_baseline else _VERDICT_COLORS.get(arm.verdict or "", "#f58518")
        )
        fig.add_trace(
            go.Box(
                y=[s * 1e3 for s in arm.step_time.samples_s],
                name=esc(arm.label),
                boxpoints="all",
                jitter=0.4,
                pointpos=0,
                marker={"color": color, "size": 4},
                line={"color": color},
                showlegend=False,
                hovertemplate="%{y:.2f} ms<extra>" + esc(arm.label) + "</extra>",
            ),
            row=1,
            col=1,
        )
    measured = [
        a for a in comparison.arms if a.speedup is not None and math.isfinite(a.speedup.value)
    ]
    if measured:
        fig.add_trace(
            go.Scatter(
                x=[a.speedup.value for a in measured if a.speedup],
                y=[esc(a.label) for a in measured],
                mode="markers",
                marker={
                    "size": 10,
                    "color": [_VERDICT_COLORS.get(a.verdict or "", "#f58518") for a in measured],
                },
                error_x={
                    "type": "data",
                    "symmetric": False,
                    "array": [
                        _bar(a.speedup.high - a.speedup.value) for a in measured if a.speedup
                    ],
                    "arrayminus": [
                        _bar(a.speedup.value - a.speedup.low) for a in measured if a.speedup
                    ],
                },
                text=[esc(f"{a.verdict}: {a.speedup}") for a in measured],
                hovertemplate="%{text}<extra></extra>",
                showlegend=False,
            ),
            row=1,
            col=2,
        )
        fig.add_vline(x=1.0, line={"dash": "dash", "color": "#888"}, row=1, col=2)
    with_memory = [a for a in arms if a.memory is not None and a.memory.peak_bytes is not None]
    if with_memory:
        fig.add_trace(
            go.Bar(
                x=[esc(a.label) for a in with_memory],
                y=[(a.memory.peak_bytes or 0) / 2**20 for a in with_memory if a.memory],
                marker={
                    "color": [BASELINE_COLOR if a.is_baseline else "#4c78a8" for a in with_memory]
                },
                hovertemplate="%{y:,.1f} MiB<extra></extra>",
                showlegend=False,
            ),
            row=1,
            col=3,
        )
    method = (
        with_memory[0].memory.method if with_memory and with_memory[0].memory else "not measured"
    )
    fig.update_layout(
        title={
            # Two lines: a long workload and hardware description is not cut off.
            "text": esc(comparison.workload_description)
            + "<br><span style='font-size:11px'>"
            + esc(f"on {comparison.hardware}")
            + "</span>",
            "font": {"size": 13},
        },
        height=400,
        margin={"l": 40, "r": 20, "t": 95, "b": 80},
        annotations=[
            *fig.layout.annotations,
            {
                "text": esc(f"memory: {method}"),
                "xref": "paper",
                "yref": "paper",
                "x": 1.0,
                "y": -0.28,
                "showarrow": False,
                "font": {"size": 10},
                "xanchor": "right",
            },
        ],
    )
    fig.update_xaxes(title_text="baseline time / fix time", row=1, col=2)
    return fig
