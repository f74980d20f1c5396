"""CPU operators by time: count, total (inclusive) and self time."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gpudiag.analysis.trace.model import Bool, Events, Kind, dense_codes, fields_json
from gpudiag.analysis.trace.nesting import Nesting


@dataclass(frozen=True)
class CpuOpStats:
    """One operator name on the host (times in microseconds)."""

    name: str
    count: int
    total_us: float  # inclusive of the operators it called
    self_us: float  # without the operators it called
    mean_us: float

    def to_dict(self) -> dict[str, Any]:
        return fields_json(self)


def cpu_ops(events: Events, nesting: Nesting, host: Bool) -> tuple[CpuOpStats, ...]:
    """All operators in the window, by total time."""
    rows = np.flatnonzero(host & (events.kind == Kind.CPU_OP))
    if rows.size == 0:
        return ()
    uniq, inv = dense_codes(events.name[rows])
    count = np.bincount(inv)
    total = np.bincount(inv, weights=events.dur[rows])
    self_us = np.bincount(inv, weights=np.nan_to_num(nesting.self_us[rows]))
    ops = [
        CpuOpStats(
            name=events.names[int(n)],
            count=int(c),
            total_us=float(t),
            self_us=float(s),
            mean_us=float(t / c),
        )
        for n, c, t, s in zip(
            uniq.tolist(), count.tolist(), total.tolist(), self_us.tolist(), strict=True
        )
    ]
    ops.sort(key=lambda o: -o.total_us)
    return tuple(ops)
