"""The time ledger as a figure: where the step's time goes, busy and idle, largest first."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpudiag._report import esc

if TYPE_CHECKING:  # pragma: no cover
    from gpudiag.analysis.trace.ledger import Ledger

BUSY_COLOR = "#4c78a8"
IDLE_COLOR = "#e45756"
UNEXPLAINED_COLOR = "#bab0ac"
_ROW_HEIGHT = 26


def ledger_figure(ledger: Ledger) -> Any:
    """One horizontal bar per ledger row, largest on top, as a share of the window; busy rows
    blue, idle rows red, the unexplained idle grey. Hovering a bar lists what is behind it."""
    import plotly.graph_objects as go

    title = "where the step's time goes"
    fig = go.Figure()
    if ledger.window_us <= 0 or not ledger.rows:
        fig.add_annotation(
            text=esc(ledger.notes[0] if ledger.notes else "no GPU time to account for"),
            showarrow=False,
            x=0.5,
            y=0.5,
            xref="paper",
            yref="paper",
        )
        fig.update_layout(title=title, xaxis_visible=False, yaxis_visible=False, height=220)
        return fig
    rows = list(reversed(ledger.rows))  # plotly draws the first category at the bottom
    labels = [esc(r.label) for r in rows]
    shares = [100.0 * r.us / ledger.window_us for r in rows]
    colors = [
        UNEXPLAINED_COLOR
        if r.bucket == "idle.unexplained"
        else (BUSY_COLOR if r.kind == "busy" else IDLE_COLOR)
        for r in rows
    ]
    behind = [
        "<br>".join(
            esc(f"{n[:70]}: {us / 1e3:.2f} ms") for n, us in (r.kernels or r.host_events)[:3]
        )
        or esc(r.detail)
        for r in rows
    ]
    fig.add_bar(
        y=labels,
        x=shares,
        orientation="h",
        marker_color=colors,
        customdata=[[r.us / 1e3, b] for r, b in zip(rows, behind, strict=True)],
        hovertemplate="%{y}: %{x:.1f}% (%{customdata[0]:.2f} ms)<br>%{customdata[1]}"
        "<extra></extra>",
        showlegend=False,
    )
    busy = 100.0 * ledger.busy_us / ledger.window_us
    fig.update_layout(
        title=esc(
            f"{title}: {ledger.window_us / 1e3:.1f} ms, GPU busy {busy:.0f}%, idle "
            f"{100 - busy:.0f}% (unexplained {100 * ledger.unexplained_us / ledger.window_us:.1f}%)"
        ),
        xaxis_title="% of the window",
        xaxis_range=[0, max(shares) * 1.1],
        height=80 + _ROW_HEIGHT * len(rows),
        margin={"l": 20, "r": 20, "t": 50, "b": 40},
        yaxis={"automargin": True},
    )
    return fig
