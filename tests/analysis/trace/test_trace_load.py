"""Decoding: gzip or plain, old and new Kineto spellings, streamed in blocks."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpudiag.analysis.trace import load
from gpudiag.analysis.trace.load import load_trace
from gpudiag.analysis.trace.model import Kind
from tests.analysis.trace.conftest import A100_CONTROL, ALEXNET, NCCL, RESNET_NW0


def _json_events(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt") as fh:
        return json.load(fh)["traceEvents"]  # type: ignore[no-any-return]


def test_load_counts_complete_events_by_kind(traces_dir: Path) -> None:
    raw = _json_events(traces_dir / ALEXNET)
    trace = load_trace(traces_dir / ALEXNET)
    kinds = trace.events.kind
    assert int((kinds == Kind.KERNEL).sum()) == sum(e.get("cat") == "kernel" for e in raw)
    assert int((kinds == Kind.RUNTIME).sum()) == sum(e.get("cat") == "cuda_runtime" for e in raw)
    assert int((kinds == Kind.GPU_SYNC).sum()) == sum(e.get("cat") == "cuda_sync" for e in raw)
    assert trace.rank == 0
    assert trace.devices[0].name == "NVIDIA A100-PG509-200"
    assert trace.devices[0].compute_capability == (8, 0)
    assert trace.devices[0].num_sms == 108


def test_load_reads_2021_spellings(traces_dir: Path) -> None:
    """The kineto samples say Operator/Runtime/Kernel/Memcpy, tid 'stream 7'."""
    trace = load_trace(traces_dir / RESNET_NW0)
    ev = trace.events
    kernels = np.flatnonzero(ev.kind == Kind.KERNEL)
    assert kernels.size == 8772
    assert set(ev.stream[kernels].tolist()) == {7}
    assert (ev.correlation[kernels] >= 0).all()
    steps = [ev.names[i] for i in ev.name[ev.kind == Kind.STEP]]
    assert len(steps) == 6
    assert all(s.startswith("ProfilerStep#") for s in steps)
    # Every sync call of the old format keeps its operator's "Call stack".
    assert ev.stacks


def test_load_keeps_fractional_timestamps(traces_dir: Path) -> None:
    raw = _json_events(traces_dir / NCCL)
    first_kernel = next(e for e in raw if e.get("cat") == "kernel")
    ev = load_trace(traces_dir / NCCL).events
    row = int(np.flatnonzero(ev.kind == Kind.KERNEL)[0])
    assert ev.ts[row] == first_kernel["ts"]
    assert ev.dur[row] == first_kernel["dur"]


@pytest.mark.parametrize("block_bytes", [4096, 65536])
def test_load_in_small_blocks_gives_the_same_events(
    traces_dir: Path, monkeypatch: pytest.MonkeyPatch, block_bytes: int
) -> None:
    whole = load_trace(traces_dir / A100_CONTROL).events
    monkeypatch.setattr(load, "BLOCK_BYTES", block_bytes)
    blocks = load_trace(traces_dir / A100_CONTROL).events
    assert len(blocks) == len(whole)
    for column in ("kind", "ts", "dur", "correlation", "stream", "device", "extra"):
        assert np.array_equal(getattr(blocks, column), getattr(whole, column)), column
    assert blocks.names == whole.names


def test_load_plain_json_and_top_level_list(traces_dir: Path, tmp_path: Path) -> None:
    with gzip.open(traces_dir / ALEXNET, "rt") as fh:
        doc = json.load(fh)
    plain = tmp_path / "trace.json"
    plain.write_text(json.dumps(doc, separators=(",", ":")))  # minified: one line
    listed = tmp_path / "events.json"
    listed.write_text(json.dumps(doc["traceEvents"]))
    reference = load_trace(traces_dir / ALEXNET).events
    for path in (plain, listed):
        ev = load_trace(path).events
        assert np.array_equal(ev.ts, reference.ts)
        assert np.array_equal(ev.kind, reference.kind)


def test_load_metadata_after_the_event_list(traces_dir: Path, tmp_path: Path) -> None:
    with gzip.open(traces_dir / ALEXNET, "rt") as fh:
        doc = json.load(fh)
    events = doc.pop("traceEvents")
    reordered = {"traceEvents": events, **doc}  # deviceProperties after the events
    path = tmp_path / "late_meta.json"
    path.write_text(json.dumps(reordered, indent=1))
    trace = load_trace(path)
    assert len(trace.devices) == 8
    assert trace.rank == 0


def test_id_columns_are_as_narrow_as_their_values(tmp_path: Path) -> None:
    # Hundreds of names and a few threads (every real trace): int16, 2 bytes a row. Past
    # 32767 names (or a stream id past int16) the column widens, and no id is lost.
    def event(i: int, name: str, stream: int) -> dict[str, Any]:
        return {
            "ph": "X",
            "cat": "kernel",
            "name": name,
            "pid": 0,
            "tid": 7,
            "ts": float(i),
            "dur": 0.5,
            "args": {"stream": stream, "device": 0, "correlation": i},
        }

    few = tmp_path / "few.json"
    few.write_text(json.dumps({"traceEvents": [event(i, f"k{i % 3}", 7) for i in range(50)]}))
    ev = load_trace(few).events
    assert ev.name.dtype == np.int16
    assert ev.thread.dtype == np.int16
    assert ev.stream.dtype == np.int16
    n = 40_000
    many = tmp_path / "many.json"
    events = [event(i, f"kernel_{i}", 7 if i < n - 1 else 1 << 20) for i in range(n)]
    many.write_text(json.dumps({"traceEvents": events}))
    ev = load_trace(many).events
    assert ev.name.dtype == np.int32
    assert ev.stream.dtype == np.int32
    assert [ev.names[i] for i in ev.name[[0, 32767, n - 1]].tolist()] == [
        "kernel_0",
        "kernel_32767",
        f"kernel_{n - 1}",
    ]
    assert ev.stream[-1] == 1 << 20
    assert ev.correlation.dtype == np.int32  # correlation ids past 32767
