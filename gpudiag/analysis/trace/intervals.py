"""Interval arithmetic on numpy arrays: unions, clipping and time per set of busy categories."""

from __future__ import annotations

import numpy as np

from gpudiag.analysis.trace.model import F64, I64


def merge(starts: F64, ends: F64) -> tuple[F64, F64]:
    """The union of ``[start, end)`` intervals as sorted, disjoint intervals."""
    if starts.size == 0:
        return starts[:0], ends[:0]
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    # A new merged interval starts where an interval begins after everything before it ended.
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]
    last = np.empty(s.size, dtype=bool)
    last[:-1] = new[1:]
    last[-1] = True
    return s[new], reach[last]


def union_length(starts: F64, ends: F64) -> float:
    """Total time covered by at least one interval."""
    ms, me = merge(starts, ends)
    return float(np.sum(me - ms))


def clip(starts: F64, ends: F64, lo: float, hi: float) -> tuple[F64, F64]:
    """Intervals cut to the window ``[lo, hi)``; intervals outside it are dropped."""
    s = np.clip(starts, lo, hi)
    e = np.clip(ends, lo, hi)
    keep = e > s
    return s[keep], e[keep]


def time_by_category_set(starts: F64, ends: F64, category: I64, n_categories: int) -> F64:
    """Time during which exactly each set of categories is busy.

    Returns an array indexed by bitmask (bit ``c`` set when category ``c`` runs): entry
    ``0b101`` is the time when categories 0 and 2, and nothing else, are running.
    """
    out = np.zeros(1 << n_categories)
    times: list[F64] = []
    deltas: list[np.ndarray] = []  # +bit where a category starts, -bit where it ends
    for c in range(n_categories):
        sel = category == c
        ms, me = merge(starts[sel], ends[sel])
        bit = 1 << c
        times += [ms, me]
        small = np.int8 if n_categories < 8 else np.int64
        deltas += [np.full(ms.size, bit, small), np.full(me.size, -bit, small)]
    if not times:
        return out
    t = np.concatenate(times)
    d = np.concatenate(deltas)
    if t.size == 0:
        return out
    order = np.argsort(t, kind="stable")
    t, d = t[order], d[order]
    mask = np.cumsum(d, dtype=np.int64)
    seg = np.diff(t)
    np.add.at(out, mask[:-1], seg)
    out[0] = 0.0  # gaps between busy periods are idle, reported separately
    return out
