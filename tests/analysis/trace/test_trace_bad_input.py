"""Broken or partial traces give a TraceError that says what to do, or a partial report that
says what is missing; never a bare KeyError/IndexError. Each case is built in tmp_path from a
real recorded trace."""

from __future__ import annotations

import gzip
import json
import tracemalloc
from collections.abc import Callable
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


# -- hostile or damaged variants of a real trace ---------------------------------------------

_Mutation = Callable[[dict[str, Any]], None]


def _first(doc: dict[str, Any], cat: str) -> dict[str, Any]:
    return next(e for e in doc["traceEvents"] if isinstance(e, dict) and e.get("cat") == cat)


def _set_arg(cat: str, key: str, value: Any) -> _Mutation:
    def mutate(doc: dict[str, Any]) -> None:
        _first(doc, cat)["args"][key] = value

    return mutate


def _set_field(cat: str, key: str, value: Any) -> _Mutation:
    def mutate(doc: dict[str, Any]) -> None:
        _first(doc, cat)[key] = value

    return mutate


def _set_world(value: Any) -> _Mutation:
    def mutate(doc: dict[str, Any]) -> None:
        doc["distributedInfo"]["world_size"] = value

    return mutate


# (id, mutation, note the partial report must carry)
PARTIAL: list[tuple[str, _Mutation, str]] = [
    ("correlation_above_int64", _set_arg("kernel", "correlation", 2**70), "64-bit range"),
    ("stream_above_int64", _set_arg("kernel", "stream", 2**64), "64-bit range"),
    ("grid_above_int64", _set_arg("kernel", "grid", [2**63, 1, 1]), "64-bit range"),
    ("device_below_int64", _set_arg("kernel", "device", -(2**70)), "64-bit range"),
    ("registers_above_int64", _set_arg("kernel", "registers per thread", 2**80), "64-bit"),
    ("pid_above_int64", _set_field("kernel", "pid", 2**80), "64-bit range"),
    ("negative_duration", _set_field("kernel", "dur", -5), "1 with negative duration"),
    ("string_duration", _set_field("kernel", "dur", "12"), "1 with non-numeric duration"),
    ("null_duration", _set_field("kernel", "dur", None), "1 with no duration"),
    ("world_size_1e9", _set_world(10**9), "world_size is 1000000000, not a world size"),
    ("world_size_float", _set_world(1e9), "world_size is 1000000000.0"),
    ("world_size_zero", _set_world(0), "world_size is 0"),
    ("rank_negative", lambda d: d["distributedInfo"].update(rank=-3), "rank is -3"),
    ("duration_1e300", _set_field("kernel", "dur", 1e300), "1 with duration over 11 days"),
    ("timestamp_1e400", _set_field("kernel", "ts", 10**400), "1 complete events have no usable"),
    ("timestamp_string", _set_field("kernel", "ts", "soon"), "1 complete events have no usable"),
]


@pytest.mark.parametrize(("mutate", "note"), [p[1:] for p in PARTIAL], ids=[p[0] for p in PARTIAL])
def test_damaged_real_trace_gives_a_partial_report_with_a_note(
    traces_dir: Path, tmp_path: Path, mutate: _Mutation, note: str
) -> None:
    doc = _doc(traces_dir, ALEXNET)
    mutate(doc)
    path = tmp_path / "damaged.json"
    path.write_text(json.dumps(doc))
    tracemalloc.start()
    try:
        report = analyze_trace(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 200e6  # nothing is allocated by a field's value (world_size=1e9)
    assert any(note in n for n in report.notes), report.notes
    assert report.missing_ranks == () or len(report.missing_ranks) < 8
    json.dumps(report.to_dict())
    # Every kernel but the damaged one still counts.
    reference = analyze_trace(traces_dir / ALEXNET).time_breakdown()["compute_us"]
    assert report.time_breakdown()["compute_us"] == pytest.approx(reference, rel=0.05)


def test_invalid_duration_is_not_counted_silently(traces_dir: Path, tmp_path: Path) -> None:
    doc = _doc(traces_dir, ALEXNET)
    kernel = _first(doc, "kernel")
    kernel["dur"] = -kernel["dur"]
    path = tmp_path / "negative.json"
    path.write_text(json.dumps(doc))
    note = next(n for n in analyze_trace(path).notes if "invalid duration" in n)
    assert "counted as taking 0 us" in note
    assert repr(kernel["name"][:60]) in note  # says which event


def test_invalid_utf8_in_a_real_trace(traces_dir: Path, tmp_path: Path) -> None:
    text = gzip.decompress((traces_dir / ALEXNET).read_bytes())
    at = text.index(b'"cat": "kernel"')
    at = text.index(b'"name": "', at) + len(b'"name": "')
    path = tmp_path / "bad_utf8.json.gz"
    path.write_bytes(gzip.compress(text[:at] + b"\xff\xfe\xc3" + text[at:]))
    report = analyze_trace(path)
    assert any("not valid UTF-8" in n for n in report.notes)
    assert any("\ufffd" in k.name for k in report.kernels())


@pytest.mark.parametrize("where", ["top_level", "inside_an_event"])
def test_deeply_nested_json_is_a_trace_error(traces_dir: Path, tmp_path: Path, where: str) -> None:
    text = json.dumps(_doc(traces_dir, ALEXNET))
    deep = "[" * 100_000 + "]" * 100_000
    if where == "top_level":
        text = text[:-1] + f', "x": {deep}}}'
    else:
        at = text.index('"args": {') + len('"args": {')
        text = text[:at] + f'"deep": {deep}, ' + text[at:]
    path = tmp_path / "deep.json"
    path.write_text(text)
    with pytest.raises(TraceError, match="deeper than the decoder allows"):
        analyze_trace(path)


def test_execution_trace_is_named(fixtures_dir: Path) -> None:
    path = fixtures_dir / "not-kineto" / "hta-execution_trace-benchmark_simple_add_et.json.gz"
    with pytest.raises(TraceError, match="execution trace") as err:
        analyze_trace(path)
    assert "recorded nothing" not in str(err.value)


def test_memory_timeline_is_named(fixtures_dir: Path) -> None:
    path = fixtures_dir / "not-kineto" / "hta-memory_analysis-memory_timeline.raw.gz"
    with pytest.raises(TraceError, match="memory timeline") as err:
        analyze_trace(path)
    assert "recorded nothing" not in str(err.value)


def test_rocprofiler_json_is_named(tmp_path: Path) -> None:
    # A small file in rocprofiler-sdk's (rocprofv3 --output-format json) layout, with a
    # kernel name from the recorded MI300X trace.
    kernel = "Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x192x64_MI16x16x1_SN_LDSB1"
    doc = {
        "rocprofiler-sdk-tool": [
            {
                "metadata": {"pid": 4242, "init_time": 1000, "fini_time": 9000},
                "agents": [{"node_id": 2, "type": 2, "name": "gfx942", "cu_count": 304}],
                "kernel_symbols": [{"kernel_id": 7, "kernel_name": kernel}],
                "buffer_records": {
                    "kernel_dispatch": [
                        {
                            "correlation_id": {"internal": 1, "external": 0},
                            "start_timestamp": 2000,
                            "end_timestamp": 2500,
                            "dispatch_info": {
                                "kernel_id": 7,
                                "workgroup_size": {"x": 256, "y": 1, "z": 1},
                                "grid_size": {"x": 196608, "y": 1, "z": 1},
                            },
                        }
                    ],
                    "memory_copy": [],
                },
            }
        ]
    }
    path = tmp_path / "results.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(TraceError, match="rocprofiler") as err:
        analyze_trace(path)
    assert "recorded nothing" not in str(err.value)


def _text(traces_dir: Path) -> bytes:
    return gzip.decompress((traces_dir / ALEXNET).read_bytes())


def _events_not_a_list(text: bytes) -> bytes:
    doc = json.loads(text)
    doc["traceEvents"] = {"0": doc["traceEvents"][0]}
    return json.dumps(doc).encode()


# (id, how the real trace's bytes are damaged, what the TraceError says)
REFUSED: list[tuple[str, Callable[[bytes], bytes], str]] = [
    ("empty_file", lambda t: b"", "is empty"),
    ("utf16", lambda t: t.decode().encode("utf-16"), "UTF-16"),
    ("trace_events_not_a_list", _events_not_a_list, "traceEvents is a JSON dict"),
    ("top_level_null", lambda t: b"null", "not an object or event list"),
]


@pytest.mark.parametrize(
    ("damage", "message"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED]
)
def test_unreadable_variants_of_a_real_trace_are_trace_errors(
    traces_dir: Path, tmp_path: Path, damage: Callable[[bytes], bytes], message: str
) -> None:
    path = tmp_path / "damaged.json"
    path.write_bytes(damage(_text(traces_dir)))
    with pytest.raises(TraceError, match=message):
        analyze_trace(path)


def test_utf8_byte_order_mark_is_read(traces_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + _text(traces_dir))
    assert (
        analyze_trace(path).time_breakdown() == analyze_trace(traces_dir / ALEXNET).time_breakdown()
    )


def test_absurd_device_properties_are_not_recorded(traces_dir: Path, tmp_path: Path) -> None:
    doc = _doc(traces_dir, ALEXNET)
    doc["deviceProperties"][0].update(numSms=1e308, computeMajor=-1, warpSize="32")
    path = tmp_path / "props.json"
    path.write_text(json.dumps(doc))
    device = analyze_trace(path).device_properties[0]
    assert (device.num_sms, device.compute_capability, device.warp_size) == (None, None, None)
