"""gd.analyze_memory_snapshot on real snapshots, hostile pickles refused, protocol-4 writing."""

from __future__ import annotations

import copy
import gzip
import os
import pickle
from pathlib import Path

import pytest

import gpudiag as gd
from gpudiag.analysis import memory_snapshot as ms

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "memory-snapshots"
OOM = FIXTURES / "flexgen-fork-opt-oom_snapshot.pickle"
STACKS = FIXTURES / "decomfl-memory.pickle.gz"
GIB = 2**30


def test_snapshot_taken_at_an_oom_in_the_older_format() -> None:
    snap = gd.analyze_memory_snapshot(OOM)
    assert snap.format.startswith("torch 2.0")
    assert snap.segments == 176
    assert snap.reserved_bytes == 11_844_714_496  # 11.03 GiB, summed from total_size
    # the trace's single 'snapshot' entry records the allocated bytes: they agree
    assert snap.allocated_bytes == 11_840_159_744
    assert snap.trace_actions == {"snapshot": 1}
    assert snap.oom is None  # no 'oom' entry in this file: said so, not invented
    assert any("no oom entry" in f for f in snap.findings())
    assert snap.fragmentation < 0.01
    top = snap.live_now[0]
    assert top.site.endswith("pytorch_backend.py:190 allocate")
    assert top.nbytes == snap.allocated_bytes


def test_snapshot_with_allocation_stacks_and_a_trace() -> None:
    snap = gd.analyze_memory_snapshot(STACKS)
    assert snap.format.startswith("current")
    assert snap.trace_actions["alloc"] == 7946
    assert snap.expandable_segments is False  # read from allocator_settings
    assert snap.reserved_bytes == pytest.approx(1.7676 * GIB, rel=1e-3)
    assert 0.4 < snap.fragmentation < 0.55
    assert snap.peak_allocated_bytes is not None
    assert snap.allocated_bytes < snap.peak_allocated_bytes <= snap.reserved_bytes
    sites = [g.site for g in snap.live_at_peak]
    assert any("adam_forward.py" in s for s in sites)  # the user's code, not torch's frames
    assert not any("site-packages" in s for s in sites[:3])
    assert any("expandable_segments:True" in f for f in snap.findings())
    data = snap.to_dict()
    assert data["kind"] == "memory_snapshot"
    assert "raw" not in data


def test_an_oom_entry_names_asked_vs_free_and_fragmentation() -> None:
    data = ms.load_snapshot(STACKS)
    data = copy.deepcopy(data)
    snap = ms.analyze_snapshot_data(data)
    ask = snap.largest_inactive_block + 2**20  # larger than any free block, less than all free
    assert ask <= snap.inactive_bytes
    data["device_traces"][0].append(
        {"action": "oom", "size": ask, "device_free": 3 * 2**20, "stream": 0, "frames": []}
    )
    snap = ms.analyze_snapshot_data(data)
    assert snap.oom is not None
    assert (snap.oom.requested_bytes, snap.oom.device_free_bytes) == (ask, 3 * 2**20)
    text = " ".join(snap.findings())
    assert "out of memory: asked for" in text
    assert "no free block is as large as the request" in text


class _Exploit:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, ...]]:
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_a_hostile_pickle_is_refused_and_never_run(tmp_path: Path, protocol: int) -> None:
    marker = tmp_path / "ran"
    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps({"segments": [_Exploit(marker)]}, protocol=protocol))
    with pytest.raises(ms.SnapshotError, match="refused"):
        gd.analyze_memory_snapshot(path)
    assert not marker.exists()


def test_bad_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ms.SnapshotError, match="memory snapshot not found"):
        gd.analyze_memory_snapshot(tmp_path / "missing.pickle")
    truncated = tmp_path / "cut.pickle"
    truncated.write_bytes(OOM.read_bytes()[:5000])
    with pytest.raises(ms.SnapshotError, match="not a readable pickle"):
        gd.analyze_memory_snapshot(truncated)
    other = tmp_path / "other.pickle"
    other.write_bytes(pickle.dumps([1, 2, 3]))
    with pytest.raises(ms.SnapshotError, match="not a memory snapshot"):
        gd.analyze_memory_snapshot(other)
    with pytest.raises(ms.SnapshotError, match="limit"):
        gd.analyze_memory_snapshot(OOM, max_bytes=1000)
    bomb = tmp_path / "bomb.pickle.gz"
    bomb.write_bytes(gzip.compress(b"\x80\x04" + b"N" * 50_000))
    with pytest.raises(ms.SnapshotError, match="unpacks to more"):
        gd.analyze_memory_snapshot(bomb, max_bytes=10_000)


def test_saved_snapshot_is_protocol_4_and_reads_back(tmp_path: Path) -> None:
    snap = gd.analyze_memory_snapshot(STACKS)
    out = snap.save(tmp_path / "copy.pickle")
    raw = Path(out).read_bytes()
    assert raw[:2] == b"\x80\x04"  # PROTO 4
    again = gd.analyze_memory_snapshot(out)
    assert again.reserved_bytes == snap.reserved_bytes
    assert again.peak_allocated_bytes == snap.peak_allocated_bytes


def test_report_is_escaped() -> None:
    data = ms.load_snapshot(OOM)
    snap = ms.analyze_snapshot_data(data, source="<script>x</script>")
    html = snap._repr_html_()
    assert "<script>x</script>" not in html
    assert "11.03 GiB" in repr(snap)
