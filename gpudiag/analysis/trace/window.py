"""Which events an analysis covers: the profiler steps, and the window HTA also analyses."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from gpudiag.analysis.trace.model import GPU_KINDS, I64, Bool, Events, Kind

_STEP_NUMBER = re.compile(r"ProfilerStep\s*#\s*(\d+)")


@dataclass(frozen=True)
class Step:
    """One ``ProfilerStep#N`` range on the host (what ``prof.step()`` marks)."""

    number: int
    start_us: float
    duration_us: float
    row: int

    @property
    def end_us(self) -> float:
        return self.start_us + self.duration_us


@dataclass(frozen=True, eq=False)
class Window:
    """The events the aggregate analyses cover.

    With ProfilerStep ranges, the window is the steps: host events from the first step's start
    and the GPU work they launched (tied by correlation id), so work queued before the first
    step (a warm-up's tail, the previous iteration) is left out even when it runs inside the
    step's time; this is the GPU-side ProfilerStep annotation Kineto records (and TraceLens
    analyses), rebuilt from the launches because some traces' annotations are cut short.
    With two or more steps, the last step is left out unless asked for: the profiler can stop
    while that step's kernels are still in flight, so its GPU side may be cut short. Holistic
    Trace Analysis makes the same choice (``include_last_profiler_step=False``), which is what
    lets the two tools' numbers be compared. Without steps, the whole capture.
    """

    host: Bool
    gpu: Bool
    description: str
    excluded_last_step: bool
    # GPU events queued before the first step (left out of the window).
    queued_before: int = 0


def find_steps(events: Events) -> tuple[Step, ...]:
    rows = np.flatnonzero(events.kind == Kind.STEP)
    steps: list[Step] = []
    seen: set[int] = set()
    for row in rows.tolist():
        m = _STEP_NUMBER.match(events.names[events.name[row]])
        if m is None:
            continue
        number = int(m.group(1))
        if number in seen:  # the same step seen on a second thread: keep the first
            continue
        seen.add(number)
        steps.append(Step(number, float(events.ts[row]), float(events.dur[row]), int(row)))
    steps.sort(key=lambda s: s.start_us)
    return tuple(steps)


def gpu_mask(events: Events) -> Bool:
    return events.kind_in(GPU_KINDS)


def analysis_window(
    events: Events, steps: tuple[Step, ...], *, include_last_step: bool = False
) -> Window:
    on_gpu = gpu_mask(events)
    host = ~on_gpu & (events.kind != Kind.GPU_ANNOTATION)
    if not steps:
        return Window(host, on_gpu, "the whole capture (no ProfilerStep ranges)", False)
    first, last = steps[0], steps[-1]
    excluded = len(steps) >= 2 and not include_last_step
    if len(steps) == 1:
        lo, hi = first.start_us, first.end_us
        what = f"ProfilerStep#{first.number} (the trace's one step)"
    elif include_last_step:
        lo, hi = first.start_us, max(s.end_us for s in steps)
        what = f"ProfilerStep#{first.number}-#{last.number} ({len(steps)} steps)"
    else:
        lo, hi = first.start_us, last.start_us
        what = (
            f"ProfilerStep#{first.number}-#{steps[-2].number} ({len(steps) - 1} of "
            f"{len(steps)} steps; the last step is left out, as HTA does, because the "
            "profiler may stop before its GPU work is recorded)"
        )
    ts = events.ts
    in_host = host & (ts >= lo) & ((ts < hi) if excluded else (ts <= hi))
    gpu_rows = np.flatnonzero(on_gpu)
    linked = np.sort(events.correlation[host & (events.correlation >= 0)])
    in_gpu = np.zeros_like(on_gpu)
    if not linked.size or not gpu_rows.size:
        # Launches are not recorded (no runtime events or correlation ids): the GPU work
        # that starts inside the steps' time stands in for the work they launched.
        in_gpu[gpu_rows] = (ts[gpu_rows] >= lo) & (ts[gpu_rows] < hi)
        what += "; GPU work by its start time (the trace does not tie kernels to launches)"
        return Window(in_host, in_gpu, what, excluded)
    launched = np.sort(events.correlation[in_host & (events.correlation >= 0)])
    corr = events.correlation[gpu_rows]
    if launched.size:
        pos = np.clip(np.searchsorted(launched, corr), 0, launched.size - 1)
        in_gpu[gpu_rows] = launched[pos] == corr
    # GPU work queued before the first step (its launch is earlier, or was not recorded:
    # the profiler started after it) runs at the start of the capture and is left out.
    out = gpu_rows[~in_gpu[gpu_rows]]
    before = 0
    if out.size:
        host_corr = host & (events.correlation >= 0)
        corr_rows = np.flatnonzero(host_corr)
        order = np.argsort(events.correlation[corr_rows], kind="stable")
        keys, rows_sorted = events.correlation[corr_rows][order], corr_rows[order]
        pos = np.clip(np.searchsorted(keys, events.correlation[out]), 0, max(keys.size - 1, 0))
        found = keys.size > 0
        tied = (keys[pos] == events.correlation[out]) if found else np.zeros(out.size, bool)
        launch_ts = np.where(tied, ts[rows_sorted[pos]] if found else 0.0, -np.inf)
        before = int(np.count_nonzero(launch_ts < lo))
    if before:
        chosen = int(np.count_nonzero(in_gpu[gpu_rows]))
        what += (
            f"; {before:,} GPU events queued before the first step (launched earlier, or "
            f"before the profiler started) are left out, {chosen:,} remain"
        )
    return Window(in_host, in_gpu, what, excluded, before)


def step_of(steps: tuple[Step, ...], ts: I64 | np.ndarray) -> np.ndarray:
    """Index into ``steps`` of the step whose host range holds each timestamp (-1: none)."""
    if not steps:
        return np.full(np.shape(ts), -1, dtype=np.int64)
    starts = np.array([s.start_us for s in steps])
    ends = np.array([s.end_us for s in steps])
    idx = np.searchsorted(starts, ts, side="right") - 1
    ok = (idx >= 0) & (ts < ends[np.clip(idx, 0, None)])
    return np.where(ok, idx, -1)
