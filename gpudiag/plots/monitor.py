"""Plot a monitor's samples: one strip per metric, one line per device (and per lane)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go

# Raw unit -> (divisor, unit shown): bytes read better as GiB, rates as GB/s.
_DISPLAY_UNITS: dict[str, tuple[float, str]] = {
    "B": (float(1 << 30), "GiB"),
    "B/s": (1e9, "GB/s"),
}


NODE_LINES_FROM = 16


def _node_means(samples: pd.DataFrame, hosts: dict[str, str]) -> pd.DataFrame:
    """One column per (node, metric): the mean over the node's GPUs."""
    units: dict[str, str] = dict(samples.attrs.get("units", {}))
    grouped = (
        samples.T.groupby(
            [
                [f"node {hosts.get(d, d)}" for d, _ in samples.columns],
                samples.columns.get_level_values(1),
            ]
        )
        .mean()
        .T
    )
    grouped.columns = grouped.columns.set_names(["device", "metric"])
    grouped.attrs = dict(samples.attrs)
    grouped.attrs["units"] = {
        f"node {hosts.get(d, d)}/{n}": units.get(f"{d}/{n}", "") for d, n in samples.columns
    }
    return grouped


def monitor_figure(
    samples: pd.DataFrame,
    metrics: Sequence[str] | None = None,
    devices: Sequence[str] | None = None,
    *,
    title: str | None = None,
) -> go.Figure:
    """Time series of ``Monitor.samples()``: a row of subplots per metric, shared time axis.

    ``metrics`` picks and orders the metrics (default: every metric with data); ``devices``
    restricts the devices. N/A samples (NaN) leave gaps rather than being drawn as zero.
    Samples of more than ``NODE_LINES_FROM`` GPUs on several nodes (a cluster) draw one line
    per node, the mean over its GPUs, unless ``devices`` picks some.
    """
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from gpudiag.monitoring.metrics import metric_spec

    if samples.empty or samples.columns.nlevels != 2:
        fig = go.Figure()
        fig.update_layout(title=title or "no monitor samples")
        return fig
    hosts: dict[str, str] = dict(samples.attrs.get("hosts", {}))
    shown_devices = {d for d, _ in samples.columns}
    if devices is None and len(shown_devices) > NODE_LINES_FROM and len(set(hosts.values())) > 1:
        samples = _node_means(samples, hosts)
    units: dict[str, str] = dict(samples.attrs.get("units", {}))
    columns = [
        (device, name)
        for device, name in samples.columns
        if (devices is None or device in devices) and samples[(device, name)].notna().any()
    ]

    def metric_of(name: str) -> str:
        return name.split("[", 1)[0]

    present = list(dict.fromkeys(metric_of(n) for _, n in columns))
    chosen = [m for m in metrics if m in present] if metrics is not None else present
    if not chosen:
        fig = go.Figure()
        fig.update_layout(title=title or "no data for the chosen metrics")
        return fig
    labels = []
    for metric in chosen:
        unit = next((units.get(f"{d}/{n}", "") for d, n in columns if metric_of(n) == metric), "")
        shown = _DISPLAY_UNITS.get(unit, (1.0, unit))[1]
        labels.append(f"{metric_spec(metric).label}" + (f" ({shown})" if shown else ""))
    fig = make_subplots(
        rows=len(chosen),
        cols=1,
        shared_xaxes=True,
        subplot_titles=labels,
        vertical_spacing=min(0.08, 0.5 / max(1, len(chosen))),
    )
    for row, metric in enumerate(chosen, start=1):
        for device, name in columns:
            if metric_of(name) != metric:
                continue
            unit = units.get(f"{device}/{name}", "")
            divisor = _DISPLAY_UNITS.get(unit, (1.0, unit))[0]
            lane = name[len(metric) :]
            trace: dict[str, Any] = {
                "x": samples.index,
                "y": samples[(device, name)] / divisor,
                "mode": "lines",
                "name": f"{device}{lane}",
                "legendgroup": device,
                "showlegend": row == 1 or len(chosen) == 1,
                "connectgaps": False,
            }
            fig.add_trace(go.Scatter(**trace), row=row, col=1)
    label = str(samples.attrs.get("label", ""))
    if samples.attrs.get("is_recording"):
        label += " (recording)"
    fig.update_layout(
        title=title or (f"gpudiag monitor: {label}" if label else "gpudiag monitor"),
        height=max(300, 170 * len(chosen)),
        hovermode="x unified",
        margin={"l": 60, "r": 20, "t": 60, "b": 40},
    )
    return fig


__all__ = ["monitor_figure"]
