"""Per-step view: each ProfilerStep's GPU breakdown and its time waiting on the DataLoader."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gpudiag.analysis.trace.breakdown import GpuRows, TimeBreakdown, temporal
from gpudiag.analysis.trace.intervals import clip, merge
from gpudiag.analysis.trace.model import DATALOADER_PREFIX, Events, Kind, fields_json
from gpudiag.analysis.trace.window import Step


@dataclass(frozen=True)
class StepReport:
    """One ``ProfilerStep#N``: its wall time on the host and what the GPU did meanwhile.

    The GPU breakdown covers the step's host time range (``[start, start + duration)``),
    whatever launched the work; ``dataloader_us`` is the time the step spent inside the
    DataLoader's ``__next__`` (None when the trace has no DataLoader events).
    """

    number: int
    start_us: float
    duration_us: float
    gpu: TimeBreakdown | None
    dataloader_us: float | None
    in_window: bool

    @property
    def dataloader_share(self) -> float | None:
        if self.dataloader_us is None or self.duration_us <= 0:
            return None
        return self.dataloader_us / self.duration_us

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = fields_json(self)
        out["dataloader_share"] = self.dataloader_share
        return out


def _dataloader_intervals(events: Events) -> tuple[np.ndarray, np.ndarray] | None:
    ids = [i for i, n in enumerate(events.names) if n.startswith(DATALOADER_PREFIX)]
    if not ids:
        return None
    host_kinds = np.array([Kind.CPU_OP, Kind.ANNOTATION, Kind.OTHER], np.int8)
    rows = np.flatnonzero(events.name_in(ids) & events.kind_in(host_kinds))
    if rows.size == 0:
        return None
    return merge(events.ts[rows], events.ts[rows] + events.dur[rows])


def step_reports(
    events: Events,
    steps: tuple[Step, ...],
    g_all: GpuRows | None,
    window_steps: int,
) -> tuple[StepReport, ...]:
    """``window_steps``: how many of the first steps belong to the analysis window."""
    loader = _dataloader_intervals(events)
    out = []
    for i, s in enumerate(steps):
        gpu = temporal(g_all, s.start_us, s.end_us) if g_all is not None else None
        loader_us = None
        if loader is not None:
            cs, ce = clip(loader[0], loader[1], s.start_us, s.end_us)
            loader_us = float(np.sum(ce - cs))
        out.append(
            StepReport(s.number, s.start_us, s.duration_us, gpu, loader_us, i < window_steps)
        )
    return tuple(out)


def dataloader_share(steps: tuple[StepReport, ...]) -> float | None:
    """Share of the analysed steps' time spent waiting on the DataLoader.

    None when the trace cannot tell: no ProfilerStep ranges, or no DataLoader events (a loop
    that does not iterate a ``torch.utils.data.DataLoader`` records none).
    """
    used = [s for s in steps if s.in_window and s.dataloader_us is not None]
    total = sum(s.duration_us for s in used)
    if not used or total <= 0:
        return None
    return sum(s.dataloader_us or 0.0 for s in used) / total
