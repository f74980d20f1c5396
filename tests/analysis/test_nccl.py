"""nccl-tests formulas and the log parser, on real nccl-tests output from an 8x A100 node."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpudiag.analysis.nccl import (
    CollectiveResult,
    algbw_gbps,
    bus_factor,
    busbw_gbps,
    check_formulas,
    normalize_op,
    parse_nccl_tests,
    parse_nccl_tests_all,
    rows_from_times,
    size_bytes_for,
)
from gpudiag.errors import GpuDiagError

# (file, collective, peak busbw GB/s and "Avg bus bandwidth" as printed in the log)
LOGS = [
    ("superbench-nccl_allreduce.log", "all_reduce", 235.26, 68.4048),
    ("superbench-nccl_allgather.log", "all_gather", 230.07, 58.2651),
    ("superbench-nccl_alltoall.log", "all_to_all", 226.16, 58.6481),
    ("superbench-nccl_broadcast.log", "broadcast", 234.70, 64.8653),
    ("superbench-nccl_reduce.log", "reduce", 231.28, 65.018),
    ("superbench-nccl_reducescatter.log", "reduce_scatter", 231.52, 60.168),
]


@pytest.fixture(scope="module")
def logs(fixtures_dir: Path) -> Path:
    return fixtures_dir / "nccl-tests"


@pytest.mark.parametrize(("name", "op", "peak", "avg"), LOGS)
def test_parse_real_logs(logs: Path, name: str, op: str, peak: float, avg: float) -> None:
    result = parse_nccl_tests(logs / name)
    assert result.op == op
    assert result.world_size == 8
    assert result.source == "nccl-tests log"
    assert result.label == name
    assert len(result.rows) == 68  # 34 sizes x (out-of-place, in-place)
    assert sum(r.in_place for r in result.rows) == 34
    assert result.peak_busbw_gbps() == pytest.approx(peak)
    assert result.reported_avg_busbw_gbps == pytest.approx(avg)
    # nccl-tests averages every row's busbw, both placements; printed values are rounded.
    assert result.avg_busbw_gbps() == pytest.approx(avg, abs=1e-3)
    assert check_formulas(result) == []


@pytest.mark.parametrize(
    ("name", "op"),
    [
        ("superbench-nccl_allreduce.log", "all_reduce"),
        ("superbench-nccl_broadcast.log", "broadcast"),
        ("superbench-nccl_reduce.log", "reduce"),
        ("superbench-nccl_reducescatter.log", "reduce_scatter"),
    ],
)
def test_collective_is_inferred_from_the_table_alone(logs: Path, name: str, op: str) -> None:
    assert parse_nccl_tests((logs / name).read_text()).op == op


def test_all_gather_and_all_to_all_need_the_op(logs: Path) -> None:
    text = (logs / "superbench-nccl_allgather.log").read_text()
    with pytest.raises(GpuDiagError, match="op='all_gather'"):
        parse_nccl_tests(text)
    assert parse_nccl_tests(text, op="allgather").op == "all_gather"


def test_noise_lines_and_zero_rows(logs: Path) -> None:
    result = parse_nccl_tests(logs / "superbench-nccl_allreduce.log")
    zero = [r for r in result.rows if r.size_bytes == 0]
    assert len(zero) == 4  # the repeated size-0 row, both placements
    largest = max(result.rows, key=lambda r: (r.size_bytes, r.in_place))
    assert (largest.size_bytes, largest.count, largest.dtype) == (8589934592, 2147483648, "float")
    assert largest.time_us == pytest.approx(63959)
    assert largest.wrong is None  # "N/A": validation was off


def test_a_tampered_row_fails_the_formula_check(logs: Path) -> None:
    text = (logs / "superbench-nccl_allreduce.log").read_text()
    text = text.replace("134.44  235.26", "134.44  200.00")
    bad = check_formulas(parse_nccl_tests(text, op="all_reduce"))
    assert [(r.size_bytes, r.busbw_gbps) for r in bad] == [(8589934592, 200.0)]


def test_several_runs_in_one_file(logs: Path) -> None:
    text = (logs / "superbench-nccl_allreduce.log").read_text()
    text += (logs / "superbench-nccl_broadcast.log").read_text()
    with pytest.raises(GpuDiagError, match="parse_nccl_tests_all"):
        parse_nccl_tests(text)
    assert [r.op for r in parse_nccl_tests_all(text)] == ["all_reduce", "broadcast"]


def test_bad_sources() -> None:
    with pytest.raises(GpuDiagError, match="not found"):
        parse_nccl_tests("no_such_log.txt")
    with pytest.raises(GpuDiagError, match="No nccl-tests result rows"):
        parse_nccl_tests("hello\nworld\n")


def test_round_trip(logs: Path) -> None:
    result = parse_nccl_tests(logs / "superbench-nccl_reduce.log")
    again = CollectiveResult.from_dict(json.loads(json.dumps(result.to_dict())))
    assert again == result
    with pytest.raises(GpuDiagError, match="collective result"):
        CollectiveResult.from_dict({"rows": []})


def test_formulas() -> None:
    assert bus_factor("all_reduce", 8) == pytest.approx(1.75)
    assert bus_factor("allgather", 8) == pytest.approx(0.875)
    assert bus_factor("reduce_scatter", 2) == pytest.approx(0.5)
    assert bus_factor("broadcast", 64) == 1.0
    assert bus_factor("all_reduce", 1) == 0.0
    assert algbw_gbps(8589934592, 63896e-6) == pytest.approx(134.44, abs=0.01)
    assert busbw_gbps("all_reduce", 8589934592, 63896e-6, 8) == pytest.approx(235.26, abs=0.01)
    assert size_bytes_for("all_gather", 1, 4, 8) == 32
    assert size_bytes_for("all_reduce", 1, 4, 8) == 4
    assert normalize_op("all_reduce_perf") == "all_reduce"
    with pytest.raises(GpuDiagError, match="Unknown collective"):
        normalize_op("gossip")


def test_rows_from_measured_times() -> None:
    (row,) = rows_from_times("all_reduce", 4, "float", 4, [(1024, [1e-3, 2e-3, 3e-3], 0, True)])
    assert row.size_bytes == 4096
    assert row.time_us == pytest.approx(2000)
    assert (row.time_q1_us, row.time_q3_us) == pytest.approx((1500, 2500))
    assert row.algbw_gbps == pytest.approx(4096 / 2e-3 / 1e9)
    assert row.busbw_gbps == pytest.approx(row.algbw_gbps * 1.5)
    assert row.busbw_iqr_gbps == pytest.approx(
        (row.busbw_gbps * 2000 / 2500, row.busbw_gbps * 2000 / 1500)
    )


def test_html_is_escaped(logs: Path) -> None:
    result = parse_nccl_tests(logs / "superbench-nccl_allreduce.log")
    tainted = CollectiveResult("all_reduce", 2, "gloo", "measured", (), error="<b>boom</b>")
    assert "&lt;b&gt;boom" in tainted._repr_html_()
    assert "235.26" in result._repr_html_()
