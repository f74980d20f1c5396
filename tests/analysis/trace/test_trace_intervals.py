"""Interval arithmetic in bounded memory: taken a slice at a time, the same arrays as one pass."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpudiag.analysis.trace import intervals
from gpudiag.analysis.trace.host_activity import row_chunks, spans, spans_where
from gpudiag.analysis.trace.intervals import intersect, merge, overlap_with, subtract
from gpudiag.analysis.trace.load import load_trace
from gpudiag.analysis.trace.model import Kind

Set = tuple[np.ndarray, np.ndarray]


def _random_set(rng: np.random.Generator, n: int) -> Set:
    """A merged set of ``n`` intervals on whole microseconds: ties, touching ends and
    zero-length intervals are common, as in traces rounded to the microsecond."""
    starts = rng.integers(0, 20 * n, n).astype(float)
    ends = starts + rng.choice([0.0, 1.0, 2.0, 5.0, 40.0], n)
    return merge(starts, ends)


def _one_pass(a: Set, b: Set, keep_both: bool) -> Set:
    """The definition: boundaries sorted, a segment kept where the sets' state says so."""
    (a_s, a_e), (b_s, b_e) = a, b
    t = np.concatenate((a_s, a_e, b_s, b_e))
    da = np.concatenate((np.ones(a_s.size), -np.ones(a_s.size), np.zeros(2 * b_s.size)))
    db = np.concatenate((np.zeros(2 * a_s.size), np.ones(b_s.size), -np.ones(b_s.size)))
    order = np.argsort(t, kind="stable")
    t = t[order]
    in_a, in_b = np.cumsum(da[order]) > 0, np.cumsum(db[order]) > 0
    state = (in_a & in_b) if keep_both else (in_a & ~in_b)
    keep = state[:-1] & (t[1:] > t[:-1])
    return merge(t[:-1][keep], t[1:][keep])


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("keep_both", [True, False])
def test_combining_a_slice_at_a_time_gives_the_same_arrays(
    monkeypatch: pytest.MonkeyPatch, seed: int, keep_both: bool
) -> None:
    rng = np.random.default_rng(seed)
    a, b = _random_set(rng, 3000), _random_set(rng, int(rng.integers(1, 4000)))
    want = _one_pass(a, b, keep_both)
    monkeypatch.setattr(intervals, "COMBINE_CHUNK", 64)  # about 100 slices
    got = intersect(a, b) if keep_both else subtract(a, b)
    assert np.array_equal(got[0], want[0])
    assert np.array_equal(got[1], want[1])
    assert want[0].size > 100  # the slices cut through results that had to be joined again


def test_one_long_interval_minus_many_is_the_gaps(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ledger's idle time: the window minus the busy set, one interval against many."""
    rng = np.random.default_rng(7)
    busy = _random_set(rng, 5000)
    window = (np.array([busy[0][0]]), np.array([busy[1][-1]]))
    want = _one_pass(window, busy, keep_both=False)
    monkeypatch.setattr(intervals, "COMBINE_CHUNK", 100)
    gaps = subtract(window, busy)
    assert np.array_equal(gaps[0], want[0])
    assert np.array_equal(gaps[1], want[1])
    # Every gap lies between two busy intervals (a zero-length one does not split a gap).
    assert gaps[0].size > 1000
    assert np.isin(gaps[0], busy[1]).all()


def test_spans_of_many_rows_in_chunks_are_one_merge(
    traces_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real trace's host events (nested, on several threads), as rows and as a mask."""
    ev = load_trace(traces_dir / "hta-trace_diff-control.json.gz").events
    host = ev.kind_in((Kind.CPU_OP, Kind.RUNTIME, Kind.ANNOTATION, Kind.STEP))
    rows = np.flatnonzero(host)
    want = merge(ev.ts[rows], ev.ts[rows] + ev.dur[rows])
    monkeypatch.setattr("gpudiag.analysis.trace.host_activity.CHUNK_ROWS", 1000)
    assert len(list(row_chunks(host))) > 20
    for got in (spans(ev, rows), spans_where(ev, host)):
        assert np.array_equal(got[0], want[0])
        assert np.array_equal(got[1], want[1])
    part = overlap_with(want, ev.ts, ev.ts + ev.dur)
    assert np.array_equal(part[rows], ev.dur[rows])  # each host event lies in the union


def test_membership_by_table_is_isin(traces_dir: Path) -> None:
    ev = load_trace(traces_dir / "hta-trace_diff-control.json.gz").events
    ids = np.arange(0, len(ev.names), 7)
    assert np.array_equal(ev.name_in(ids), np.isin(ev.name, ids))
    kinds = (Kind.KERNEL, Kind.MEMCPY)
    assert np.array_equal(ev.kind_in(kinds), np.isin(ev.kind, [int(k) for k in kinds]))
    assert np.array_equal(ev.thread_in([1]), ev.thread == 1)
    assert not ev.name_in([]).any()
