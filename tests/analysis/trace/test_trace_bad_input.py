"""Broken or partial traces give a TraceError that says what to do, or a partial report that
says what is missing; never a bare KeyError/IndexError. Each case is built in tmp_path from a
real recorded trace."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from gpudiag.analysis.trace import analyze_trace
from gpudiag.errors import GpuDiagError, TraceError
from tests.analysis.trace.conftest import A100_CONTROL, ALEXNET, RESNET_NW4


def _doc(traces_dir: Path, name: str) -> dict[str, Any]:
    with gzip.open(traces_dir / name, "rt") as fh:
        return json.load(fh)  # type: ignore[no-any-return]


def test_trace_truncated_json(traces_dir: Path, tmp_path: Path) -> None:
    text = gzip.decompress((traces_dir / ALEXNET).read_bytes())
    path = tmp_path / "truncated.json"
    path.write_bytes(text[: len(text) * 2 // 3])
    with pytest.raises(TraceError, match="truncated"):
        analyze_trace(path)


def test_trace_truncated_json_inside_gzip(traces_dir: Path, tmp_path: Path) -> None:
    text = gzip.decompress((traces_dir / RESNET_NW4).read_bytes())
    path = tmp_path / "truncated.json.gz"
    path.write_bytes(gzip.compress(text[: len(text) // 2]))
    with pytest.raises(TraceError, match="truncated"):
        analyze_trace(path)


def test_trace_corrupt_gzip(traces_dir: Path, tmp_path: Path) -> None:
    data = bytearray((traces_dir / ALEXNET).read_bytes())
    data[40:4000] = bytes(len(data[40:4000]))  # zero a stretch of the deflate stream
    path = tmp_path / "corrupt.json.gz"
    path.write_bytes(bytes(data))
    with pytest.raises(TraceError, match="gzip"):
        analyze_trace(path)


def test_trace_cut_gzip_file(traces_dir: Path, tmp_path: Path) -> None:
    data = (traces_dir / ALEXNET).read_bytes()
    path = tmp_path / "cut.json.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceError, match="truncated gzip"):
        analyze_trace(path)


def test_trace_not_json(tmp_path: Path) -> None:
    path = tmp_path / "notes.json"
    path.write_text("this is not a trace\n")
    with pytest.raises(TraceError, match="not valid"):
        analyze_trace(path)


def test_trace_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="not found"):
        analyze_trace(tmp_path / "nope.json")


def test_trace_empty_folder(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"no \.json"):
        analyze_trace(tmp_path)


def test_trace_metadata_only(traces_dir: Path, tmp_path: Path) -> None:
    doc = _doc(traces_dir, ALEXNET)
    doc["traceEvents"] = []
    path = tmp_path / "meta.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(TraceError, match="no events"):
        analyze_trace(path)
    del doc["traceEvents"]
    path.write_text(json.dumps(doc))
    with pytest.raises(TraceError, match="no events"):
        analyze_trace(path)


def test_trace_cpu_only(traces_dir: Path, tmp_path: Path) -> None:
    doc = _doc(traces_dir, RESNET_NW4)
    gpu = {"Kernel", "Memcpy", "Memset"}
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") not in gpu]
    doc["deviceProperties"] = []
    path = tmp_path / "cpu_only.json"
    path.write_text(json.dumps(doc))
    report = analyze_trace(path)
    assert not report.has_gpu_events
    assert all(v is None for v in report.time_breakdown().values())
    assert report.top_kernels(5) == ()
    assert report.tensor_core_share is None
    assert any("CPU-only" in n for n in report.notes)
    # What the host side can still tell.
    assert report.dataloader_share is not None
    assert report.top_cpu_ops(3)
    assert len(report.steps()) == 6
    json.dumps(report.to_dict())
    assert "CPU-only" in report._repr_html_()


def test_trace_missing_device_properties(traces_dir: Path, tmp_path: Path) -> None:
    doc = _doc(traces_dir, ALEXNET)
    del doc["deviceProperties"]
    path = tmp_path / "no_devices.json"
    path.write_text(json.dumps(doc))
    report = analyze_trace(path)
    assert report.device_properties == ()
    assert any("deviceProperties" in n for n in report.notes)
    kernels = report.kernels()
    assert kernels
    assert all(k.theoretical_occupancy is None and k.sm_efficiency is None for k in kernels)
    assert report.time_breakdown()["compute_us"] == pytest.approx(
        analyze_trace(traces_dir / ALEXNET).time_breakdown()["compute_us"]
    )


def test_trace_missing_ranks(traces_dir: Path) -> None:
    report = analyze_trace(traces_dir / A100_CONTROL)  # rank 3 of a world of 8
    assert report.missing_ranks == (0, 1, 2, 4, 5, 6, 7)
    assert any("world size 8" in n for n in report.notes)
    with pytest.raises(TraceError, match="no trace for rank 0"):
        report.rank(0)


def test_trace_two_files_same_rank(traces_dir: Path, tmp_path: Path) -> None:
    for name in ("a.json.gz", "b.json.gz"):
        (tmp_path / name).write_bytes((traces_dir / A100_CONTROL).read_bytes())
    with pytest.raises(TraceError, match="several files claim rank 3"):
        analyze_trace(tmp_path)


def test_trace_unknown_event_types(traces_dir: Path, tmp_path: Path) -> None:
    doc = _doc(traces_dir, ALEXNET)
    doc["traceEvents"] += [
        {"ph": "X", "cat": "mtia_ccp_events", "name": "x", "pid": 1, "tid": 1, "ts": 1, "dur": 2},
        {"ph": "B", "cat": "cpu_op", "name": "begin", "pid": 1, "tid": 1, "ts": 1},
        {"ph": "X", "cat": "kernel", "name": "no ts", "pid": 0, "tid": 7},
        "not an event",
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": "soon", "dur": 1},
    ]
    path = tmp_path / "unknown.json"
    path.write_text(json.dumps(doc))
    report = analyze_trace(path)
    note = next(n for n in report.notes if "skipped" in n)
    assert "cat=mtia_ccp_events (1)" in note
    assert "ph=B (1)" in note
    assert report.time_breakdown()["compute_us"] == pytest.approx(
        analyze_trace(traces_dir / ALEXNET).time_breakdown()["compute_us"]
    )


def test_trace_unexpected_field_types(traces_dir: Path, tmp_path: Path) -> None:
    doc = _doc(traces_dir, RESNET_NW4)
    for e in doc["traceEvents"]:
        args = e.get("args")
        if isinstance(args, dict) and "stream" in args:
            args["stream"] = str(args["stream"])  # a string where an int is expected
    path = tmp_path / "string_streams.json"
    path.write_text(json.dumps(doc))
    ours = analyze_trace(path).time_breakdown()
    assert ours == pytest.approx(analyze_trace(traces_dir / RESNET_NW4).time_breakdown())


def test_trace_errors_are_gpudiag_errors() -> None:
    assert issubclass(TraceError, GpuDiagError)
