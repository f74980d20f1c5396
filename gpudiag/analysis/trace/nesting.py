"""Which operator encloses which event on a CPU thread, and each operator's self time."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpudiag.analysis.trace.model import F64, I64, Events, Kind


@dataclass(frozen=True, eq=False)
class Nesting:
    """``parent_op[row]``: the innermost CPU operator around that operator or runtime call
    (same thread), -1 when none. ``self_us[row]``: an operator's time minus its child
    operators' (NaN for rows that are not operators)."""

    parent_op: I64
    self_us: F64


def nest(events: Events, runtime_rows: I64 | None = None) -> Nesting:
    """One sweep per thread over operators and runtime calls, sorted by start time.

    Kineto's own "External id" link from a runtime call to its operator is missing in some
    traces (it repeats the correlation id there), so the link is rebuilt from containment.
    ``runtime_rows``: the runtime calls whose operator is wanted (default: all of them).
    """
    n = len(events)
    parent = np.full(n, -1, dtype=np.int64)
    self_us = np.full(n, np.nan)
    if runtime_rows is None:
        rows = events.rows(Kind.CPU_OP, Kind.RUNTIME)
    else:
        wanted = events.kind == Kind.CPU_OP
        wanted[runtime_rows] = True
        rows = np.flatnonzero(wanted)
    if rows.size == 0:
        return Nesting(parent, self_us)
    # At equal start times: operators before runtime calls, then file order (Kineto writes a
    # parent before its children; longest-first would misplace zero-length calls).
    is_runtime = events.kind[rows] == Kind.RUNTIME
    order = np.lexsort((rows, is_runtime, events.ts[rows], events.thread[rows]))
    rows = rows[order]
    row_l = rows.tolist()
    end_l = (events.ts[rows] + events.dur[rows]).tolist()
    dur_l = events.dur[rows].tolist()
    thread_l = events.thread[rows].tolist()
    is_op = (events.kind[rows] == Kind.CPU_OP).tolist()
    parent_l = [-1] * len(row_l)
    self_l = dur_l.copy()
    # The stack holds positions (into the sorted lists) of open operators.
    stack: list[int] = []
    current = -1
    for i, row_thread in enumerate(thread_l):
        if row_thread != current:
            stack.clear()
            current = row_thread
        # An open operator is a parent when it holds the whole event, ends included:
        # traces rounded to whole microseconds give a child the same start, or the same
        # end, as its parent (and zero-length calls).
        end = end_l[i]
        while stack and end_l[stack[-1]] < end:
            stack.pop()
        if stack:
            top = stack[-1]
            parent_l[i] = row_l[top]
            if is_op[i]:
                self_l[top] -= dur_l[i]
        if is_op[i]:
            stack.append(i)
    parent[rows] = parent_l
    ops = np.asarray(is_op)
    self_us[rows[ops]] = np.maximum(np.asarray(self_l)[ops], 0.0)
    return Nesting(parent, self_us)
