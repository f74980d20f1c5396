"""Fakes for monitor tests: a scripted feed and a scripted GPU backend."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from gpudiag.monitoring.feeds import Frame
from gpudiag.monitoring.metrics import DeviceSpec, SeriesKey
from gpudiag.probe.model import DriverInfo, GpuInfo, GpuState
from gpudiag.probe.readings import Reading, Status, ok


class ScriptedFeed:
    """A feed with one device and two series (a counter and a throttle flag).

    ``values(n)`` gives the row of the n-th read (1-based); ``fail_at`` makes that read raise.
    """

    label = "scripted"
    is_recording = False
    notes: tuple[str, ...] = ()

    def __init__(
        self,
        clock: Callable[[], float],
        *,
        values: Callable[[int], Sequence[float]] | None = None,
        fail_at: int | None = None,
        na: Callable[[int], dict[int, tuple[Status, str]]] | None = None,
        events: Callable[[int], dict[str, tuple[str, ...]]] | None = None,
        finish_at: int | None = None,
        width: int = 2,
    ) -> None:
        self._clock = clock
        self._values = values or (lambda n: [float(n)] + [0.0] * (width - 1))
        self._fail_at = fail_at
        self._na = na or (lambda n: {})
        self._events = events or (lambda n: {})
        self._finish_at = finish_at
        self.devices = (DeviceSpec("gpu0", "GPU 0 · fake"),)
        metrics = ["gpu_util_pct", "throttled", "power_w", "temperature_c"][:width]
        self.series = tuple(SeriesKey("gpu0", m) for m in metrics)
        self.reads = 0
        self.closed = 0

    def read(self) -> Frame:
        self.reads += 1
        n = self.reads
        if self._fail_at is not None and n >= self._fail_at:
            raise RuntimeError(f"sensor exploded at read {n}")
        return Frame(
            timestamp=self._clock(),
            values=np.asarray(self._values(n), dtype=np.float64),
            na=self._na(n),
            events=self._events(n),
            finished=self._finish_at is not None and n >= self._finish_at,
        )

    def close(self) -> None:
        self.closed += 1


@dataclass
class ScriptedBackend:
    """A probe Backend whose ``sample()`` plays ``states`` (one tuple per call, last repeats)."""

    infos: tuple[GpuInfo, ...]
    states: list[tuple[GpuState, ...]]
    label: str = "scripted backend"
    is_recording: bool = False
    calls: int = 0
    closed: int = 0
    hosts: tuple[str, ...] = field(default_factory=tuple)

    def gpu_count(self) -> Reading[int]:
        return ok(len(self.infos))

    def driver(self) -> DriverInfo:
        return DriverInfo()

    def gpu_infos(self) -> tuple[GpuInfo, ...]:
        return self.infos

    def sample(self) -> tuple[GpuState, ...]:
        state = self.states[min(self.calls, len(self.states) - 1)]
        self.calls += 1
        return state

    def close(self) -> None:
        self.closed += 1


def a100_info(index: int = 0, uuid: str = "GPU-aaaaaaaa-0000-1111-2222-333333333333") -> GpuInfo:
    """Facts of an A100-SXM4-80GB as NVML reports them (bus width and clocks from NVML)."""
    return GpuInfo(
        index=index,
        name=ok("Imaginary A100-like board"),  # not in the spec table: peak from NVML facts
        uuid=ok(uuid),
        memory_total_bytes=ok(80 * (1 << 30)),
        memory_bus_width_bits=ok(5120),
        max_memory_clock_mhz=ok(1593),
        power_limit_w=ok(400.0),
    )
