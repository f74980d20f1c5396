"""The streaming reader at its borders: special files, size caps, damaged stretches read around
at the cost of a clean read, ranks one at a time or in processes, the schema's one-line fields.
Each damaged case is built in tmp_path from a real recorded trace."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpudiag.analysis.trace import analyze_trace, load
from gpudiag.analysis.trace.load import load_trace
from gpudiag.analysis.trace.model import Kind
from gpudiag.errors import ArgumentError, TraceError
from tests.analysis.trace.conftest import A100_CONTROL, ALEXNET


def _text(traces_dir: Path, name: str = A100_CONTROL) -> bytes:
    return gzip.decompress((traces_dir / name).read_bytes())


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_dev_zero_is_refused_before_reading() -> None:
    with pytest.raises(TraceError, match="is a device"):
        analyze_trace("/dev/zero")


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "trace.json"
    os.mkfifo(fifo)  # opening it for reading would block until someone writes
    with pytest.raises(TraceError, match="FIFO"):
        load_trace(fifo)


def test_a_folder_is_not_a_trace_file(tmp_path: Path) -> None:
    (tmp_path / "inner.json").mkdir()
    with pytest.raises(TraceError, match="is a folder"):
        load_trace(tmp_path / "inner.json")
    with pytest.raises(TraceError, match=r"no \.json or \.json\.gz trace files"):
        analyze_trace(tmp_path)  # a folder of ranks whose only "file" is a folder


def test_binary_garbage_is_a_trace_error(tmp_path: Path) -> None:
    path = tmp_path / "garbage.json"
    path.write_bytes(np.random.default_rng(1).integers(0, 256, 300_000, np.uint8).tobytes())
    with pytest.raises(TraceError):
        analyze_trace(path)


def test_text_beyond_max_bytes_stops_with_the_way_to_raise_it(
    traces_dir: Path, tmp_path: Path
) -> None:
    with pytest.raises(TraceError, match=r"max_bytes=") as err:
        analyze_trace(traces_dir / A100_CONTROL, max_bytes=1 << 20)
    assert "raise the limit" in str(err.value)
    # The same cap holds for what a small gzip file unpacks to (a gzip bomb).
    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(gzip.compress(b'{"traceEvents": [' + b" " * (8 << 20)))
    assert bomb.stat().st_size < 100_000
    with pytest.raises(TraceError, match="more than"):
        analyze_trace(bomb, max_bytes=4 << 20)


def test_no_event_list_in_a_long_stretch_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(load, "MAX_EVENT_BYTES", 1 << 20)
    path = tmp_path / "noise.json"
    path.write_bytes(b'{"a": "' + b"x" * (3 << 20) + b'"}')
    with pytest.raises(TraceError, match="no traceEvents list"):
        load_trace(path)


def _decoded_bytes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record the length of every text the loader hands to the JSON decoder."""
    seen: list[int] = []
    original = load._decode_events
    original_one = load._EVENT_DECODER

    def counting(text: Any, problems: Any) -> Any:
        seen.append(len(text))
        return original(text, problems)

    class Counting:
        def decode(self, text: Any) -> Any:
            seen.append(len(text))
            return original_one.decode(text)

    monkeypatch.setattr(load, "_decode_events", counting)
    monkeypatch.setattr(load, "_EVENT_DECODER", Counting())
    return seen


@pytest.mark.parametrize("damage", [b"\x00", b"{", b'"', b"]"])
def test_a_bad_byte_near_the_start_costs_about_a_clean_read(
    traces_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: bytes
) -> None:
    # Before, a block that did not decode waited for the next one, and the buffer was decoded
    # again and again as it grew: quadratic time and memory (20 min and 3.35 GB for 1 GB).
    monkeypatch.setattr(load, "BLOCK_BYTES", 1 << 20)
    text = _text(traces_dir)
    at = text.index(b'"cat": "kernel"') + len(b'"cat"')  # the first kernel's ":"
    path = tmp_path / "damaged.json"
    path.write_bytes(text[:at] + damage + text[at + 1 :])
    decoded = _decoded_bytes(monkeypatch)
    report = analyze_trace(path)
    assert sum(decoded) < 3 * len(text)
    assert any("not valid JSON: they were skipped" in n for n in report.notes), report.notes
    whole = load_trace(traces_dir / A100_CONTROL).events
    damaged = load_trace(path).events
    # A damaged stretch loses the events in it, not the rest of the file.
    assert len(whole) - 20 <= len(damaged) < len(whole)


def test_a_damaged_quote_does_not_swallow_the_rest_of_the_file(
    traces_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(load, "BLOCK_BYTES", 1 << 20)
    text = _text(traces_dir)
    at = text.index(b'"name": "', text.index(b'"cat": "kernel"')) + len(b'"name": ')
    path = tmp_path / "unquoted.json"
    path.write_bytes(text[:at] + b"x" + text[at + 1 :])  # the name's opening quote is gone
    decoded = _decoded_bytes(monkeypatch)
    events = load_trace(path).events
    assert sum(decoded) < 4 * len(text)
    assert len(events) >= len(load_trace(traces_dir / A100_CONTROL).events) - 20


def test_mostly_garbage_after_a_good_start_is_refused(
    traces_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(load, "BLOCK_BYTES", 1 << 18)
    monkeypatch.setattr(load, "MAX_EVENT_BYTES", 1 << 20)
    text = _text(traces_dir, ALEXNET)
    head = text[: text.index(b"},", text.index(b'"cat": "kernel"')) + 2]
    noise = b"},{".join([b'"x": ' + b"\x01" * 40] * 200_000)
    path = tmp_path / "noise.json"
    path.write_bytes(head + b"{" + noise + b"}]}")
    with pytest.raises(TraceError, match="not valid JSON"):
        load_trace(path)


def test_ranks_in_processes_give_the_report_of_one_at_a_time(traces_dir: Path) -> None:
    folder = traces_dir / "param-dlrm-8rank-v100"
    serial = analyze_trace(folder, workers=1)
    parallel = analyze_trace(folder, workers=2)
    assert json.dumps(parallel.to_dict(), sort_keys=True) == json.dumps(
        serial.to_dict(), sort_keys=True
    )
    with pytest.raises(ArgumentError):
        analyze_trace(folder, workers=0)


def test_a_progress_callback_hears_the_megabytes_and_the_ranks(traces_dir: Path) -> None:
    heard: list[tuple[str, int, int, bool]] = []
    analyze_trace(
        traces_dir / "hta-trace_filter-2of128-ranks",
        progress=lambda p: heard.append((p.stage, p.done, p.total, p.finished)),
    )
    reads = [h for h in heard if h[0].startswith("reading")]
    assert reads
    assert all(done <= total for _, done, total, finished in reads if not finished)
    assert ("ranks", 2, 2, False) in heard
    assert heard[-1] == ("ranks", 0, 0, True)


def test_a_field_added_to_the_schema_is_a_column(
    traces_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The schema's promise: one line keeps one more args field (reloaded with the line)."""
    import importlib

    from gpudiag.analysis.trace import schema

    line = schema.ArgField("memcpy_bytes", ("bytes",), kinds=frozenset({Kind.MEMCPY}))
    monkeypatch.setattr(schema, "ROW_FIELDS", (*schema.ROW_FIELDS, line))
    try:
        fresh = importlib.reload(load)
        events = fresh.load_trace(traces_dir / A100_CONTROL).events
    finally:
        monkeypatch.undo()
        importlib.reload(load)
    memcpy = events.kind == Kind.MEMCPY
    column = events.columns["memcpy_bytes"]
    assert (column[memcpy] > 0).all()
    assert (column[~memcpy] == -1).all()
    assert np.array_equal(column[memcpy], events.launches.nbytes[events.extra[memcpy]])
