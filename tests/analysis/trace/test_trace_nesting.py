"""Nesting of operators and runtime calls: the vectorised sweep gives the stack's answers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpudiag.analysis.trace.load import load_trace
from gpudiag.analysis.trace.model import Events, Kind, LaunchTable
from gpudiag.analysis.trace.nesting import Nesting, nest
from tests.analysis.trace.conftest import A100_CONTROL, RESNET_NW0


def _stack_nest(events: Events, rows: np.ndarray) -> Nesting:
    """The definition: one sweep per thread with a stack of open operators (an event pops the
    operators that end before it; an operator is pushed). Slow, obviously right."""
    n = len(events)
    parent = np.full(n, -1, dtype=np.int64)
    self_us = np.full(n, np.nan)
    is_runtime = events.kind[rows] == Kind.RUNTIME
    rows = rows[np.lexsort((rows, is_runtime, events.ts[rows], events.thread[rows]))]
    self_l = events.dur[rows].tolist()
    stack: list[int] = []
    current = None
    for i, row in enumerate(rows.tolist()):
        if events.thread[row] != current:
            stack.clear()
            current = events.thread[row]
        end = events.ts[row] + events.dur[row]
        while stack and events.ts[rows[stack[-1]]] + events.dur[rows[stack[-1]]] < end:
            stack.pop()
        is_op = events.kind[row] == Kind.CPU_OP
        if stack:
            parent[row] = rows[stack[-1]]
            if is_op:
                self_l[stack[-1]] -= events.dur[row]
        if is_op:
            stack.append(i)
    ops = events.kind[rows] == Kind.CPU_OP
    self_us[rows[ops]] = np.maximum(np.asarray(self_l)[ops], 0.0)
    return Nesting(parent, self_us)


def _events(kind: np.ndarray, thread: np.ndarray, ts: np.ndarray, dur: np.ndarray) -> Events:
    n = kind.size
    none = np.full(n, -1, np.int64)
    empty = np.zeros(0, np.int64)
    return Events(
        kind=kind.astype(np.int8),
        name=np.zeros(n, np.int32),
        thread=thread.astype(np.int32),
        ts=ts.astype(float),
        dur=dur.astype(float),
        correlation=none,
        stream=none,
        device=none,
        extra=none,
        names=("op",),
        threads=(("1", "1"),),
        launches=LaunchTable(empty, empty, empty, empty, empty, np.zeros(0), (), ()),
        stacks={},
    )


def _assert_same(events: Events, runtime_rows: np.ndarray | None = None) -> None:
    got = nest(events, runtime_rows)
    if runtime_rows is None:
        rows = events.rows(Kind.CPU_OP, Kind.RUNTIME)
    else:
        wanted = events.kind == Kind.CPU_OP
        wanted[runtime_rows] = True
        rows = np.flatnonzero(wanted)
    want = _stack_nest(events, rows)
    assert np.array_equal(got.parent_op, want.parent_op)
    assert np.array_equal(got.self_us, want.self_us, equal_nan=True)


@pytest.mark.parametrize("seed", range(12))
def test_nesting_matches_the_stack_on_random_overlapping_events(seed: int) -> None:
    # Whole-microsecond times on few threads: many equal starts and ends, zero-length calls,
    # calls that outlast their operator (overlaps, as corrupt or rounded traces have).
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    kind = rng.choice([Kind.CPU_OP, Kind.RUNTIME, Kind.KERNEL], size=n, p=[0.55, 0.35, 0.1])
    thread = rng.integers(0, 3, size=n)
    ts = rng.integers(0, 60, size=n)
    dur = rng.integers(0, 25, size=n) * rng.integers(0, 2, size=n)
    _assert_same(_events(kind, thread, ts, dur))


def test_nesting_matches_the_stack_with_fractional_times_and_chosen_calls() -> None:
    rng = np.random.default_rng(99)
    n = 3000
    kind = rng.choice([Kind.CPU_OP, Kind.RUNTIME], size=n)
    ts = np.round(rng.uniform(0, 500, size=n), 3)
    dur = np.round(rng.exponential(20, size=n), 3)
    events = _events(kind, rng.integers(0, 2, size=n), ts, dur)
    runtime = np.flatnonzero(kind == Kind.RUNTIME)
    _assert_same(events, runtime[::3])


@pytest.mark.parametrize("name", [A100_CONTROL, RESNET_NW0])
def test_nesting_matches_the_stack_on_real_traces(traces_dir: Path, name: str) -> None:
    _assert_same(load_trace(traces_dir / name).events)
