"""Interval arithmetic on numpy arrays: unions, clipping and time per set of busy categories."""

from __future__ import annotations

import math

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


# Boundaries handled at a time by ``_combine``: its temporaries stay a few MB where a
# multi-GB trace's busy time is hundreds of thousands of intervals.
COMBINE_CHUNK = 1 << 16


def _combine(a: tuple[F64, F64], b: tuple[F64, F64], keep_both: bool) -> tuple[F64, F64]:
    """Where ``a`` and ``b`` are both covered (``keep_both``) or where ``a`` is and ``b`` is
    not. ``a`` and ``b`` are sorted, disjoint interval sets (as ``merge`` returns them).

    Large sets are taken a slice of time at a time (both sets cut at the slice's ends), and
    the slices' results merged: a piece cut at a slice's end joins its other half again (they
    touch), so the result is the same arrays as one pass over everything."""
    (a_s, a_e), (b_s, b_e) = a, b
    if a_s.size == 0 or (keep_both and b_s.size == 0):
        return a_s[:0], a_e[:0]
    if b_s.size == 0:
        return a_s, a_e
    if a_s.size + b_s.size <= COMBINE_CHUNK:
        return _combine_slice(a_s, a_e, b_s, b_e, keep_both)
    starts = np.sort(np.concatenate((a_s, b_s)))
    cuts = [*starts[COMBINE_CHUNK // 2 :: COMBINE_CHUNK // 2].tolist(), math.inf]
    del starts
    lo = -math.inf
    parts: list[tuple[F64, F64]] = []
    for hi in cuts:
        if hi <= lo:
            continue
        a_part, b_part = _cut(a_s, a_e, lo, hi), _cut(b_s, b_e, lo, hi)
        if a_part[0].size and (b_part[0].size or not keep_both):
            if b_part[0].size:
                parts.append(_combine_slice(*a_part, *b_part, keep_both))
            else:  # a alone: what one pass keeps of it (no zero-length interval)
                whole = a_part[1] > a_part[0]
                parts.append((a_part[0][whole], a_part[1][whole]))
        lo = hi
    if not parts:
        return a_s[:0], a_e[:0]
    return merge(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))


def _cut(s: F64, e: F64, lo: float, hi: float) -> tuple[F64, F64]:
    """The part of a sorted, disjoint set inside ``[lo, hi)`` (intervals crossing an end cut
    there; a zero-length interval, which no result keeps, may be dropped)."""
    i0 = int(np.searchsorted(e, lo, side="right"))
    i1 = int(np.searchsorted(s, hi, side="left"))
    return np.maximum(s[i0:i1], lo), np.minimum(e[i0:i1], hi)


def _combine_slice(a_s: F64, a_e: F64, b_s: F64, b_e: F64, keep_both: bool) -> tuple[F64, F64]:
    t = np.concatenate((a_s, a_e, b_s, b_e))
    na, nb = a_s.size, b_s.size
    da = np.concatenate((np.ones(na, np.int8), -np.ones(na, np.int8), np.zeros(2 * nb, np.int8)))
    db = np.concatenate((np.zeros(2 * na, np.int8), np.ones(nb, np.int8), -np.ones(nb, np.int8)))
    order = np.argsort(t, kind="stable")
    t = t[order]
    # Each set is disjoint: at most one of its intervals is open at a time (two where one
    # ends as the next starts), so the counts fit in int8.
    in_a = np.cumsum(da[order], dtype=np.int8) > 0
    in_b = np.cumsum(db[order], dtype=np.int8) > 0
    state = (in_a & in_b) if keep_both else (in_a & ~in_b)
    keep = state[:-1] & (t[1:] > t[:-1])
    return merge(t[:-1][keep], t[1:][keep])


def intersect(a: tuple[F64, F64], b: tuple[F64, F64]) -> tuple[F64, F64]:
    """The time both interval sets cover (each sorted and disjoint)."""
    return _combine(a, b, keep_both=True)


def subtract(a: tuple[F64, F64], b: tuple[F64, F64]) -> tuple[F64, F64]:
    """The time ``a`` covers and ``b`` does not (each sorted and disjoint)."""
    return _combine(a, b, keep_both=False)


def length(a: tuple[F64, F64]) -> float:
    return float(np.sum(a[1] - a[0]))


def overlap_with(a: tuple[F64, F64], starts: F64, ends: F64) -> F64:
    """For each interval ``[starts[i], ends[i])``, the time of it the set ``a`` (sorted,
    disjoint) covers: the difference of ``a``'s cumulative coverage at its two ends."""
    a_s, a_e = a
    if a_s.size == 0 or starts.size == 0:
        return np.zeros(starts.size)
    cum = np.concatenate(([0.0], np.cumsum(a_e - a_s)))

    def covered(t: F64) -> F64:
        i = np.searchsorted(a_s, t, side="right")  # intervals that start at or before t
        inside = np.clip(t - a_s[np.maximum(i - 1, 0)], 0.0, (a_e - a_s)[np.maximum(i - 1, 0)])
        return cum[np.maximum(i - 1, 0)] * (i > 0) + np.where(i > 0, inside, 0.0)

    return np.maximum(covered(ends) - covered(starts), 0.0)
