"""Plot builders and the ``gpudiag trace`` command on recorded traces."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from gpudiag.analysis.trace import TraceReport, analyze_trace
from gpudiag.cli import main
from gpudiag.plots.trace import (
    breakdown_figure,
    idle_timeline_figure,
    rank_comparison_figure,
    top_kernels_figure,
)
from tests.analysis.trace.conftest import A100_CONTROL, RESNET_NW0, V100_TEST

Report = Callable[[str], TraceReport]


def test_breakdown_figure_shares_sum_to_100(report_of: Report) -> None:
    fig = breakdown_figure(report_of(RESNET_NW0))
    assert sum(bar.x[0] for bar in fig.data) == pytest.approx(100.0)
    assert {bar.name for bar in fig.data} >= {"compute", "idle: host wait"}


def test_top_kernels_figure_orders_by_time(report_of: Report) -> None:
    report = report_of(A100_CONTROL)
    (bar,) = top_kernels_figure(report, n=5).data
    assert list(bar.x) == sorted(bar.x)  # largest at the top of a horizontal bar chart
    assert bar.x[-1] == pytest.approx(report.top_kernels(1)[0].total_us / 1000)


def test_idle_timeline_has_a_bar_per_step(report_of: Report) -> None:
    fig = idle_timeline_figure(report_of(RESNET_NW0))
    bars = [d for d in fig.data if d.type == "bar"]
    assert all(len(b.x) == 6 for b in bars)
    assert any(d.name == "waiting on DataLoader" for d in fig.data)


def test_rank_comparison_figure(traces_dir: Path) -> None:
    # The real pair of ranks 0 and 1 of a 128-rank job (HTA's trace_filter test data).
    report = analyze_trace(traces_dir / "hta-trace_filter-2of128-ranks")
    fig = rank_comparison_figure(report)
    assert [x.split()[1] for x in fig.data[0].x] == ["0", "1"]
    assert [d.name for d in fig.data][:2] == ["compute", "communication (exposed)"]
    single = rank_comparison_figure(analyze_trace(traces_dir / A100_CONTROL))
    assert "one rank only" in single.layout.annotations[0].text


def test_figures_for_a_cpu_only_report(tmp_path: Path) -> None:
    path = tmp_path / "cpu.json"
    path.write_text(
        json.dumps(
            {
                "traceEvents": [
                    {
                        "ph": "X",
                        "cat": "cpu_op",
                        "name": "aten::mm",
                        "pid": 1,
                        "tid": 1,
                        "ts": 0,
                        "dur": 5,
                    }
                ]
            }
        )
    )
    report = analyze_trace(path)
    for build in (breakdown_figure, top_kernels_figure, idle_timeline_figure):
        fig = build(report)
        assert fig.layout.annotations  # says why it is empty


def test_cli_trace_text(traces_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", str(traces_dir / RESNET_NW0), "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert "Top 3 kernels" in out
    assert "Sync points" in out
    assert "resnet50_profiler_api.py" in out
    # Where the time goes opens the report: the ledger's rows, largest first.
    first = out.splitlines()[:3]
    assert first[0].startswith("where the time goes (830.49 ms")
    assert "GEMM off tensor cores" in first[1]
    assert "idle: waiting on the DataLoader" in first[2]


def test_cli_trace_json_two_ranks(traces_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pair = traces_dir / "hta-trace_filter-2of128-ranks"
    assert main(["trace", str(pair / "sampled_rank-1.json.gz"), str(pair), "--json"]) == 1
    assert "several files claim rank 1" in capsys.readouterr().err
    assert main(["trace", str(pair), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["rank"] for r in data["ranks"]] == [0, 1]
    assert len(data["comparison"]) == 2
    assert [r["rank"] for r in data["communication"]["by_rank"]] == [0, 1]
    assert data["communication"]["pooled"]["ranks"] == 2
    ledger = data["ledger"]  # pooled over the ranks, each rank's inside
    assert [r["rank"] for r in ledger["ranks"]] == [0, 1]
    assert sum(r["us"] for r in ledger["rows"]) == pytest.approx(ledger["window_us"])


def test_cli_trace_refuses_two_jobs(traces_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Rank 3 of an 8-rank A100 job and rank 1 of a 2-rank V100 job: not one job.
    assert main(["trace", str(traces_dir / A100_CONTROL), str(traces_dir / V100_TEST)]) == 1
    err = capsys.readouterr().err
    assert "different jobs" in err
    assert "world size 2" in err
    assert "world size 8" in err


def test_cli_trace_bad_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert main(["trace", str(bad)]) == 1
    assert "gpudiag: error:" in capsys.readouterr().err


def test_cli_trace_lists_collectives(traces_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = traces_dir / "param-dlrm-8rank-v100"
    assert main(["trace", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "Collectives:" in out
    # Ranks 2, 6 and 7 start the first all_to_all together 7.1-7.6 ms after rank 1: the
    # others wait for them; rank 1, which waits 98 % of its time in the calls, is no straggler.
    assert "the others wait for rank(s) 2, 6, 7" in out
    flagged = {line.split(":")[0].strip() for line in out.splitlines() if "<- straggler" in line}
    assert flagged == {"rank   2", "rank   6", "rank   7"}
    assert main(["trace", str(folder), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {s["op"] for s in data["collectives"]["by_op"]} == {"all_reduce", "all_to_all"}
    assert len(data["collectives"]["calls"]) == 8
    assert data["stragglers"] == [2, 6, 7]
    assert data["straggler_basis"] == "collective arrivals"
    assert data["collectives"]["calls"][0]["late_ranks"] == [2, 6, 7]
