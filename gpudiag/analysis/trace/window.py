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

    With two or more steps, the last step is left out unless asked for: the profiler can stop
    while that step's kernels are still in flight, so its GPU side may be cut short. Holistic
    Trace Analysis makes the same choice (``include_last_profiler_step=False``), which is what
    lets the two tools' numbers be compared. GPU events belong to the window when the runtime
    call that launched them does.
    """

    host: Bool
    gpu: Bool
    description: str
    excluded_last_step: bool


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
    return np.isin(events.kind, np.array([int(k) for k in GPU_KINDS], np.int8))


def analysis_window(
    events: Events, steps: tuple[Step, ...], *, include_last_step: bool = False
) -> Window:
    on_gpu = gpu_mask(events)
    host = ~on_gpu & (events.kind != Kind.GPU_ANNOTATION)
    if len(steps) < 2:
        what = "the whole trace" + (" (one profiler step)" if steps else " (no profiler steps)")
        return Window(host, on_gpu, what, excluded_last_step=False)
    last = steps[-1]
    if include_last_step:
        limit = max(s.end_us for s in steps)
        in_host = host & (events.ts <= limit)
        what = f"ProfilerStep#{steps[0].number}-#{last.number} ({len(steps)} steps)"
    else:
        in_host = host & (events.ts < last.start_us)
        what = (
            f"ProfilerStep#{steps[0].number}-#{steps[-2].number} ({len(steps) - 1} of "
            f"{len(steps)} steps; the last step is left out, as HTA does, because the "
            "profiler may stop before its GPU work is recorded)"
        )
    launched = np.sort(events.correlation[in_host & (events.correlation >= 0)])
    in_gpu = np.zeros_like(on_gpu)
    gpu_rows = np.flatnonzero(on_gpu)
    if launched.size and gpu_rows.size:
        corr = events.correlation[gpu_rows]
        pos = np.clip(np.searchsorted(launched, corr), 0, launched.size - 1)
        in_gpu[gpu_rows] = launched[pos] == corr
    return Window(in_host, in_gpu, what, excluded_last_step=not include_last_step)


def step_of(steps: tuple[Step, ...], ts: I64 | np.ndarray) -> np.ndarray:
    """Index into ``steps`` of the step whose host range holds each timestamp (-1: none)."""
    if not steps:
        return np.full(np.shape(ts), -1, dtype=np.int64)
    starts = np.array([s.start_us for s in steps])
    ends = np.array([s.end_us for s in steps])
    idx = np.searchsorted(starts, ts, side="right") - 1
    ok = (idx >= 0) & (ts < ends[np.clip(idx, 0, None)])
    return np.where(ok, idx, -1)
