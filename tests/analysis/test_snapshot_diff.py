"""MemorySnapshot.diff and per-rank folders on real snapshots; the reader's limits and borders."""

from __future__ import annotations

import copy
import gzip
import json
import os
import pickle
from pathlib import Path
from typing import Any

import pytest

import gpudiag as gd
from gpudiag.analysis import memory_snapshot as ms
from gpudiag.analysis.snapshot_diff import NO_STACK, SnapshotRanks, stack_category

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "memory-snapshots"
OPT_13B = FIXTURES / "flexgen-fork-opt-1.3b_snapshot.pickle"
OPT_OOM = FIXTURES / "flexgen-fork-opt-oom_snapshot.pickle"
DECOMFL = FIXTURES / "decomfl-memory.pickle.gz"
GIB = 2**30
ADAM = ("/venv/lib/python3.11/site-packages/torch/optim/adam.py:120 _init_group",)


def _snap(path: Path) -> ms.MemorySnapshot:
    snap = gd.analyze_memory_snapshot(path)
    assert isinstance(snap, ms.MemorySnapshot)
    return snap


def test_the_diff_of_two_real_snapshots_says_what_grew_and_where() -> None:
    small, oom = _snap(OPT_13B), _snap(OPT_OOM)
    diff = small.diff(oom, by="function")  # two checkouts of one fork: folders and lines differ
    assert diff.allocated_delta_bytes == oom.allocated_bytes - small.allocated_bytes
    assert diff.allocated_delta_bytes == 6_156_708_864  # 5.29 GiB -> 11.03 GiB
    weights = diff.top(1)[0]
    assert weights.category == "parameters"
    assert weights.where == "pytorch_backend.py:190 allocate <- flex_opt.py:125 init_weight_list"
    assert (weights.count_before, weights.count_after) == (778, 460)  # fewer, larger weights
    assert weights.bytes_delta == pytest.approx(5.74 * GIB, rel=1e-3)
    # The forward pass's attention buffers of the 1.3B run are gone at the OOM: it came while
    # the larger model's weights were being allocated, before any forward pass.
    assert any(r.category == "forward" and r.bytes_after == 0 for r in diff.top(5))
    assert sum(r.bytes_delta for r in diff.rows) == diff.allocated_delta_bytes
    text = " ".join(diff.findings())
    assert "allocated grew by 5.73 GiB" in text
    assert "parameters +5.74 GiB" in text
    data = json.loads(json.dumps(diff.to_dict()))
    assert data["rows"][0]["bytes_delta"] == weights.bytes_delta
    # By stack (folders and lines included) nothing matches across the two checkouts.
    exact = small.diff(oom)
    assert all(r.bytes_before == 0 or r.bytes_after == 0 for r in exact.rows)
    assert exact.allocated_delta_bytes == diff.allocated_delta_bytes


def test_a_snapshot_against_itself_changes_nothing() -> None:
    snap = _snap(DECOMFL)
    diff = snap.diff(snap)
    assert diff.allocated_delta_bytes == 0
    assert diff.top(10) == ()
    assert diff.findings()[0].startswith("allocated is the same")


def test_freed_blocks_show_as_a_shrink_at_their_stack() -> None:
    data = ms.load_snapshot(DECOMFL)
    later = copy.deepcopy(data)
    # Free the largest live block (as the allocator would: the segment's counts follow).
    segment, block = max(
        (
            (s, b)
            for s in later["segments"]
            for b in s["blocks"]
            if b["state"] == "active_allocated"
        ),
        key=lambda sb: sb[1]["size"],
    )
    block["state"] = "inactive"
    segment["allocated_size"] -= block["size"]
    segment["active_size"] -= block["size"]
    before = ms.analyze_snapshot_data(data, source="step 1")
    after = ms.analyze_snapshot_data(later, source="step 2")
    diff = before.diff(after)
    assert diff.allocated_delta_bytes == -block["size"]
    row = diff.top(1)[0]
    assert row.bytes_delta == -block["size"]
    assert row.count_delta == -1
    assert row.stack == ms.block_stack(block)
    assert row.category == "parameters"  # DeComFL's reset_model: module.to() of the weights
    html = diff._repr_html_()
    assert "CUDA memory: what changed" in html


def test_categories_are_read_from_the_stack() -> None:
    assert stack_category(ADAM) == "optimizer"
    assert stack_category(("a.py:1 f", "/x/torch/autograd/graph.py:8 _engine_run_backward")) == (
        "backward"
    )
    assert stack_category(("/x/torch/nn/modules/module.py:1357 convert",)) == "parameters"
    assert stack_category(("/x/torch/nn/modules/linear.py:134 forward",)) == "forward"
    assert stack_category(("train.py:3 main",)) == "other"
    assert stack_category(()) == NO_STACK


def _rank_folder(tmp_path: Path, extra_bytes: int) -> Path:
    """Two ranks from the real DeComFL snapshot; rank 1 holds one more Adam state block."""
    data = ms.load_snapshot(DECOMFL)
    heavy = copy.deepcopy(data)
    frames = [{"filename": ADAM[0].split(":")[0], "line": 120, "name": "_init_group"}]
    heavy["segments"].append(
        {
            "device": 0,
            "address": 1 << 40,
            "total_size": extra_bytes,
            "allocated_size": extra_bytes,
            "active_size": extra_bytes,
            "requested_size": extra_bytes,
            "stream": 0,
            "segment_type": "large",
            "blocks": [{"size": extra_bytes, "state": "active_allocated", "frames": frames}],
        }
    )
    folder = tmp_path / "snapshots"
    folder.mkdir()
    with gzip.open(folder / "snapshot_rank0.pickle.gz", "wb") as fh:
        pickle.dump(data, fh, protocol=4)
    (folder / "snapshot_rank1.pickle").write_bytes(pickle.dumps(heavy, protocol=4))
    return folder


def test_a_folder_of_ranks_says_which_rank_holds_more_and_in_what(tmp_path: Path) -> None:
    extra = 3 * 2**29
    ranks = gd.analyze_memory_snapshot(_rank_folder(tmp_path, extra))
    assert isinstance(ranks, SnapshotRanks)
    assert ranks.ranks == (0, 1)
    assert (ranks.heaviest_rank, ranks.lightest_rank) == (1, 0)
    assert ranks.spread_bytes == extra
    top = ranks.imbalance.top(1)[0]
    assert (top.category, top.bytes_delta, top.count_after) == ("optimizer", extra, 1)
    assert "rank 1 holds 1.50 GiB more than rank 0" in ranks.findings()[0]
    assert json.loads(json.dumps(ranks.to_dict()))["heaviest_rank"] == 1
    with pytest.raises(ms.SnapshotError, match="without keeping the snapshot"):
        ranks.rank(0).save(tmp_path / "copy.pickle")  # ranks keep only what they need


def test_plots_of_a_diff_and_of_ranks(tmp_path: Path) -> None:
    diff = _snap(OPT_13B).diff(_snap(OPT_OOM), by="function")
    fig = diff.plot()
    assert fig.data[0].orientation == "h"
    assert fig.data[0].x[-1] == pytest.approx(diff.top(1)[0].bytes_delta / 2**20)
    ranks = gd.analyze_memory_snapshot(_rank_folder(tmp_path, 2**30))
    assert isinstance(ranks, SnapshotRanks)
    names = {t.name for t in ranks.plot().data}
    assert "optimizer" in names


def test_ranks_without_numbers_in_their_names_follow_file_order(tmp_path: Path) -> None:
    folder = _rank_folder(tmp_path, 2**20)
    for i, f in enumerate(sorted(folder.iterdir())):
        f.rename(folder / f"host{'ab'[i]}.pickle{'.gz' if f.name.endswith('.gz') else ''}")
    ranks = gd.analyze_memory_snapshot(folder)
    assert isinstance(ranks, SnapshotRanks)
    assert ranks.ranks == (0, 1)
    assert any("file order" in n for n in ranks.notes)


# -- the reader's borders ------------------------------------------------------------------


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_special_files_and_folders_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ms.SnapshotError, match="is a device"):
        ms.load_snapshot("/dev/zero")
    fifo = tmp_path / "snap.pickle"
    os.mkfifo(fifo)
    with pytest.raises(ms.SnapshotError, match="FIFO"):
        gd.analyze_memory_snapshot(fifo)
    with pytest.raises(ms.SnapshotError, match="is a folder"):
        ms.load_snapshot(tmp_path)
    with pytest.raises(ms.SnapshotError, match="no snapshot files in the folder"):
        gd.analyze_memory_snapshot(tmp_path)


def test_damaged_files_are_clear_errors(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.pickle"
    garbage.write_bytes(os.urandom(4096))
    with pytest.raises(ms.SnapshotError, match="not a readable pickle"):
        gd.analyze_memory_snapshot(garbage)
    cut = tmp_path / "cut.pickle.gz"
    cut.write_bytes(DECOMFL.read_bytes()[:40_000])
    with pytest.raises(ms.SnapshotError, match="ends too early"):
        gd.analyze_memory_snapshot(cut)


def test_the_memory_limit_says_how_to_raise_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ms.SnapshotError, match="max_memory=") as err:
        gd.analyze_memory_snapshot(OPT_13B, max_memory=1 << 20)  # below 6x the file
    assert "--max-memory-gb" in str(err.value)
    # While reading: this process grows past the limit (a pickle that unpacks far more than
    # its size) and the read stops there, with the same advice.
    grown = iter(range(0, 1 << 40, 64 << 20))
    monkeypatch.setattr(ms, "_rss_bytes", lambda: next(grown))
    monkeypatch.setattr(ms, "_CHECK_EVERY_BYTES", 4096)
    with pytest.raises(ms.SnapshotError, match="reading it took more than"):
        gd.analyze_memory_snapshot(DECOMFL, max_memory=100 << 20)


def test_a_pickle_that_repeats_one_list_is_refused_not_looped_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ms, "MAX_ITEMS", 10_000)
    block = {"size": 512, "state": "active_allocated", "frames": []}
    segment = {"total_size": 512, "allocated_size": 512, "blocks": [block] * 1000}
    path = tmp_path / "repeated.pickle"
    path.write_bytes(pickle.dumps({"segments": [segment] * 1000, "device_traces": []}))
    assert path.stat().st_size < 10_000  # a few kB that reference one list a million times
    with pytest.raises(ms.SnapshotError, match="Refused rather than looped over"):
        gd.analyze_memory_snapshot(path)


def test_fields_that_are_not_byte_counts_read_as_zero(tmp_path: Path) -> None:
    data: dict[str, Any] = ms.load_snapshot(OPT_OOM)
    data["segments"][0]["total_size"] = "a lot"
    data["segments"][0]["blocks"][0]["size"] = 1e300
    data["segments"][1]["blocks"][0]["history"] = 7
    snap = ms.analyze_snapshot_data(data)
    assert snap.reserved_bytes < 11_844_714_496
    json.dumps(snap.to_dict())
