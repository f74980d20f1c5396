"""Where GPU time went: busy categories, idle time and why, per window, step and stream."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpudiag._report import jsonable
from gpudiag.analysis.trace.intervals import merge, time_by_category_set
from gpudiag.analysis.trace.kernels import CATEGORIES, COMMUNICATION, COMPUTE, MEMORY, SYNC
from gpudiag.analysis.trace.model import F64, I64, Events, Ids, Kind, fields_json

# Gaps shorter than this between two kernels on a stream are launch overhead ("kernel
# wait"); HTA's default ``consecutive_kernel_delay`` is the same 30 (trace units, us).
KERNEL_WAIT_US = 30.0

HOST_WAIT, KERNEL_WAIT, OTHER_WAIT = "host_wait", "kernel_wait", "other"
IDLE_CATEGORIES = (HOST_WAIT, KERNEL_WAIT, OTHER_WAIT)


@dataclass(frozen=True)
class TimeBreakdown:
    """GPU time over a window, each instant counted once, by priority.

    An instant with any compute kernel running is ``compute``; else with an NCCL kernel,
    ``communication``; else with a memcpy/memset, ``memory``; else with a CUDA
    synchronisation event on the GPU timeline, ``sync``; else ``idle``. So
    ``compute + communication + memory + sync + idle == span``, ``compute`` and ``idle`` are
    Holistic Trace Analysis' ``compute_time`` and ``idle_time``, and its ``non_compute_time``
    is ``communication + memory + sync``. ``span`` runs from the first GPU event's start to
    the last one's end. Idle time is split by what ended each gap: the next GPU event was
    launched by the host after the GPU went idle (``host_wait``), the gap was under 30 us
    (``kernel_wait``: launch overhead) or neither (``other``).
    """

    span_us: float
    compute_us: float
    communication_us: float
    memory_us: float
    sync_us: float
    idle_us: float
    idle_host_wait_us: float
    idle_kernel_wait_us: float
    idle_other_us: float

    def as_mapping(self) -> dict[str, float]:
        return {k: float(getattr(self, k)) for k in self.__dataclass_fields__}

    def share(self, key: str) -> float | None:
        return float(getattr(self, key)) / self.span_us if self.span_us > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return jsonable(self.as_mapping())

    @classmethod
    def empty(cls) -> TimeBreakdown:
        return cls(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)

    def __add__(self, other: TimeBreakdown) -> TimeBreakdown:
        return TimeBreakdown(
            *(getattr(self, k) + getattr(other, k) for k in self.__dataclass_fields__)
        )


@dataclass(frozen=True)
class StreamIdle:
    """Gaps between consecutive GPU events on one stream (HTA's idle-time breakdown)."""

    device: int
    stream: int
    host_wait_us: float
    kernel_wait_us: float
    other_us: float

    @property
    def idle_us(self) -> float:
        return self.host_wait_us + self.kernel_wait_us + self.other_us

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = fields_json(self)
        out["idle_us"] = self.idle_us
        return out


@dataclass(frozen=True, eq=False)
class GpuRows:
    """The GPU rows of a window with their category index and launch time."""

    starts: F64
    ends: F64
    category: I64  # index into CATEGORIES
    launch_ts: F64  # the host runtime call's start, NaN when it is not in the trace
    stream: Ids
    device: Ids
    kind: np.ndarray

    @functools.cached_property
    def _by_start(self) -> tuple[I64, F64, float, I64]:
        """Rows sorted by start, their starts, a duration bound for all but the 0.1 % longest
        rows, and those longest rows."""
        order = np.argsort(self.starts, kind="stable")
        durations = self.ends - self.starts
        bound = float(np.quantile(durations, 0.999)) if durations.size else 0.0
        return order, self.starts[order], bound, np.flatnonzero(durations > bound)

    def overlapping(self, lo: float, hi: float) -> I64:
        """The rows (ascending) that end after ``lo`` and start before ``hi``: the same rows
        as testing every one, found from the rows sorted by start (a trace of a thousand steps
        asks once per step)."""
        order, sorted_starts, bound, long_rows = self._by_start
        # A short row ending after lo started after lo - bound; the margin covers rounding.
        a = int(np.searchsorted(sorted_starts, lo - 2.0 * bound - 1.0, side="left"))
        b = int(np.searchsorted(sorted_starts, hi, side="left"))
        rows = np.unique(np.concatenate((order[a:b], long_rows)))
        return rows[(self.ends[rows] > lo) & (self.starts[rows] < hi)]


def gpu_rows(events: Events, rows: I64, categories: np.ndarray, launch_ts: F64) -> GpuRows:
    index = {c: i for i, c in enumerate(CATEGORIES)}
    cat_idx = np.array([index[c] for c in categories.tolist()], dtype=np.int64)
    return GpuRows(
        starts=events.ts[rows],
        ends=events.ts[rows] + events.dur[rows],
        category=cat_idx,
        launch_ts=launch_ts,
        stream=events.stream[rows],
        device=events.device[rows],
        kind=events.kind[rows],
    )


def temporal(g: GpuRows, lo: float | None = None, hi: float | None = None) -> TimeBreakdown:
    """The breakdown over the GPU rows, optionally clipped to the window ``[lo, hi)``."""
    starts, ends, cat, launch = g.starts, g.ends, g.category, g.launch_ts
    if lo is not None and hi is not None:
        keep = g.overlapping(lo, hi)
        starts, ends = np.clip(starts[keep], lo, hi), np.clip(ends[keep], lo, hi)
        cat, launch = cat[keep], launch[keep]
        nonempty = ends > starts
        starts, ends, cat, launch = (
            starts[nonempty],
            ends[nonempty],
            cat[nonempty],
            launch[nonempty],
        )
        span_lo, span_hi = lo, hi
    else:
        if starts.size == 0:
            return TimeBreakdown.empty()
        span_lo, span_hi = float(starts.min()), float(ends.max())
    span = span_hi - span_lo
    if starts.size == 0:
        return TimeBreakdown(span, 0.0, 0.0, 0.0, 0.0, span, 0.0, 0.0, span)
    by_set = time_by_category_set(starts, ends, cat, len(CATEGORIES))
    masks = np.arange(by_set.size)
    bit = {c: 1 << i for i, c in enumerate(CATEGORIES)}
    compute = float(by_set[(masks & bit[COMPUTE]) > 0].sum())
    comm = float(by_set[((masks & bit[COMMUNICATION]) > 0) & ((masks & bit[COMPUTE]) == 0)].sum())
    higher = bit[COMPUTE] | bit[COMMUNICATION]
    memory = float(by_set[((masks & bit[MEMORY]) > 0) & ((masks & higher) == 0)].sum())
    sync = float(by_set[masks == bit[SYNC]].sum())
    busy = compute + comm + memory + sync
    idle = max(span - busy, 0.0)
    host, kernel, other = _idle_split(starts, ends, launch, span_lo, span_hi)
    # The split is measured on the gaps themselves; scale away float rounding so it sums.
    split = host + kernel + other
    if split > 0:
        f = idle / split
        host, kernel, other = host * f, kernel * f, other * f
    else:
        other = idle
    return TimeBreakdown(span, compute, comm, memory, sync, idle, host, kernel, other)


def idle_gaps(starts: F64, ends: F64, launch: F64, lo: float, hi: float) -> tuple[F64, I64]:
    """GPU-wide idle gaps in ``[lo, hi)`` and their category (index into IDLE_CATEGORIES).

    A gap is classified by the event that ends it: launched after the gap began (host wait),
    else shorter than 30 us (kernel wait), else other. The gap after the last event has no
    next event and counts as other.
    """
    ms, me = merge(starts, ends)
    if ms.size == 0:
        return np.array([max(hi - lo, 0.0)]), np.array([2], dtype=np.int64)
    gap_start = np.concatenate(([lo], me))
    gap_end = np.concatenate((ms, [hi]))
    gaps = np.maximum(gap_end - gap_start, 0.0)
    # The earliest-starting event at each merged interval's start ends the gap before it.
    order = np.argsort(starts, kind="stable")
    first = order[np.searchsorted(starts[order], ms, side="left")]
    launch_first = np.concatenate((launch[first], [np.nan]))
    host = launch_first > gap_start
    kernel = ~host & (gaps < KERNEL_WAIT_US)
    category = np.where(host, 0, np.where(kernel, 1, 2)).astype(np.int64)
    keep = gaps > 0
    return gaps[keep], category[keep]


def _idle_split(
    starts: F64, ends: F64, launch: F64, lo: float, hi: float
) -> tuple[float, float, float]:
    gaps, category = idle_gaps(starts, ends, launch, lo, hi)
    return tuple(float(gaps[category == c].sum()) for c in range(3))  # type: ignore[return-value]


def host_wait_gaps(g: GpuRows) -> F64:
    """The GPU-wide idle gaps that ended when the host launched the next event."""
    if g.starts.size == 0:
        return np.zeros(0)
    gaps, category = idle_gaps(
        g.starts, g.ends, g.launch_ts, float(g.starts.min()), float(g.ends.max())
    )
    return gaps[category == 0]


def stream_idle(g: GpuRows) -> tuple[StreamIdle, ...]:
    """Per (device, stream): gaps between consecutive kernels/memcpy/memset, classified
    exactly as HTA's ``get_idle_time_breakdown`` does (``host_wait`` when the next event was
    launched after the previous one ended, else ``kernel_wait`` under 30 us, else other)."""
    work = np.isin(g.kind, np.array([Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET], np.int8))
    out: list[StreamIdle] = []
    pairs = sorted(set(zip(g.device[work].tolist(), g.stream[work].tolist(), strict=True)))
    for device, stream in pairs:
        sel = work & (g.device == device) & (g.stream == stream)
        s, e, launch = g.starts[sel], g.ends[sel], g.launch_ts[sel]
        order = np.argsort(s, kind="stable")
        s, e, launch = s[order], e[order], launch[order]
        if s.size < 2:
            out.append(StreamIdle(int(device), int(stream), 0.0, 0.0, 0.0))
            continue
        prev_end = e[:-1]
        gap = s[1:] - prev_end
        host = launch[1:] > prev_end
        kernel = ~host & (gap < KERNEL_WAIT_US)
        other = ~host & ~kernel
        out.append(
            StreamIdle(
                int(device),
                int(stream),
                float(gap[host].sum()),
                float(gap[kernel].sum()),
                float(gap[other].sum()),
            )
        )
    return tuple(out)


def overlap_by_category_set(g: GpuRows) -> dict[str, float]:
    """Time by the exact set of categories running ("compute+communication": both, only).

    Holistic Trace Analysis' kernel-type breakdown reports the same quantity as "COMPUTATION
    overlapping COMMUNICATION" and so on.
    """
    # Sync events are left out, as HTA's breakdown leaves them out: they are not kernels.
    keep = g.category != CATEGORIES.index(SYNC)
    by_set = time_by_category_set(g.starts[keep], g.ends[keep], g.category[keep], len(CATEGORIES))
    out: dict[str, float] = {}
    for mask, value in enumerate(by_set.tolist()):
        if mask == 0 or value <= 0:
            continue
        label = "+".join(c for i, c in enumerate(CATEGORIES) if mask & (1 << i))
        out[label] = value
    return out


def comm_compute_overlap(g: GpuRows) -> float | None:
    """Share of communication-kernel time that ran while a compute kernel ran too."""
    by_set = time_by_category_set(g.starts, g.ends, g.category, len(CATEGORIES))
    masks = np.arange(by_set.size)
    c_bit, m_bit = 1 << CATEGORIES.index(COMPUTE), 1 << CATEGORIES.index(COMMUNICATION)
    comm = float(by_set[(masks & m_bit) > 0].sum())
    if comm <= 0:
        return None
    both = float(by_set[((masks & m_bit) > 0) & ((masks & c_bit) > 0)].sum())
    return both / comm


def union_us(g: GpuRows, category: str) -> float:
    sel = g.category == CATEGORIES.index(category)
    ms, me = merge(g.starts[sel], g.ends[sel])
    return float(np.sum(me - ms))
