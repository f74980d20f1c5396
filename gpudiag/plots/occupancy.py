"""Plot of theoretical occupancy against block size, coloured by the limiting resource."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from gpudiag.analysis.occupancy import Occupancy

# One colour per resource, so the limiting one is visible at a glance.
RESOURCE_COLORS: dict[str, str] = {
    "warps": "#4c78a8",
    "registers": "#e45756",
    "shared_memory": "#f58518",
    "blocks": "#54a24b",
    "barriers": "#b279a2",
    "none": "#9d9d9d",
}
_LABELS = {
    "warps": "warps per SM",
    "registers": "registers",
    "shared_memory": "shared memory",
    "blocks": "blocks per SM",
    "barriers": "barriers",
    "none": "cannot launch",
}


def _primary(occ: Occupancy) -> str:
    """The resource a bar is coloured by: the first limiting one, or 'none' when 0 blocks."""
    if occ.active_blocks_per_sm == 0 and occ.reason:
        for name in ("warps", "registers", "shared_memory"):
            if occ.blocks_limit.get(name) == 0:
                return name
        return "none"
    return occ.limiting[0] if occ.limiting else "none"


def _hover(occ: Occupancy) -> str:
    limits = "<br>".join(
        f"  {k}: {'no limit' if v is None else v} blocks" for k, v in occ.blocks_limit.items()
    )
    head = (
        f"block {occ.threads_per_block} threads: {occ.occupancy_pct:.1f}%"
        f"<br>{occ.active_blocks_per_sm} blocks, "
        f"{occ.active_warps_per_sm}/{occ.max_warps_per_sm} warps"
        f"<br>limited by {', '.join(occ.limiting) or '-'}"
    )
    return f"{head}<br>{limits}"


def occupancy_curve_figure(
    curve: Sequence[Occupancy],
    *,
    current: Occupancy | None = None,
    best: Occupancy | None = None,
    title: str | None = None,
) -> Any:
    """A bar per block size (occupancy %), coloured by the resource that limits it.

    ``current`` draws a dashed line at the block size in use, ``best`` marks the block size
    that maximises occupancy. Returns a ``plotly.graph_objects.Figure``.
    """
    import plotly.graph_objects as go

    fig = go.Figure()
    by_resource: dict[str, list[Occupancy]] = {}
    for occ in curve:
        by_resource.setdefault(_primary(occ), []).append(occ)
    for name in RESOURCE_COLORS:
        points = by_resource.get(name)
        if not points:
            continue
        fig.add_trace(
            go.Bar(
                x=[o.threads_per_block for o in points],
                y=[o.occupancy_pct for o in points],
                name=f"limited by {_LABELS[name]}" if name != "none" else _LABELS[name],
                marker_color=RESOURCE_COLORS[name],
                hovertext=[_hover(o) for o in points],
                hoverinfo="text",
            )
        )
    if current is not None:
        fig.add_vline(
            x=current.threads_per_block,
            line_dash="dash",
            line_color="#333",
            annotation_text=f"current: {current.occupancy_pct:.0f}%",
            annotation_position="top left",
        )
    if best is not None:
        fig.add_trace(
            go.Scatter(
                x=[best.threads_per_block],
                y=[best.occupancy_pct],
                mode="markers",
                marker={"symbol": "star", "size": 14, "color": "#222"},
                name=f"best: {best.threads_per_block} threads ({best.occupancy_pct:.0f}%)",
                hoverinfo="name",
            )
        )
    if title is None and curve:
        first = curve[0]
        smem = first.smem_per_block_bytes + first.dynamic_smem_per_block_bytes
        title = (
            f"Occupancy vs block size: cc {first.cc[0]}.{first.cc[1]}, "
            f"{first.regs_per_thread} regs/thread, {smem} B shared memory/block"
        )
    fig.update_layout(
        title=title,
        xaxis_title="threads per block",
        yaxis_title="theoretical occupancy (%)",
        yaxis_range=[0, 105],
        barmode="overlay",
        bargap=0.15,
        legend={"orientation": "h", "y": -0.2},
        margin={"l": 60, "r": 20, "t": 60, "b": 40},
        template="plotly_white",
    )
    return fig
