"""Plot builders: result in, plotly Figure out, with what the reader needs to see."""

from __future__ import annotations

from pathlib import Path

from gpudiag.analysis.nccl import CollectiveResult, parse_nccl_tests
from gpudiag.analysis.roofline import roofline
from gpudiag.bench.gemm import MatmulResult, MatmulRow
from gpudiag.bench.memory import BandwidthResult, BandwidthRow
from gpudiag.bench.sdpa import AttentionResult, AttentionRow
from gpudiag.bench.timing import Measurement
from gpudiag.plots.bench import (
    attention_figure,
    bandwidth_figure,
    collective_figure,
    matmul_figure,
)
from gpudiag.plots.roofline import roofline_figure
from gpudiag.probe.readings import Status, na, ok

M = Measurement((0.01, 0.011, 0.012))


def test_matmul_bars_show_achieved_against_peak() -> None:
    result = MatmulResult(
        "cpu",
        (
            MatmulRow("fp32", 64, 64, 64, M, 0.1, correct=True),
            MatmulRow("bf16", 64, 64, 64, M, 0.4, correct=True),
        ),
        peaks={"fp32": ok(0.4, "estimate: x"), "bf16": na(Status.NOT_SUPPORTED, "no")},
        unavailable={"tf32": "TF32 <is> NVIDIA's"},
    )
    fig = matmul_figure(result)
    achieved, peak = fig.data
    assert list(achieved.x) == ["fp32", "bf16", "tf32"]
    assert list(achieved.y) == [0.1, 0.4, 0]
    assert "25% of peak" in achieved.text[0]
    assert achieved.text[2] == "N/A"
    assert "&lt;is&gt;" in achieved.hovertext[2]
    assert peak.name == "peak (estimate)"
    assert list(peak.y) == [0.4, 0, 0]


def test_bandwidth_lines_per_kind_with_theoretical_roof() -> None:
    rows = (
        BandwidthRow("copy", 1 << 20, 2 << 20, M, 10.0, (9.0, 11.0), True),
        BandwidthRow("copy", 1 << 26, 2 << 26, M, 20.0, (19.0, 21.0), True),
    )
    result = BandwidthResult(
        "cuda:0",
        rows,
        theoretical={"copy": ok(3350.0, "specs"), "h2d_pinned": ok(31.5, "pcie")},
        unavailable={"h2d_pinned": "needs a CUDA device"},
    )
    fig = bandwidth_figure(result)
    (line,) = fig.data
    assert line.name == "copy"
    assert list(line.x) == [1 << 20, 1 << 26]
    assert list(line.error_y.array) == [1.0, 1.0]
    assert fig.layout.xaxis.type == "log"
    assert any("3350" in (s.text or "") for s in fig.layout.annotations)
    assert any("needs a CUDA device" in (s.text or "") for s in fig.layout.annotations)


def test_attention_forward_and_backward_panels() -> None:
    rows = (
        AttentionRow("flash", 512, M, M, 1.0, 1.0, correct=True),
        AttentionRow("flash", 1024, M, M, 1.0, 1.0, correct=True),
        AttentionRow("efficient", 512, reason="cannot run: No viable backend"),
    )
    fig = attention_figure(AttentionResult("cpu", "bf16", 1, 8, 64, True, rows))
    names = [(t.name, t.xaxis) for t in fig.data]
    assert names == [("flash", "x"), ("flash", "x2")]
    assert any("No viable backend" in (a.text or "") for a in fig.layout.annotations)


def test_collectives_overlay_measured_and_nccl_tests(fixtures_dir: Path) -> None:
    log = parse_nccl_tests(fixtures_dir / "nccl-tests" / "superbench-nccl_allreduce.log")
    failed = CollectiveResult("all_reduce", 2, "gloo", "measured", (), error="rendezvous <timeout>")
    fig = collective_figure([log, failed])
    assert len(fig.data) == 2  # out-of-place and in-place of the log
    assert all(0 not in list(t.x) for t in fig.data)  # size 0 cannot sit on a log axis
    assert max(fig.data[0].y) == 235.26
    assert "&lt;timeout&gt;" in fig.layout.annotations[0].text


def test_roofline_labels_both_regions_and_the_ridge() -> None:
    r = roofline("NVIDIA H100 80GB HBM3", points=[("gemv", 2e9, 1e9, 1e-3, "bf16")])
    fig = roofline_figure(r)
    texts = [t.text[0] for t in fig.data if t.mode == "text"]
    assert texts == ["<b>memory-bound</b>", "<b>compute-bound</b>"]
    ridge = [t for t in fig.data if (t.name or "").startswith("ridge")]
    assert ridge
    assert ridge[0].x[0] == r.ridge_intensity()
    (points,) = [t for t in fig.data if t.mode == "markers"]
    assert list(points.x) == [2.0]
    assert fig.layout.xaxis.type == "log"
    assert fig.layout.yaxis.type == "log"
