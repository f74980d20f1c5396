"""Memory copies and sets on the GPU: direction, bytes, achieved bandwidth, pinned or not."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpudiag.analysis.trace.model import I64, DeviceProperties, Events, Kind, fields_json

_MEMCPY = re.compile(r"Memcpy\s+(\w+)(?:\s*\((\w+)\s*->\s*(\w+)\))?")

# Per-direction peak of a x16 PCIe link, in GB/s (PCI-SIG: 8, 16, 32, 64 GT/s per lane with
# 128b/130b encoding for gen 3 onwards).
PCIE_X16_GBPS: dict[int, float] = {3: 15.75, 4: 31.5, 5: 63.0, 6: 121.0}


@dataclass(frozen=True)
class TransferStats:
    """Copies (or sets) of one kind: ``HtoD`` from ``Pageable`` to ``Device``, and so on."""

    direction: str  # HtoD, DtoH, DtoD, PtoP, HtoH, or "Memset"
    source: str | None  # Pageable, Pinned, Device, Managed (as the trace names them)
    destination: str | None
    count: int
    total_bytes: int
    total_us: float
    achieved_gbps: float | None  # bytes / busy time
    peak_gbps: float | None  # the link's or the memory's peak, None when not known
    peak_source: str | None = None

    @property
    def pageable(self) -> bool:
        return "Pageable" in (self.source, self.destination)

    @property
    def fraction_of_peak(self) -> float | None:
        if self.achieved_gbps is None or not self.peak_gbps:
            return None
        return self.achieved_gbps / self.peak_gbps

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = fields_json(self)
        out["pageable"] = self.pageable
        out["fraction_of_peak"] = self.fraction_of_peak
        return out


def _peaks(devices: Sequence[DeviceProperties]) -> tuple[float | None, float | None, str | None]:
    """(device memory GB/s, PCIe x16 GB/s, where they came from) for the first GPU."""
    if not devices:
        return None, None, None
    spec = devices[0].spec()
    if spec is None:
        return None, None, None
    pcie = PCIE_X16_GBPS.get(spec.pcie_gen) if spec.pcie_gen else None
    return spec.memory_bandwidth_gbps, pcie, f"gpudiag.specs: {spec.name}"


def _group_key(events: Events, code: int) -> tuple[str, str | None, str | None]:
    """(direction, source, destination) of a memcpy / memset by its name and kind code."""
    if code % 256 == Kind.MEMSET:
        return ("Memset", None, None)
    m = _MEMCPY.match(events.names[code // 256])
    return (m.group(1), m.group(2), m.group(3)) if m else ("unknown", None, None)


def transfers(
    events: Events, rows: I64, devices: Sequence[DeviceProperties]
) -> tuple[TransferStats, ...]:
    """One ``TransferStats`` per (direction, source, destination) among the given GPU rows."""
    sel = rows[np.isin(events.kind[rows], np.array([Kind.MEMCPY, Kind.MEMSET], np.int8))]
    if sel.size == 0:
        return ()
    mem_peak, pcie_peak, source = _peaks(devices)
    # One group per (direction, source, destination), in the order the rows first show it.
    code = events.name[sel].astype(np.int64) * 256 + events.kind[sel]
    uniq, first, inv = np.unique(code, return_index=True, return_inverse=True)
    numbers: dict[tuple[str, str | None, str | None], int] = {}
    group_of = np.empty(uniq.size, dtype=np.int64)
    for i in np.argsort(first, kind="stable").tolist():
        group_of[i] = numbers.setdefault(_group_key(events, int(uniq[i])), len(numbers))
    group = group_of[inv.reshape(-1)]
    x = events.extra[sel]
    row_bytes = np.zeros(sel.size, dtype=np.int64)  # 0 where not recorded
    has = x >= 0
    row_bytes[has] = np.maximum(events.launches.nbytes[x[has]], 0)
    counts = np.bincount(group, minlength=len(numbers))
    total_bytes = np.zeros(len(numbers), dtype=np.int64)
    np.add.at(total_bytes, group, row_bytes)
    # Durations added in row order, as a running sum per group would.
    group_us = np.bincount(group, weights=events.dur[sel], minlength=len(numbers))
    groups = {
        key: (int(counts[g]), int(total_bytes[g]), float(group_us[g])) for key, g in numbers.items()
    }
    out = []
    for (direction, src, dst), (count, nbytes, total_us) in groups.items():
        achieved = nbytes / total_us / 1e3 if total_us > 0 and nbytes > 0 else None
        peak = None
        if direction in ("HtoD", "DtoH"):
            peak = pcie_peak
        elif direction in ("DtoD", "Memset"):
            peak = mem_peak
        out.append(
            TransferStats(
                direction=direction,
                source=src,
                destination=dst,
                count=int(count),
                total_bytes=int(nbytes),
                total_us=float(total_us),
                achieved_gbps=achieved,
                peak_gbps=peak,
                peak_source=source if peak is not None else None,
            )
        )
    out.sort(key=lambda t: -t.total_us)
    return tuple(out)
