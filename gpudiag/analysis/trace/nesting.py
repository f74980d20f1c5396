"""Which operator encloses which event on a CPU thread, and each operator's self time."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gpudiag.analysis.trace.model import F64, I64, Bool, Events, Ids, Kind


@dataclass(frozen=True, eq=False)
class Nesting:
    """``parent_op[row]``: the innermost CPU operator around that operator or runtime call
    (same thread), -1 when none (int32 for traces under 2**31 rows). ``self_us[row]``: an
    operator's time minus its child operators' (NaN for rows that are not operators)."""

    parent_op: Ids
    self_us: F64


# Positions resolved per pass of pointer jumping: bounds the temporary arrays.
_CHUNK = 1 << 18


def nest(events: Events, runtime_rows: I64 | None = None) -> Nesting:
    """One sweep per thread over operators and runtime calls, sorted by start time.

    Kineto's own "External id" link from a runtime call to its operator is missing in some
    traces (it repeats the correlation id there), so the link is rebuilt from containment.
    ``runtime_rows``: the runtime calls whose operator is wanted (default: all of them).
    """
    n = len(events)
    index = np.int32 if n < (1 << 31) else np.int64
    parent = np.full(n, -1, dtype=index)
    wanted = events.kind == Kind.CPU_OP
    if runtime_rows is None:
        wanted |= events.kind == Kind.RUNTIME
    else:
        wanted[runtime_rows] = True
    rows = np.flatnonzero(wanted).astype(index)
    del wanted
    if rows.size == 0:
        return Nesting(parent, np.full(n, np.nan))
    # At equal start times: operators before runtime calls, then file order (Kineto writes a
    # parent before its children; longest-first would misplace zero-length calls).
    order = np.lexsort(
        (rows, events.kind[rows] == Kind.RUNTIME, events.ts[rows], events.thread[rows])
    )
    rows = rows[order]
    del order
    # Sweeping the sorted events with a stack of open operators (an event pops those that end
    # before it does; an operator is pushed) makes an event's parent the nearest earlier
    # operator on its thread that ends no earlier than every event from it up to this one,
    # ends included: traces rounded to whole microseconds give a child its parent's start or
    # end. That is the first operator along the chain of "previous event ending no earlier"
    # (nearest earlier event on the thread with an end >= this one's), found for all events
    # at once by pointer jumping, then skipping runtime calls along the chain the same way.
    # Same parents as the stack, in a few passes over arrays instead of a loop per event.
    ends = events.ts[rows]
    ends += events.dur[rows]
    pointer = np.arange(-1, rows.size - 1, dtype=index)
    thread = events.thread[rows]
    pointer[1:][thread[1:] != thread[:-1]] = -1  # the first event of each thread
    pointer[0] = -1
    del thread
    _jump(pointer, _ends_earlier(ends))
    del ends
    is_op = events.kind[rows] == Kind.CPU_OP
    _jump(pointer, _not_in(is_op))  # now the first operator along the chain
    has_parent = np.flatnonzero(pointer >= 0)
    parent[rows[has_parent]] = rows[pointer[has_parent]]
    # Self time: an operator's duration less its child operators', subtracted one child at a
    # time in sweep order (ufunc.at is sequential), as the stack did.
    own = events.dur[rows]
    child_ops = has_parent[is_op[has_parent]]
    del has_parent
    np.subtract.at(own, pointer[child_ops], own[child_ops])
    del child_ops, pointer
    # Allocated last, once the sort's temporaries are gone: a float per event of the trace.
    self_us = np.full(n, np.nan)
    self_us[rows[is_op]] = np.maximum(own[is_op], 0.0)
    return Nesting(parent, self_us)


def _ends_earlier(ends: F64) -> Callable[[np.ndarray, np.ndarray], Bool]:
    return lambda j, i: ends[j] < ends[i]


def _not_in(kept: Bool) -> Callable[[np.ndarray, np.ndarray], Bool]:
    return lambda j, i: ~kept[j]


def _jump(pointer: Ids, skip: Callable[[np.ndarray, np.ndarray], Bool]) -> None:
    """Move each ``pointer[i]`` (an earlier position, -1: none) back along the pointers while
    ``skip(pointer[i], i)``; in place. A skipped position's own pointer only passes positions
    that ``skip`` would pass too, so following the current pointers is safe, and each pass
    doubles the distance covered. Positions are taken a chunk at a time, in order: a pointer
    into an earlier chunk meets final pointers there, and the temporaries stay small."""
    for lo in range(0, pointer.size, _CHUNK):
        chunk = pointer[lo : lo + _CHUNK]
        todo = np.flatnonzero(chunk >= 0).astype(pointer.dtype)
        todo = todo[skip(chunk[todo], todo + lo)]
        while todo.size:
            nxt = pointer[chunk[todo]]
            chunk[todo] = nxt
            todo = todo[nxt >= 0]
            todo = todo[skip(chunk[todo], todo + lo)]
