"""Benchmark figures: achieved vs peak bars, bandwidth vs transfer size, attention backends."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gpudiag._report import esc

if TYPE_CHECKING:  # pragma: no cover
    from gpudiag.analysis.nccl import CollectiveResult
    from gpudiag.bench.gemm import MatmulResult
    from gpudiag.bench.memory import BandwidthResult
    from gpudiag.bench.sdpa import AttentionResult

ACHIEVED_COLOR = "#4c78a8"
PEAK_COLOR = "#bab0ac"
_PALETTE = ("#4c78a8", "#f58518", "#e45756", "#72b7b2", "#54a24b", "#eeca3b", "#b279a2", "#ff9da6")


def _size_label(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n:g} B"


def matmul_figure(result: MatmulResult) -> Any:
    """Best achieved TFLOP/s per dtype beside its peak (spec table, or a labelled estimate)."""
    import plotly.graph_objects as go

    dtypes = list(result.dtypes)
    achieved = [result.tflops(d) for d in dtypes]
    peaks = [result.peak_tflops(d) for d in dtypes]
    peak_sources = [
        (result.peaks[d].source or result.peaks[d].reason) if d in result.peaks else "no peak"
        for d in dtypes
    ]
    fig = go.Figure()
    fig.add_bar(
        name="achieved (best size)",
        x=dtypes,
        y=[a if a is not None else 0 for a in achieved],
        marker_color=ACHIEVED_COLOR,
        text=[
            (f"{a:.2f}" + (f"<br>{a / p:.0%} of peak" if p else "")) if a is not None else "N/A"
            for a, p in zip(achieved, peaks, strict=True)
        ],
        textposition="outside",
        hovertext=[esc(result.reason(d)) for d in dtypes],
    )
    estimate = any(s.startswith("estimate") for s in peak_sources)
    fig.add_bar(
        name="peak (estimate)" if estimate else "peak (spec table)",
        x=dtypes,
        y=[p if p is not None else 0 for p in peaks],
        marker_color=PEAK_COLOR,
        hovertext=[esc(s) for s in peak_sources],
        text=[f"{p:.2f}" if p is not None else "N/A" for p in peaks],
        textposition="outside",
    )
    fig.update_layout(
        title=f"Matmul throughput on {result.device}",
        barmode="group",
        yaxis_title="TFLOP/s",
        xaxis_title="dtype",
        template="plotly_white",
    )
    return fig


def bandwidth_figure(result: BandwidthResult) -> Any:
    """GB/s against transfer size per kind (IQR as error bars), theoretical ceilings dashed."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for i, kind in enumerate(result.kinds):
        rows = sorted(
            (r for r in result.rows if r.kind == kind and r.gbps is not None),
            key=lambda r: r.size_bytes,
        )
        if not rows:
            continue
        color = _PALETTE[i % len(_PALETTE)]
        fig.add_scatter(
            name=kind,
            x=[r.size_bytes for r in rows],
            y=[r.gbps for r in rows],
            mode="lines+markers",
            line_color=color,
            customdata=[_size_label(r.size_bytes) for r in rows],
            hovertemplate="%{customdata}: %{y:.1f} GB/s<extra>" + kind + "</extra>",
            error_y={
                "type": "data",
                "symmetric": False,
                "array": [(r.gbps_iqr[1] - (r.gbps or 0)) if r.gbps_iqr else 0 for r in rows],
                "arrayminus": [((r.gbps or 0) - r.gbps_iqr[0]) if r.gbps_iqr else 0 for r in rows],
            },
        )
        peak = result.theoretical.get(kind)
        if peak is not None and peak.ok:
            fig.add_hline(
                y=float(peak.get(0.0)),
                line_dash="dash",
                line_color=color,
                annotation_text=f"{kind} theoretical {float(peak.get(0.0)):.0f} GB/s",
            )
    missing = [esc(f"{k}: {result.reason(k)}") for k in result.kinds if result.gbps(k) is None]
    fig.update_layout(
        title=f"Memory bandwidth on {result.device}",
        xaxis={"type": "log", "title": "bytes per buffer"},
        yaxis_title="GB/s (1e9 B/s)",
        template="plotly_white",
    )
    if missing:
        fig.add_annotation(
            text="N/A: " + "<br>".join(missing),
            xref="paper",
            yref="paper",
            x=0,
            y=-0.25,
            showarrow=False,
            align="left",
            font={"size": 10},
        )
    return fig


def attention_figure(result: AttentionResult) -> Any:
    """Forward and backward time against sequence length per backend; unavailable ones listed."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("forward", "backward"), shared_yaxes=False)
    for i, backend in enumerate(result.backends):
        rows = [r for r in result.rows if r.backend == backend and r.ran and r.correct]
        if not rows:
            continue
        color = _PALETTE[i % len(_PALETTE)]
        label = backend + (" (untested on GPU)" if rows[0].untested_on_gpu else "")
        for col, attr in ((1, "forward_ms"), (2, "backward_ms")):
            pts = [(r.seq_len, getattr(r, attr)) for r in rows if getattr(r, attr) is not None]
            if not pts:
                continue
            fig.add_trace(
                go.Scatter(
                    name=label,
                    x=[p[0] for p in pts],
                    y=[p[1] for p in pts],
                    mode="lines+markers",
                    line_color=color,
                    legendgroup=backend,
                    showlegend=col == 1,
                ),
                row=1,
                col=col,
            )
    unavailable = [
        esc(f"{b}: {result.reason(b)[:120]}")
        for b in result.backends
        if not any(r.ran for r in result.rows if r.backend == b)
    ]
    fig.update_xaxes(type="log", title_text="sequence length")
    fig.update_yaxes(type="log", title_text="ms per call")
    fig.update_layout(
        title=(
            f"Attention on {result.device} "
            f"({result.dtype}, {'causal' if result.causal else 'full'})"
        ),
        template="plotly_white",
    )
    if unavailable:
        fig.add_annotation(
            text="cannot run: " + "<br>".join(unavailable),
            xref="paper",
            yref="paper",
            x=0,
            y=-0.3,
            showarrow=False,
            align="left",
            font={"size": 10},
        )
    return fig


def collective_figure(results: Sequence[CollectiveResult]) -> Any:
    """Bus bandwidth against message size for one or more results (measured and nccl-tests)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for i, result in enumerate(results):
        color = _PALETTE[i % len(_PALETTE)]
        for in_place in (False, True):
            rows = sorted(
                (r for r in result.rows if r.in_place == in_place and r.size_bytes > 0),
                key=lambda r: r.size_bytes,
            )
            if not rows:
                continue
            spreads = [r.busbw_iqr_gbps for r in rows]
            name = f"{result.op} {result.world_size} ranks, {result.backend} ({result.source}" + (
                f": {result.label})" if result.label else ")"
            )
            fig.add_scatter(
                name=name
                + (" in-place" if in_place and any(not r.in_place for r in result.rows) else ""),
                x=[r.size_bytes for r in rows],
                y=[r.busbw_gbps for r in rows],
                mode="lines+markers",
                line={
                    "color": color,
                    "dash": "dot"
                    if in_place and any(not r.in_place for r in result.rows)
                    else "solid",
                },
                customdata=[_size_label(r.size_bytes) for r in rows],
                hovertemplate="%{customdata}: busbw %{y:.2f} GB/s<extra></extra>",
                error_y={
                    "type": "data",
                    "symmetric": False,
                    "array": [
                        (s[1] - r.busbw_gbps) if s else 0
                        for s, r in zip(spreads, rows, strict=True)
                    ],
                    "arrayminus": [
                        (r.busbw_gbps - s[0]) if s else 0
                        for s, r in zip(spreads, rows, strict=True)
                    ],
                    "visible": any(spreads),
                },
            )
    errors = [esc(f"{r.op}: {r.error[:160]}") for r in results if r.error]
    fig.update_layout(
        title="Collective bus bandwidth (nccl-tests formulas)",
        xaxis={"type": "log", "title": "size (bytes)"},
        yaxis_title="bus bandwidth GB/s",
        template="plotly_white",
    )
    if errors:
        fig.add_annotation(
            text="<br>".join(errors),
            xref="paper",
            yref="paper",
            x=0,
            y=1,
            showarrow=False,
            align="left",
        )
    return fig


def collective_results_figure(result: CollectiveResult, *others: CollectiveResult) -> Any:
    """``result.plot(*others)``: one result with others (e.g. an nccl-tests log) overlaid."""
    return collective_figure([result, *others])
