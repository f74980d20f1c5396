"""Roofline figure: log-log FLOP/byte vs TFLOP/s, roofs, points, memory/compute-bound regions."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from gpudiag._report import esc

if TYPE_CHECKING:  # pragma: no cover
    from gpudiag.analysis.roofline import Roofline

MEMORY_REGION_COLOR = "rgba(76,120,168,0.10)"
COMPUTE_REGION_COLOR = "rgba(245,133,24,0.10)"
_DASH = {"specs": "solid", "estimate": "dash", "measured": "dot"}
_PALETTE = ("#4c78a8", "#f58518", "#e45756", "#72b7b2", "#54a24b", "#b279a2")


def _x_range(roofline: Roofline) -> tuple[float, float]:
    xs = [p.intensity for p in roofline.points if 0 < p.intensity < math.inf]
    ridge = roofline.ridge_intensity()
    if ridge:
        xs += [ridge / 30, ridge * 30]
    if not xs:
        return 0.1, 1000.0
    return min(xs) / 3, max(xs) * 3


def roofline_figure(roofline: Roofline) -> Any:
    """Roofs (solid: spec table, dashed: estimate, dotted: measured), the ridge, and the points;
    left of the ridge is labelled memory-bound, right of it compute-bound."""
    import plotly.graph_objects as go

    lo, hi = _x_range(roofline)
    fig = go.Figure()
    memory = roofline.memory_ceiling()
    compute = roofline.compute_ceiling()
    ridge = roofline.ridge_intensity()
    top = max(
        [c.value for c in roofline.ceilings if c.kind == "compute"]
        + [p.achieved_tflops for p in roofline.points if p.achieved_tflops < math.inf]
        + [1e-3]
    )
    bottom = (
        min([p.achieved_tflops for p in roofline.points if p.achieved_tflops > 0] + [top / 1e3]) / 3
    )
    if ridge is not None:
        # Regions as filled polygons in data coordinates (exact on log axes).
        for x0, x1, color, label in (
            (lo, ridge, MEMORY_REGION_COLOR, "memory-bound"),
            (ridge, hi, COMPUTE_REGION_COLOR, "compute-bound"),
        ):
            fig.add_scatter(
                x=[x0, x1, x1, x0, x0],
                y=[bottom, bottom, top * 3, top * 3, bottom],
                fill="toself",
                fillcolor=color,
                line_width=0,
                mode="lines",
                hoverinfo="skip",
                showlegend=False,
                name=label,
            )
            fig.add_scatter(
                x=[math.sqrt(x0 * x1)],
                y=[top * 2],
                mode="text",
                text=[f"<b>{label}</b>"],
                hoverinfo="skip",
                showlegend=False,
            )
    for c in roofline.ceilings:
        if c.kind == "compute":
            start = c.value * 1e12 / (memory.value * 1e9) if memory is not None else lo
            xs = [max(lo, min(start, hi)), hi]
            fig.add_scatter(
                x=xs,
                y=[c.value, c.value],
                mode="lines",
                name=esc(c.label),
                line={"dash": _DASH.get(c.origin, "solid"), "width": 2 if c is compute else 1},
                hovertext=esc(c.source),
                hoverinfo="text+name",
            )
        else:
            cap = compute.value if compute is not None else top
            end = min(hi, cap * 1e12 / (c.value * 1e9))
            fig.add_scatter(
                x=[lo, end],
                y=[lo * c.value / 1e3, end * c.value / 1e3],
                mode="lines",
                name=esc(c.label),
                line={
                    "dash": _DASH.get(c.origin, "solid"),
                    "color": "#333",
                    "width": 2 if c is memory else 1,
                },
                hovertext=esc(c.source),
                hoverinfo="text+name",
            )
    by_source: dict[str, list[Any]] = {}
    for p in roofline.points:
        by_source.setdefault(p.source or "points", []).append(p)
    for i, (source, pts) in enumerate(by_source.items()):
        fig.add_scatter(
            x=[p.intensity for p in pts],
            y=[p.achieved_tflops for p in pts],
            mode="markers",
            name=esc(source),
            marker={
                "size": 9,
                "color": _PALETTE[i % len(_PALETTE)],
                "line": {"width": 1, "color": "white"},
            },
            text=[
                esc(f"{p.name} [{p.dtype or '?'}] {roofline.bound(p) or ''}")
                + (
                    f"<br>{e:.0%} of attainable"
                    if (e := roofline.efficiency(p)) is not None
                    else ""
                )
                for p in pts
            ],
            hovertemplate="%{text}<br>%{x:.3g} FLOP/byte, %{y:.3g} TFLOP/s<extra></extra>",
        )
    if ridge is not None:
        fig.add_scatter(
            x=[ridge, ridge],
            y=[bottom, top * 3],
            mode="lines",
            name=f"ridge {ridge:.3g} FLOP/B",
            line={"dash": "dash", "color": "#888", "width": 1},
        )
    fig.update_layout(
        title=f"Roofline: {esc(roofline.device)}",
        xaxis={
            "type": "log",
            "title": "arithmetic intensity (FLOP/byte)",
            "range": [math.log10(lo), math.log10(hi)],
        },
        yaxis={
            "type": "log",
            "title": "TFLOP/s",
            "range": [math.log10(bottom), math.log10(top * 3)],
        },
        template="plotly_white",
    )
    for note in roofline.notes:
        fig.add_annotation(text=esc(note), xref="paper", yref="paper", x=0, y=-0.2, showarrow=False)
    return fig
