"""The memory timeline figure: a long step keeps its shape and its peak in a few points."""

from __future__ import annotations

import math

from gpudiag.plots.memory import MAX_TIMELINE_POINTS, plotted_rows, timeline_figure
from gpudiag.profiling.memory import CATEGORIES, MemoryTimeline


def _timeline(n: int) -> MemoryTimeline:
    # Activations rise and fall twice over the step, with one sharp spike (the peak).
    rows = []
    for i in range(n):
        activations = int(1e6 * (1 + math.sin(4 * math.pi * i / n))) + (
            5_000_000 if i == n // 3 else 0
        )
        rows.append(tuple(activations if c == "activations" else 1_000 for c in CATEGORIES))
    return MemoryTimeline(tuple(float(i) for i in range(n)), tuple(rows))


def test_a_short_timeline_is_drawn_whole() -> None:
    assert plotted_rows([3, 1, 2]) == [0, 1, 2]


def test_a_long_timeline_is_thinned_but_keeps_its_peak_and_swings() -> None:
    timeline = _timeline(20_000)
    keep = plotted_rows(timeline.totals)
    assert len(keep) <= MAX_TIMELINE_POINTS + 1
    assert timeline.peak_index in keep
    kept = [timeline.totals[i] for i in keep]
    assert max(kept) == timeline.peak_bytes
    assert min(kept) == min(timeline.totals)
    fig = timeline_figure(timeline)
    (trace,) = [t for t in fig.data if t.name == "activations"]
    assert len(trace.x) == len(keep)
    assert max(trace.y) * 2**20 == max(r[CATEGORIES.index("activations")] for r in timeline.rows)
